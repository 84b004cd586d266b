"""Outbound webhooks in one process (SPEC §9h): endpoints and their refusals, publish in the
caller's transaction, signatures as the ``standardwebhooks`` package verifies them, rotation,
the retry schedule, replays, the CLI, and the bounds of one request against real receiver
processes that sleep, redirect or send 1 GiB."""

from __future__ import annotations

import inspect
import io
import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from feishu_inbox import webhooks
from feishu_inbox.errors import CATALOGUE
from feishu_inbox.ledger import pauses
from feishu_inbox.models import EventJob, PauseKind
from feishu_inbox.tables.webhooks import WebhookAttempt, WebhookEndpoint, WebhookMessage
from feishu_inbox.webhooks import delivery, endpoints, refusals, sending, signing

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = {"FEISHU_INBOX": {"WEBHOOK_ALLOW_PRIVATE": True}}


# --- endpoints and their refusals -----------------------------------------------------------


def test_an_endpoint_gets_a_whsec_secret_readable_once() -> None:
    new = webhooks.add_endpoint("https://hooks.example.com/in", event_types=["order.paid"])
    assert new.secret.startswith("whsec_") and new.uid.startswith("ep_")
    Webhook(new.secret)  # the package reads it: base64 of the key after the prefix
    row = WebhookEndpoint.objects.get(uid=new.uid)
    assert row.enabled and row.event_types == ["order.paid"] and row.health == "new"
    out = io.StringIO()
    call_command("inbox", "webhooks", "list", "--json", stdout=out)
    assert new.secret not in out.getvalue() and new.uid in out.getvalue()
    other = webhooks.add_endpoint("https://hooks.example.com/2")
    assert other.secret != new.secret


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://hooks.example.com/", "http or https"),
        ("https://user:pw@hooks.example.com/", "credentials"),
        ("http://127.0.0.1:8000/", "private"),
        ("http://10.1.2.3/", "private"),
        ("http://[::1]/", "private"),
        ("http://169.254.169.254/latest/meta-data", "private"),
        ("http://localhost/", "private"),
        ("https:///nohost", "no host"),
        ("https://hooks.example.com/#frag", "fragment"),
        ("", "1 to"),
    ],
)
def test_a_bad_url_is_refused_with_its_code_and_nothing_is_stored(url: str, words: str) -> None:
    with pytest.raises(webhooks.WebhookEndpointInvalid) as refused:
        webhooks.add_endpoint(url)
    assert refused.value.code == "webhook_endpoint_invalid"
    assert words in refused.value.message and refused.value.fix
    assert not WebhookEndpoint.objects.exists()


def test_private_addresses_are_allowed_when_the_site_says_so() -> None:
    with override_settings(**LOOPBACK):
        assert webhooks.add_endpoint("http://127.0.0.1:9/x").endpoint.url == "http://127.0.0.1:9/x"


def test_a_name_that_resolves_to_a_private_address_is_refused_when_sent_to() -> None:
    sent = sending.post("http://localhost:9/x", b"{}", {}, timeout=2, allow_private=False)
    assert sent.status is None and "private address" in sent.error


def test_event_types_and_rate_limits_are_checked() -> None:
    with pytest.raises(webhooks.WebhookEndpointInvalid, match="rate_limit"):
        webhooks.add_endpoint("https://h.example.com/", rate_limit=0)
    with pytest.raises(webhooks.WebhookEndpointInvalid, match="event_types"):
        webhooks.add_endpoint("https://h.example.com/", event_types="order.paid")  # type: ignore[arg-type]
    with override_settings(FEISHU_INBOX={"WEBHOOK_EVENT_TYPES": ["order.paid"]}):
        with pytest.raises(webhooks.WebhookEventUnknown) as refused:
            webhooks.add_endpoint("https://h.example.com/", event_types=["order.payed"])
        assert refused.value.code == "webhook_event_unknown"
        with pytest.raises(webhooks.WebhookEventUnknown):
            webhooks.publish("order.payed", {})
    with pytest.raises(webhooks.WebhookEndpointUnknown) as unknown:
        webhooks.enable("ep_nope")
    assert unknown.value.code == "webhook_endpoint_unknown"


