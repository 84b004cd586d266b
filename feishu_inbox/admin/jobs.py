"""The ledger's pages: the list of jobs, a job's page, the dashboard (its figures:
``dashboard.py``), and the actions (``actions.py``), registered in ``admin/__init__.py``.

Rows are never edited or deleted here; operators act only through actions, each backed by a
custom permission, each calling ``ledger`` and reporting every refused job with its reason.
Reconcile and discard assert something about the outside world, so they go through a
confirmation page (Django's two-step ``delete_selected`` pattern).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet, TextField
from django.db.models.functions import Cast
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.timesince import timesince

from ..conf import inbox_settings
from ..ledger import turns as ledger_turns
from ..ledger import waits
from ..ledger.idempotency import effect_key
from ..ledger.payloads import text_without_secrets, without_secrets
from ..models import Attempt, CardStream, EventJob, Partition, Status, Step, job_id_from_text
from ..runtime import registry
from .actions import ACTIONS, as_admin_action, page_context
from .batches import workflow_of
from .common import STATUS_COLOURS, CappedCountPaginator, ReadOnly
from .dashboard import dashboard_data
from .filters import (
    AppFilter,
    BlocksPartitionFilter,
    EndedAsFilter,
    EventTypeFilter,
    KindFilter,
    QueueFilter,
    TenantFilter,
)
from .pauses import pause_chats


class JobPart(ReadOnly, admin.TabularInline):
    """A part of a job's page (its attempts, steps, streamed replies): seen by whoever may
    view the job, without a permission of its own model (an operator given view_eventjob
    would otherwise see no history)."""

    extra = 0
    can_delete = False
    show_change_link = False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("feishu_inbox.view_eventjob")


class AttemptInline(JobPart):
    model = Attempt
    readonly_fields = [
        "number",
        "worker_id",
        "started_at",
        "ended_at",
        "outcome",
        "error_type",
        "error_message",
    ]
    fields = tuple(readonly_fields)


class StepInline(JobPart):
    """The job's memoized steps (SPEC §7): what a retry returns instead of running them."""

    model = Step
    readonly_fields = ["name", "attempt", "started_at", "took", "result_preview"]
    fields = tuple(readonly_fields)

    @admin.display(description="took")
    def took(self, obj: Step) -> str:
        return f"{(obj.finished_at - obj.started_at).total_seconds():.3f} s"

    @admin.display(description="result")
    def result_preview(self, obj: Step) -> str:
        text = json.dumps(obj.result, ensure_ascii=False)
        return text if len(text) <= 200 else text[:199] + "…"


class CardStreamInline(JobPart):
    """The job's streamed replies (SPEC §9b): the card, its message, the last sequence and
    the text recorded with it."""

    model = CardStream
    verbose_name = "streamed reply"
    verbose_name_plural = "streamed replies"
    readonly_fields = [
        "name",
        "generation",
        "card_id",
        "message_id",
        "sequence",
        "state",
        "text_preview",
        "attempt",
        "updated_at",
    ]
    fields = tuple(readonly_fields)

    @admin.display(description="state")
    def state(self, obj: CardStream) -> str:
        if obj.closed:
            return "closed"
        what = "streaming" if obj.streaming else "streaming off"
        return what + (", interrupted" if obj.marked else "")

    @admin.display(description="text")
    def text_preview(self, obj: CardStream) -> str:
        length = f"{len(obj.text):,} characters: "
        return length + (obj.text if len(obj.text) <= 200 else obj.text[:199] + "…")


