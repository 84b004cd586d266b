"""The webhooks' admin pages: endpoints with their health, messages with their attempts (the
request's signature, never a secret), enable, disable and replay as actions behind their
permissions, edits checked as the code checks them."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from feishu_inbox import webhooks
from feishu_inbox.models import EventJob
from feishu_inbox.tables.webhooks import WebhookAttempt, WebhookEndpoint, WebhookMessage
from feishu_inbox.webhooks import signing

pytestmark = pytest.mark.django_db

ENDPOINTS = "admin:feishu_inbox_webhookendpoint_changelist"
MESSAGES = "admin:feishu_inbox_webhookmessage_changelist"


def staff(*codenames: str) -> Client:
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="feishu_inbox", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def sent() -> dict[str, Any]:
    """An endpoint with a rotated secret, a message, and a rejected attempt of it."""
    new = webhooks.add_endpoint("https://hooks.example.com/in", description="crm")
    rotated = webhooks.rotate_secret(new.uid)
    done = webhooks.publish("order.paid", {"id": 1}, key="k")
    EventJob.objects.filter(app="webhooks").update(status="completed", finished_at=timezone.now())
    message = WebhookMessage.objects.get(uid=done.message_id)
    headers = signing.headers(message.uid, 1, message.body.encode(), [rotated.secret, new.secret])
    WebhookAttempt.objects.create(
        message=message,
        endpoint=new.endpoint,
        outcome="rejected",
        status_code=400,
        response="missing field: amount",
        latency_ms=12.5,
        request_headers=headers,
        at=timezone.now(),
    )
    return {"uid": new.uid, "secrets": [new.secret, rotated.secret], "message": message}


def test_the_pages_show_health_attempts_and_signatures_never_a_secret(
    sent: dict[str, Any],
) -> None:
    client = staff("view_webhookendpoint", "view_webhookmessage")
    listed = client.get(reverse(ENDPOINTS)).content.decode()
    assert sent["uid"] in listed and "failing" not in listed and "new" in listed
    row = WebhookEndpoint.objects.get(uid=sent["uid"])
    page = client.get(
        reverse("admin:feishu_inbox_webhookendpoint_change", args=[row.pk])
    ).content.decode()
    assert "missing field: amount" in page and "rejected" in page
    assert "the old secret also signs until" in page
    message = client.get(
        reverse("admin:feishu_inbox_webhookmessage_change", args=[sent["message"].pk])
    ).content.decode()
    assert "webhook-signature" in message and "v1," in message and "400" in message
    assert "12.5" in message and "missing field: amount" in message
    for text in (listed, page, message, client.get(reverse(MESSAGES)).content.decode()):
        for secret in sent["secrets"]:
            assert secret not in text and secret.removeprefix("whsec_") not in text


def test_endpoints_are_not_added_or_deleted_in_the_admin(sent: dict[str, Any]) -> None:
    client = staff("add_webhookendpoint", "delete_webhookendpoint", "view_webhookendpoint")
    assert client.get(reverse("admin:feishu_inbox_webhookendpoint_add")).status_code == 403


def test_an_edit_is_checked_as_the_code_checks_it(sent: dict[str, Any]) -> None:
    client = staff("change_webhookendpoint", "view_webhookendpoint")
    row = WebhookEndpoint.objects.get(uid=sent["uid"])
    url = reverse("admin:feishu_inbox_webhookendpoint_change", args=[row.pk])
    form = {"url": "http://10.0.0.5/in", "description": "crm", "event_types": "[]"}
    refused = client.post(url, form)
    assert refused.status_code == 200 and "webhook_endpoint_invalid" in refused.content.decode()
    ok = client.post(url, {**form, "url": "https://other.example.com/", "rate_limit": "3"})
    assert ok.status_code == 302
    row.refresh_from_db()
    assert (row.url, row.rate_limit) == ("https://other.example.com/", 3.0)


def test_disable_and_enable_are_actions_recorded_in_the_history(sent: dict[str, Any]) -> None:
    client = staff("change_webhookendpoint", "view_webhookendpoint")
    row = WebhookEndpoint.objects.get(uid=sent["uid"])
    client.post(reverse(ENDPOINTS), {"action": "disable_selected", "_selected_action": [row.pk]})
    row.refresh_from_db()
    assert not row.enabled and row.disabled_reason == "disabled by ops"
    client.post(reverse(ENDPOINTS), {"action": "enable_selected", "_selected_action": [row.pk]})
    row.refresh_from_db()
    assert row.enabled
    assert [e.change_message for e in LogEntry.objects.order_by("id")] == ["Disabled", "Enabled"]


def test_replay_needs_its_permission(sent: dict[str, Any]) -> None:
    message = sent["message"]
    form = {"action": "replay_selected", "_selected_action": [message.pk]}
    without = staff("view_webhookmessage")
    without.post(reverse(MESSAGES), form)
    assert EventJob.objects.filter(app="webhooks").count() == 1
    User.objects.all().delete()
    client = staff("view_webhookmessage", "replay_webhook", "view_webhookendpoint")
    client.post(reverse(MESSAGES), form)
    replays = EventJob.objects.filter(app="webhooks", event_id__contains=":replay-")
    assert replays.count() == 1 and replays.get().payload["message"] == message.uid
    EventJob.objects.update(status="completed", finished_at=timezone.now())
    row = WebhookEndpoint.objects.get(uid=sent["uid"])
    client.post(reverse(ENDPOINTS), {"action": "replay_last_day", "_selected_action": [row.pk]})
    assert EventJob.objects.filter(app="webhooks", event_id__contains=":replay-").count() == 2