def test_every_refusal_and_delivery_code_is_catalogued_and_in_the_manual() -> None:
    manual = (ROOT / "docs" / "operating.md").read_text()
    codes = {cls.code for cls in refusals.REFUSALS} | {
        "webhook_delivery_failed",
        "webhook_delivery_throttled",
    }
    assert len(codes) == 8
    for code in codes:
        meaning, fix = CATALOGUE[code]
        assert meaning.endswith(".") and fix, code
        assert f"`{code}`" in manual, code
    assert {c for _, c in inspect.getmembers(refusals, inspect.isclass)} >= set(refusals.REFUSALS)


# --- publish ----------------------------------------------------------------------------------


def test_publish_makes_one_delivery_per_subscribed_endpoint_in_its_keys_partition() -> None:
    paid = webhooks.add_endpoint("https://a.example.com/", event_types=["order.paid"]).uid
    every = webhooks.add_endpoint("https://b.example.com/").uid
    webhooks.add_endpoint("https://c.example.com/", event_types=["user.created"])
    done = webhooks.publish("order.paid", {"id": 7}, key="order:7")
    assert set(done.endpoints) == {paid, every}
    jobs = EventJob.objects.filter(app="webhooks").order_by("id")
    assert [(j.event_type, j.partition_key, j.event_id) for j in jobs] == [
        (f"webhook:{ep}", f"webhook:{ep}:order:7", f"{done.message_id}:{ep}")
        for ep in (paid, every)
    ]
    message = WebhookMessage.objects.get(uid=done.message_id)
    body = json.loads(message.body)
    assert body["type"] == "order.paid" and body["data"] == {"id": 7} and body["timestamp"]
    unkeyed = webhooks.publish("order.paid", [1, 2])
    assert EventJob.objects.get(event_id=f"{unkeyed.message_id}:{paid}").partition_key == (
        f"webhook:{paid}:~{unkeyed.message_id}"
    )


def test_publish_is_part_of_the_callers_transaction() -> None:
    webhooks.add_endpoint("https://a.example.com/")
    with pytest.raises(RuntimeError), transaction.atomic():
        webhooks.publish("order.paid", {"id": 1})
        raise RuntimeError("the caller rolls back")
    assert not WebhookMessage.objects.exists() and not EventJob.objects.exists()


@pytest.mark.parametrize(
    ("event_type", "payload", "key"),
    [
        ("order.paid", {"when": timezone.now()}, None),
        ("order.paid", {"x": float("nan")}, None),
        ("order.paid", {1, 2}, None),
        ("", {}, None),
        ("t" * 129, {}, None),
        ("order.paid", {}, "k" * 201),
    ],
)
def test_bad_events_are_refused_and_nothing_is_published(
    event_type: str, payload: Any, key: str | None
) -> None:
    webhooks.add_endpoint("https://a.example.com/")
    with pytest.raises(webhooks.WebhookEventInvalid) as refused:
        webhooks.publish(event_type, payload, key=key)
    assert refused.value.code == "webhook_event_invalid" and refused.value.fix
    assert not WebhookMessage.objects.exists() and not EventJob.objects.exists()


def test_a_disabled_endpoints_deliveries_are_held_and_enabling_releases_them() -> None:
    ep = webhooks.add_endpoint("https://a.example.com/").uid
    assert webhooks.disable(ep, detail="maintenance")
    assert not webhooks.disable(ep)  # already
    first = webhooks.publish("order.paid", {"n": 1}, key="k")
    job = EventJob.objects.get(event_id=f"{first.message_id}:{ep}")
    assert job.status == "queued" and job.available_at >= pauses.HELD_FROM
    assert WebhookEndpoint.objects.get(uid=ep).disabled_reason == "maintenance"
    assert webhooks.enable(ep) == 1
    job.refresh_from_db()
    assert job.available_at < pauses.HELD_FROM
    assert not pauses.listed()