class EventJobAdmin(ReadOnly, admin.ModelAdmin):
    # Fits a 1,400 px window beside the admin's sidebars (tests/admin/test_admin_browser.py):
    # long values are shortened with their whole text in a tooltip; the app is the partition
    # key's first part for Feishu events (and a filter); the lease is one column.
    list_display = [
        "id",
        "coloured_status",
        "short_event_type",
        "short_partition",
        "attempt",
        "age",
        "short_error",
        "lease",
    ]
    list_filter = [
        "status",
        KindFilter,
        QueueFilter,
        EventTypeFilter,
        AppFilter,
        TenantFilter,
        BlocksPartitionFilter,
        EndedAsFilter,
    ]
    # Exact ids, or a partition key prefix (case-sensitive: served by an index at any size).
    search_fields = ["=event_id", "=dedupe_key"]
    search_help_text = (
        "A job id, an event id, a dedupe key (message:om_…), or the start of a partition key "
        "(default:chat:oc_…)."
    )
    date_hierarchy = "received_at"
    ordering = ["-id"]
    list_per_page = 50
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # a COUNT per filter choice over the whole ledger
    paginator = CappedCountPaginator
    actions = [*(as_admin_action(name) for name in ACTIONS), pause_chats]
    inlines = [AttemptInline, StepInline, CardStreamInline]
    fieldsets = [
        (
            "Event",
            {
                "fields": [
                    "id",
                    "event_id",
                    "event_type",
                    "app",
                    "tenant",
                    "dedupe_key",
                    "partition_key",
                    "private_message",
                    "received_at",
                ]
            },
        ),
        (
            "State",
            {
                "fields": [
                    "coloured_status",
                    "attempt",
                    "priority",
                    "available_at",
                    "finished_at",
                    "error_type",
                    "error_message",
                    "resolution",
                    "retry_policy",
                    "waiting_for",
                    "cleanups_waiting",
                ]
            },
        ),
        (
            "Effects and lease",
            {
                "fields": [
                    "effect_state",
                    "idempotency",
                    "worker_id",
                    "lease_until",
                    "claimed_at",
                ]
            },
        ),
        ("Partition", {"fields": ["partition_neighbours"]}),
        ("Workflow", {"fields": ["workflow"]}),
        ("Payload", {"fields": ["pretty_payload"]}),
    ]
    # Every field shown is read-only: operators act only through actions.
    readonly_fields = [
        name for _, section in fieldsets for name in section["fields"] if isinstance(name, str)
    ]

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("feishu_inbox.requeue_eventjob")

    def has_reconcile_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("feishu_inbox.reconcile_eventjob")

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("feishu_inbox.discard_eventjob")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("feishu_inbox.cancel_eventjob")

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("feishu_inbox.replay_eventjob")

    def has_signal_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("feishu_inbox.signal_wait")

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("feishu_inbox.pause_work")

    def get_queryset(self, request: HttpRequest) -> QuerySet[EventJob]:
        return super().get_queryset(request).defer("payload")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[EventJob], search_term: str
    ) -> tuple[QuerySet[EventJob], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        matches = Q(event_id=term) | Q(dedupe_key=term) | Q(partition_key__startswith=term)
        if term.isdigit():
            matches |= Q(pk=int(term))
        return queryset.filter(matches), False

    # --- columns ----------------------------------------------------------------------------

    @admin.display(description="status", ordering="status")
    def coloured_status(self, obj: EventJob) -> str:
        colour = STATUS_COLOURS.get(obj.status, "#555")
        return format_html(
            '<span class="fi-status" data-status="{}" style="background:{};color:#fff;'
            'padding:1px 6px;border-radius:8px;white-space:nowrap">{}</span>',
            obj.status,
            colour,
            obj.get_status_display(),
        )

    @admin.display(description="age", ordering="received_at")
    def age(self, obj: EventJob) -> str:
        return timesince(obj.received_at)

    @admin.display(description="lease")
    def lease(self, obj: EventJob) -> str:
        """A running job's worker and lease deadline (its time of day; the date in the tooltip)."""
        if obj.status != Status.RUNNING or obj.lease_until is None:
            return ""
        until = timezone.localtime(obj.lease_until)
        return format_html(
            '<span title="{} until {}">{} · {}</span>',
            obj.worker_id,
            f"{until:%Y-%m-%d %H:%M:%S %Z}",
            _shortened(obj.worker_id, 18),
            f"{until:%H:%M:%S}",
        )

    @admin.display(description="event type", ordering="event_type")
    def short_event_type(self, obj: EventJob) -> str:
        return _with_tooltip(obj.event_type, 28)

    @admin.display(description="partition", ordering="partition_key")
    def short_partition(self, obj: EventJob) -> str:
        if waits.is_parked(obj.partition_key):  # it gave its chat back while it waits
            return "(its chat given back while it waits)"
        return _with_tooltip(obj.partition_key, 30)

    @admin.display(description="error", ordering="error_type")
    def short_error(self, obj: EventJob) -> str:
        return _with_tooltip(obj.error_type, 22)

    @admin.display(description="waits for")
    def waiting_for(self, obj: EventJob) -> str:
        """What the job waits for, or last waited for (SPEC §9e), and since and until when."""
        view = waits.waits_of([obj.pk]).get(obj.pk)
        if view is None:
            return "-"
        until = (
            "no time limit" if view.until is None else f"until {view.until:%Y-%m-%d %H:%M:%S %Z}"
        )
        chat = "holding its chat" if view.holds_chat else f"its chat {view.chat} given back"
        return (
            f"{view.what} ({view.name}): {view.state}; since "
            f"{view.since:%Y-%m-%d %H:%M:%S %Z}, {until}; {chat}"
        )

    @admin.display(description="cleanups waiting")
    def cleanups_waiting(self, obj: EventJob) -> str:
        """The cleanups (``on_finish``, a typing reaction's removal) that run once the job
        ends, by name: none left once it ended and they were enqueued."""
        names = ledger_turns.pending_cleanups([obj.pk]).get(obj.pk, [])
        return ", ".join(names) if names else "-"

    @admin.display(description="retries")
    def retry_policy(self, obj: EventJob) -> str:
        policy = registry.policy_for(obj.event_type)
        attempts = obj.max_attempts or inbox_settings().MAX_ATTEMPTS
        when = ""
        if obj.status == Status.RETRY_WAIT:
            when = f"next attempt at {obj.available_at:%Y-%m-%d %H:%M:%S %Z}; "
        cancel = "cancel requested; " if obj.cancel_requested and obj.status == "running" else ""
        return f"{cancel}{when}attempt {obj.attempt} of {attempts}; policy: {policy.describe()}"

    @admin.display(description="effects")
    def effect_state(self, obj: EventJob) -> str:
        if obj.effect_uncertain:
            return "an effect raised: outcome uncertain"
        if obj.effects_in_flight:
            return f"{obj.effects_in_flight} effect(s) in flight (worker stopped inside it?)"
        if obj.side_effect_started:
            return "an effect started and finished"
        return "no effect started"

    @admin.display(description="idempotent effect")
    def idempotency(self, obj: EventJob) -> str:
        """The key and window of the job's idempotent effect (SPEC §3 Effects), if it has one."""
        if not obj.idempotent_effect or obj.idempotent_window is None:
            return "none (an effect that fails or crashes makes the job unknown)"
        key = effect_key(
            job_id=obj.pk,
            app=obj.app,
            event_id=obj.event_id,
            generation=obj.replays,
            name=obj.idempotent_effect,
        )
        window = timedelta(seconds=round(obj.idempotent_window))
        text = f"{obj.idempotent_effect!r}, key {key}, window {window}"
        if obj.idempotent_since:
            text += f", first started {obj.idempotent_since:%Y-%m-%d %H:%M:%S %Z}"
        until = obj.idempotent_until
        if until and until > timezone.now():
            text += f"; a failure before {until:%Y-%m-%d %H:%M:%S %Z} re-sends it with this key"
        elif until:
            text += f"; its window (less the margin) closed at {until:%Y-%m-%d %H:%M:%S %Z}"
        elif obj.side_effect_started:
            text += "; an effect without a key also started: not re-issued automatically"
        return text

    @admin.display(description="payload")
    def pretty_payload(self, obj: EventJob) -> str:
        # Read as the stored text (no Python decoding of a deferred field): any stored payload
        # renders, however deep, indented when Python's recursion allows it, else as stored.
        raw = (
            EventJob.objects.filter(pk=obj.pk)
            .annotate(raw=Cast("payload", TextField()))
            .values_list("raw", flat=True)
            .first()
        )
        try:
            shown = without_secrets(json.loads(raw or "{}"))
            text = json.dumps(shown, indent=2, ensure_ascii=False, sort_keys=True)
        except (RecursionError, ValueError):
            text = text_without_secrets(raw or "")
        return format_html('<pre style="white-space:pre-wrap;max-width:70em">{}</pre>', text)

    @admin.display(description="workflow")
    def workflow(self, obj: EventJob) -> str:
        """Its parent, its batch, its descendants and the batches it made (SPEC §9f)."""
        return workflow_of(obj)

    @admin.display(description="jobs ahead and behind in this partition")
    def partition_neighbours(self, obj: EventJob) -> str:
        around = EventJob.objects.in_partition(obj.partition_key).only("id", "status", "event_type")
        ahead = list(around.filter(pk__lt=obj.pk).order_by("-pk")[:5])[::-1]
        behind = list(around.filter(pk__gt=obj.pk).order_by("pk")[:5])
        part = Partition.objects.filter(key=obj.partition_key).first()

        def row(job: EventJob, marker: str = "") -> tuple[str, int, str, str, str]:
            url = reverse("admin:feishu_inbox_eventjob_change", args=[job.pk])
            return url, job.pk, job.status, job.event_type, marker

        rows = [row(j) for j in ahead] + [row(obj, "← this job")] + [row(j) for j in behind]
        head = f"head #{part.head_id} ({part.head_state})" if part and part.head_id else "idle"
        return format_html(
            "<p>Partition <code>{}</code>: {}</p><ul>{}</ul>",
            obj.partition_key,
            head,
            format_html_join("", '<li><a href="{}">#{}</a> {} {} <b>{}</b></li>', rows),
        )

    # --- actions ------------------------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        # A forged POST of an action this user may not run is refused outright.
        name = request.POST.get("action") if request.method == "POST" else None
        if name in ACTIONS and name not in self.get_actions(request):
            raise PermissionDenied(f"You may not run {name}.")
        extra_context = {
            **(extra_context or {}),
            "dashboard_url": reverse("admin:feishu_inbox_dashboard"),
        }
        return super().changelist_view(request, extra_context)

    def response_action(  # Django 6 adds a parameter (action_location): passed on
        self, request: HttpRequest, queryset: QuerySet[EventJob], *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        # The list's checkboxes post job ids; anything else (a forged or mangled post) would
        # reach the database as a lookup no id column takes: refused here, nothing moves.
        selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
        if not all(job_id_from_text(s) is not None for s in selected):
            self.message_user(request, "Select jobs by their ids; nothing was done.", "error")
            return HttpResponseRedirect(request.get_full_path())
        return super().response_action(request, queryset, *args, **kwargs)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        job = EventJob.objects.filter(pk=object_id).only("id", "status").first()
        extra_context = {**(extra_context or {}), **page_context(request, job)}
        return super().change_view(request, object_id, form_url, extra_context)

    # --- dashboard ----------------------------------------------------------------------------

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view
        return [
            path("dashboard/", view(self.dashboard_view), name="feishu_inbox_dashboard"),
            path("dashboard/data/", view(self.dashboard_data), name="feishu_inbox_dashboard_data"),
            *super().get_urls(),
        ]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return TemplateResponse(
            request,
            "feishu_inbox/dashboard.html",
            {
                **self.admin_site.each_context(request),
                "title": "Feishu inbox dashboard",
                "opts": self.model._meta,
                "data": dashboard_data(),
                "data_url": reverse("admin:feishu_inbox_dashboard_data"),
                "changelist_url": reverse("admin:feishu_inbox_eventjob_changelist"),
                "colours": {str(k): v for k, v in STATUS_COLOURS.items()},
            },
        )

    def dashboard_data(self, request: HttpRequest) -> JsonResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return JsonResponse(dashboard_data())


def _shortened(text: str, limit: int) -> str:
    """``text``, or its start and end around an ellipsis when it is longer than ``limit``."""
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return f"{text[:head]}…{text[len(text) - (limit - 1 - head) :]}"


def _with_tooltip(text: str, limit: int) -> str:
    """A list cell: ``text`` shortened to ``limit`` characters, whole in its tooltip."""
    if len(text) <= limit:
        return text
    return format_html('<span title="{}">{}</span>', text, _shortened(text, limit))
