"""The outbound webhooks' pages: endpoints with their health, messages with every attempt.

An endpoint's URL, description, event types and rate limit are edited through
``webhooks.update`` (checked as the code checks them); it is added, and its secret rotated,
from code or ``inbox webhooks`` only, which show the secret once: no page ever shows a secret
(an attempt shows the request's headers, whose signature is not one). Enable, disable and
replay are actions, the last behind the ``replay_webhook`` permission, each calling
``feishu_inbox.webhooks`` and written to the admin history.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import ngettext

from .. import webhooks
from ..errors import InboxError
from ..tables.webhooks import WebhookAttempt, WebhookEndpoint, WebhookMessage
from .common import log_change

#: The attempts an endpoint's page lists (the messages' pages list every one).
RECENT = 20


class EndpointForm(forms.ModelForm):
    #: Checked by ``webhooks.endpoints.check_url`` (schemes, credentials, private addresses).
    url = forms.CharField(max_length=2000)

    class Meta:
        model = WebhookEndpoint
        fields = ["url", "description", "event_types", "rate_limit"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            webhooks.endpoints.check_url(data.get("url"))
            data["event_types"] = webhooks.endpoints.check_event_types(
                data.get("event_types") or []
            )
            webhooks.endpoints.check_rate_limit(data.get("rate_limit"))
        except InboxError as exc:
            raise forms.ValidationError(exc.described()) from None
        return data


class WebhookEndpointAdmin(admin.ModelAdmin):
    form = EndpointForm
    list_display = [
        "uid",
        "url",
        "health",
        "failure_streak",
        "last_success_at",
        "disabled_reason",
        "subscribed",
        "rate_limit",
    ]
    list_filter = ["enabled"]
    search_fields = ["uid", "url", "description"]
    readonly_fields = [
        "uid",
        "enabled",
        "disabled_reason",
        "disabled_at",
        "failure_streak",
        "failing_since",
        "last_success_at",
        "last_failure_at",
        "secret_rotation",
        "created_at",
        "recent_attempts",
    ]
    actions = ["enable_selected", "disable_selected", "replay_last_day"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # its secret is shown once: add it from code or `inbox webhooks add`

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # `inbox webhooks delete`: it releases the endpoint's pause first

    @admin.display(description="subscribes to")
    def subscribed(self, obj: WebhookEndpoint) -> str:
        return ", ".join(obj.event_types) or "every event type"

    @admin.display(description="health")
    def health(self, obj: WebhookEndpoint) -> str:
        return obj.health

    @admin.display(description="secret rotation")
    def secret_rotation(self, obj: WebhookEndpoint) -> str:
        until = obj.previous_secret_until
        if obj.previous_secret and until and until > timezone.now():
            return f"the old secret also signs until {until:%Y-%m-%d %H:%M} UTC"
        return "one secret"

    @admin.display(description=f"last {RECENT} attempts")
    def recent_attempts(self, obj: WebhookEndpoint) -> str:
        rows = WebhookAttempt.objects.filter(endpoint=obj).select_related("message")[:RECENT]
        return format_html(
            "<table><tr><th>at</th><th>message</th><th>outcome</th><th>status</th>"
            "<th>latency</th><th>answer</th></tr>{}</table>",
            format_html_join(
                "",
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} ms</td><td>{}</td></tr>",
                (
                    (
                        f"{a.at:%Y-%m-%d %H:%M:%S}",
                        a.message.uid,
                        a.outcome,
                        a.status_code or "-",
                        round(a.latency_ms),
                        (a.error or a.response)[:120],
                    )
                    for a in rows
                ),
            ),
        )

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        data = form.cleaned_data
        webhooks.update(
            obj.uid,
            url=data["url"],
            event_types=data["event_types"],
            description=data["description"],
            rate_limit=data["rate_limit"],
        )

    @admin.action(description="Enable: send what they held, in order", permissions=["change"])
    def enable_selected(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        released = 0
        for endpoint in queryset:
            released += webhooks.enable(endpoint.uid)
            log_change(request, endpoint, "Enabled")
        self.message_user(
            request,
            ngettext(
                "%(n)d endpoint enabled; %(held)d held deliveries released.",
                "%(n)d endpoints enabled; %(held)d held deliveries released.",
                queryset.count(),
            )
            % {"n": queryset.count(), "held": released},
            messages.SUCCESS,
        )

    @admin.action(description="Disable: hold their deliveries", permissions=["change"])
    def disable_selected(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        who = getattr(request.user, "get_username", lambda: "an operator")()
        changed = 0
        for endpoint in queryset:
            if webhooks.disable(endpoint.uid, reason="operator", detail=f"disabled by {who}"):
                changed += 1
                log_change(request, endpoint, "Disabled")
        self.message_user(
            request,
            ngettext("%d endpoint disabled.", "%d endpoints disabled.", changed) % changed,
            messages.SUCCESS if changed else messages.WARNING,
        )

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("feishu_inbox.replay_webhook")

    @admin.action(
        description="Replay what they were sent in the last 24 hours", permissions=["replay"]
    )
    def replay_last_day(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        until = timezone.now()
        replayed = pending = 0
        for endpoint in queryset:
            try:
                done = webhooks.replay_window(endpoint.uid, until - timedelta(days=1), until)
            except InboxError as exc:
                self.message_user(request, f"{endpoint.uid}: {exc.described()}", messages.ERROR)
                continue
            replayed, pending = replayed + len(done.jobs), pending + len(done.pending)
            log_change(request, endpoint, f"Replayed {len(done.jobs)} deliveries of the last day")
        self.message_user(
            request,
            ngettext("%d delivery replayed", "%d deliveries replayed", replayed) % replayed
            + (f"; {pending} still pending, not replayed." if pending else "."),
            messages.SUCCESS if replayed else messages.WARNING,
        )


class AttemptInline(admin.TabularInline):
    model = WebhookAttempt
    extra = 0
    can_delete = False
    fields = (
        "at",
        "endpoint",
        "outcome",
        "status_code",
        "latency_ms",
        "response",
        "request_headers",
        "error",
        "job_id",
    )
    readonly_fields = fields
    ordering = ["-id"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("feishu_inbox.view_webhookmessage")  # its message's


class WebhookMessageAdmin(admin.ModelAdmin):
    list_display = ["uid", "event_type", "key", "created_at", "deliveries"]
    list_filter = ["event_type"]
    search_fields = ["uid", "key"]
    readonly_fields = ["uid", "event_type", "key", "created_at", "body"]
    fields = ("uid", "event_type", "key", "created_at", "body")
    inlines = [AttemptInline]
    actions = ["replay_selected"]
    date_hierarchy = "created_at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("feishu_inbox.replay_webhook")

    @admin.display(description="last outcome per endpoint")
    def deliveries(self, obj: WebhookMessage) -> str:
        last: dict[int, str] = {}
        for endpoint_id, outcome in (
            WebhookAttempt.objects.filter(message=obj)
            .order_by("id")
            .values_list("endpoint_id", "outcome")
        ):
            last[endpoint_id] = outcome
        counts: dict[str, int] = {}
        for outcome in last.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        return ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "not tried yet"

    @admin.action(description="Replay to every endpoint they were sent to", permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet[WebhookMessage]) -> None:
        replayed, refused = 0, []
        tried = WebhookAttempt.objects.filter(message__in=queryset).values_list(
            "message__uid", "endpoint__uid"
        )
        for message_uid, endpoint_uid in sorted(set(tried)):
            try:
                done = webhooks.replay(message_uid, endpoint_uid)
            except InboxError as exc:
                refused.append(f"{message_uid} → {endpoint_uid}: {exc.described()}")
                continue
            replayed += len(done.jobs)
        self.message_user(
            request,
            ngettext("%d delivery replayed.", "%d deliveries replayed.", replayed) % replayed,
            messages.SUCCESS if replayed else messages.WARNING,
        )
        for line in refused[:20]:
            self.message_user(request, line, messages.ERROR)