def test_disabling_sends_the_signal_and_counts_it() -> None:
    seen: list[tuple[str, str]] = []

    def heard(sender: Any, endpoint: WebhookEndpoint, reason: str, **kw: Any) -> None:
        seen.append((endpoint.uid, reason))

    webhooks.endpoint_disabled.connect(heard)
    try:
        ep = webhooks.add_endpoint("https://a.example.com/").uid
        webhooks.disable(ep, reason="gone", detail="it answered 410 Gone")
    finally:
        webhooks.endpoint_disabled.disconnect(heard)
    assert seen == [(ep, "gone")]
    pause = pauses.listed()[0]
    assert (pause.kind, pause.value) == (PauseKind.EVENT_TYPE, f"webhook:{ep}")


# --- signatures and rotation ------------------------------------------------------------------


def test_signatures_verify_with_the_standardwebhooks_package() -> None:
    secret = signing.new_secret()
    body = b'{"type":"a","data":{"x":"\xc3\xa9"}}'
    headers = signing.headers("msg_1", int(time.time()), body, [secret])
    assert Webhook(secret).verify(body, headers) == json.loads(body)
    with pytest.raises(WebhookVerificationError):
        Webhook(signing.new_secret()).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body + b" ", headers)


def test_a_rotated_secret_signs_beside_the_new_one_until_its_grace_ends() -> None:
    new = webhooks.add_endpoint("https://a.example.com/")
    rotated = webhooks.rotate_secret(new.uid, grace=timedelta(hours=1))
    assert rotated.secret != new.secret
    row = WebhookEndpoint.objects.get(uid=new.uid)
    now = timezone.now()
    both = endpoints.signing_secrets(row, now)
    assert both == [rotated.secret, new.secret]
    body = b'{"a":1}'
    headers = signing.headers("msg_2", int(time.time()), body, both)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (new.secret, rotated.secret):  # a receiver holding either verifies
        Webhook(secret).verify(body, headers)
    assert endpoints.signing_secrets(row, now + timedelta(hours=2)) == [rotated.secret]


# --- the retry schedule and answers -----------------------------------------------------------


def test_the_retry_schedule_repeats_its_last_delay_and_honours_retry_after() -> None:
    schedule = (5, 300, 1800, 7200, 18000, 36000, 36000)
    assert [delivery.retry_delay(n, None, schedule) for n in (1, 2, 7, 8, 50)] == [
        5,
        300,
        36000,
        36000,
        36000,
    ]
    assert delivery.retry_delay(1, "120", schedule) == 120
    assert delivery.retry_delay(1, "999999999", schedule) == delivery.LONGEST_RETRY_AFTER
    later = (timezone.now() + timedelta(seconds=90)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    assert 80 <= delivery.retry_delay(1, later, schedule) <= 91
    assert delivery.retry_delay(2, "soon", schedule) == 300


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, "accepted"),
        (204, "accepted"),
        (410, "gone"),
        (400, "rejected"),
        (404, "rejected"),
        (408, "retried"),
        (409, "retried"),
        (425, "retried"),
        (429, "throttled"),
        (500, "retried"),
        (503, "retried"),
        (302, "retried"),
        (None, "failed"),
    ],
)
def test_each_answer_has_its_outcome(status: int | None, outcome: str) -> None:
    assert delivery.outcome_of(sending.Sent(status)) == outcome


# --- replays ----------------------------------------------------------------------------------


