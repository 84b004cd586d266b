"""The workers' page: every ``runworker`` process's heartbeat row, live, lost or stopped, and
the jobs the ledger has running under its leases (read-only: a worker is stopped with a
signal, not from here)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from ..ledger import workers as worker_beats
from ..ledger.stats import database_now
from ..models import EventJob, WorkerBeat
from .common import ReadOnly

STATE_COLOURS = {"live": "#16a34a", "lost": "#dc2626", "stopped": "#6b7280"}


class WorkerBeatAdmin(ReadOnly, admin.ModelAdmin):
    list_display = [
        "worker_id",
        "coloured_state",
        "host",
        "pid",
        "version",
        "slots",
        "queues_shown",
        "started_at",
        "last_beat_at",
        "running",
    ]
    list_display_links = None
    ordering = ["-last_beat_at"]
    search_fields = ["worker_id", "host"]
    list_per_page = 100

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Whoever may view the ledger's jobs may see the workers that run them."""
        return request.user.has_perm("feishu_inbox.view_eventjob") or super().has_view_permission(
            request, obj
        )

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        self._now = database_now()  # one clock for the page's live/lost
        self._running: dict[str, list[int]] = {}
        for worker_id, job_id in (
            EventJob.objects.running().order_by("id").values_list("worker_id", "id")[:1000]
        ):
            self._running.setdefault(worker_id, []).append(job_id)
        return super().changelist_view(request, extra_context)

    @admin.display(description="state")
    def coloured_state(self, obj: WorkerBeat) -> str:
        state = worker_beats.state_of(obj, self._now)
        return format_html('<b style="color:{}">{}</b>', STATE_COLOURS.get(state, "inherit"), state)

    @admin.display(description="busy / slots")
    def slots(self, obj: WorkerBeat) -> str:
        return f"{obj.busy} / {obj.concurrency}"

    @admin.display(description="queues")
    def queues_shown(self, obj: WorkerBeat) -> str:
        return obj.scope

    @admin.display(description="running (by the ledger)")
    def running(self, obj: WorkerBeat) -> str:
        jobs = self._running.get(obj.worker_id, [])
        if not jobs:
            return "-"
        base = reverse("admin:feishu_inbox_eventjob_changelist")
        return format_html_join(
            ", ", '<a href="{}{}/change/">#{}</a>', ((base, j, j) for j in jobs[:20])
        )