def test_a_replay_sends_the_same_message_again_unless_it_is_pending() -> None:
    ep = webhooks.add_endpoint("https://a.example.com/")
    done = webhooks.publish("order.paid", {"n": 1}, key="k")
    pending = webhooks.replay(done.message_id, ep.uid)
    assert pending.pending == [done.message_id] and not pending.jobs
    EventJob.objects.filter(app="webhooks").update(status="completed", finished_at=timezone.now())
    again = webhooks.replay(done.message_id, ep.uid)
    job = EventJob.objects.get(pk=again.jobs[done.message_id])
    assert job.partition_key == f"webhook:{ep.uid}:k" and job.payload["message"] == done.message_id
    webhooks.disable(ep.uid)
    with pytest.raises(webhooks.WebhookEndpointDisabled):
        webhooks.replay(done.message_id, ep.uid)


def test_a_window_replay_sends_what_the_endpoint_was_sent_in_publish_order() -> None:
    ep = webhooks.add_endpoint("https://a.example.com/")
    sent = [webhooks.publish("order.paid", {"n": n}, key="k") for n in range(3)]
    EventJob.objects.filter(app="webhooks").update(status="completed", finished_at=timezone.now())
    for message in WebhookMessage.objects.all():
        WebhookAttempt.objects.create(
            message=message,
            endpoint=ep.endpoint,
            outcome="rejected",
            latency_ms=1,
            at=timezone.now(),
        )
    out = io.StringIO()
    call_command("inbox", "webhooks", "replay", ep.uid, "--since", "1h", "--json", stdout=out)
    replayed = json.loads(out.getvalue())["replayed"]
    assert [r["message"] for r in replayed] == [m.message_id for m in sent]
    jobs = [r["job"] for r in replayed]
    assert sorted(jobs) == jobs  # enqueued in publish order


# --- the CLI ----------------------------------------------------------------------------------


def test_the_cli_adds_an_endpoint_printing_its_secret_once(settings: Any) -> None:
    out = io.StringIO()
    with override_settings(**LOOPBACK):
        call_command(
            "inbox", "webhooks", "add", "http://127.0.0.1:9/h", "--event-type", "a.b", stdout=out
        )
    secret = out.getvalue().split()[-1]
    assert secret.startswith("whsec_")
    ep = WebhookEndpoint.objects.get()
    assert ep.secret == secret and ep.event_types == ["a.b"]
    for action in (["list"], ["attempts", ep.uid], ["disable", ep.uid], ["enable", ep.uid]):
        shown = io.StringIO()
        call_command("inbox", "webhooks", *action, stdout=shown)
        assert secret not in shown.getvalue()
    rotated = io.StringIO()
    call_command("inbox", "webhooks", "rotate", ep.uid, "--grace-hours", "2", stdout=rotated)
    assert rotated.getvalue().split()[-1] == WebhookEndpoint.objects.get().secret != secret


# --- one request's bounds, against real receiver processes ------------------------------------


def test_a_request_is_bounded_by_its_timeout_and_its_read(
    receivers: Any, transactional_db: None
) -> None:
    """A receiver that sleeps past the timeout, one that trickles its answer, one that
    redirects and one that sends 1 GiB:
    the request ends by its timeout (2 s here; 6 s allowed for a busy machine) and reads at
    most 1 KiB of a body."""
    secret = signing.new_secret()
    slow = receivers("slow", secrets=[secret], mode="sleep", sleep=60).start()
    moved = receivers("moved", secrets=[secret], mode="redirect").start()
    huge = receivers("huge", secrets=[secret], mode="huge").start()
    trickle = receivers("trickle", secrets=[secret], mode="trickle").start()
    body = b'{"type":"t","data":{}}'
    headers = signing.headers("msg_b", int(time.time()), body, [secret])

    started = time.monotonic()
    sent = sending.post(slow.url, body, headers, timeout=2.0, allow_private=True)
    took = time.monotonic() - started
    assert sent.status is None and sent.timed_out and 1.9 <= took < 6, (sent, took)
    assert delivery.outcome_of(sent) == "timed_out"

    started = time.monotonic()  # a byte every 0.2 s: each read is quick, the whole is not
    sent = sending.post(trickle.url, body, headers, timeout=2.0, allow_private=True)
    took = time.monotonic() - started
    assert 1.9 <= took < 6, (sent, took)  # cut at the deadline: what came of the body is kept
    assert sent.status == 200 and 0 < len(sent.body) < 1024, sent

    sent = sending.post(moved.url, body, headers, timeout=2.0, allow_private=True)
    assert sent.status == 302 and delivery.outcome_of(sent) == "retried"
    assert len(moved.requests()) == 1  # the redirect was not followed

    started = time.monotonic()
    sent = sending.post(huge.url, body, headers, timeout=2.0, allow_private=True)
    assert sent.status == 200 and len(sent.body) == sending.READ_LIMIT
    assert time.monotonic() - started < 6
    from tests.support.processes import wait_for

    wait_for(lambda: any("huge_written" in x for x in huge.lines()), 30, "the huge answer to end")
    written = next(x["huge_written"] for x in huge.lines() if "huge_written" in x)
    assert written < 64 * 1024 * 1024, written  # it stopped at the socket buffers, not 1 GiB
    for receiver in (slow, trickle, moved, huge):
        assert all(r["verified"] for r in receiver.requests())


# --- retention ----------------------------------------------------------------------------------


def test_the_purge_deletes_old_messages_whose_deliveries_all_completed() -> None:
    from feishu_inbox.ledger.retention import purge

    webhooks.add_endpoint("https://a.example.com/")
    done, pending, recent = (webhooks.publish("order.paid", {"n": n}) for n in range(3))
    EventJob.objects.exclude(event_id__startswith=pending.message_id).update(
        status="completed", finished_at=timezone.now()
    )
    WebhookMessage.objects.exclude(uid=recent.message_id).update(
        created_at=timezone.now() - timedelta(days=8)
    )
    message = WebhookMessage.objects.get(uid=done.message_id)
    WebhookAttempt.objects.create(
        message=message,
        endpoint=WebhookEndpoint.objects.get(),
        outcome="accepted",
        latency_ms=1,
        at=timezone.now(),
    )
    assert purge().webhook_messages_deleted == 1
    left = set(WebhookMessage.objects.values_list("uid", flat=True))
    assert left == {pending.message_id, recent.message_id}
    assert not WebhookAttempt.objects.exists()


# --- settings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("WEBHOOK_TIMEOUT_SECONDS", 0, "WEBHOOK_TIMEOUT_SECONDS must be > 0"),
        ("WEBHOOK_TIMEOUT_SECONDS", 301, "at most 300"),
        ("WEBHOOK_RETRY_SCHEDULE", [], "WEBHOOK_RETRY_SCHEDULE must be a non-empty list"),
        ("WEBHOOK_RETRY_SCHEDULE", [5, -1], "WEBHOOK_RETRY_SCHEDULE must be"),
        ("WEBHOOK_DISABLE_AFTER", 0, "WEBHOOK_DISABLE_AFTER must be a positive duration"),
        ("WEBHOOK_ROTATION_GRACE", -5, "WEBHOOK_ROTATION_GRACE must be a positive duration"),
        ("WEBHOOK_ALLOW_PRIVATE", "yes", "WEBHOOK_ALLOW_PRIVATE must be True or False"),
        ("WEBHOOK_EVENT_TYPES", "order.paid", "WEBHOOK_EVENT_TYPES must be a list"),
    ],
)
def test_bad_webhook_settings_are_named(key: str, value: Any, words: str) -> None:
    from feishu_inbox.conf import checked_settings
    from feishu_inbox.errors import ConfigurationError

    with override_settings(FEISHU_INBOX={key: value}), pytest.raises(ConfigurationError) as bad:
        checked_settings()
    assert words in bad.value.message


def test_webhook_durations_may_be_given_in_seconds() -> None:
    from feishu_inbox.conf import checked_settings

    with override_settings(FEISHU_INBOX={"WEBHOOK_DISABLE_AFTER": 3600}):
        assert checked_settings().WEBHOOK_DISABLE_AFTER == timedelta(hours=1)
