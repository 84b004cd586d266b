"""The Schedules page of the admin: each schedule, its next and last occurrence, its last job;
pause, resume and run now, each behind its own permission, written to the admin history.

Rows are read-only, as the ledger's are: operators act only through the actions, which call
``scheduler`` and report every refused schedule with its reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.timesince import timesince
from django.utils.translation import ngettext

from ..models import EventJob, Schedule
from ..schedules import ScheduleSpec, declared, scheduler
from .common import STATUS_COLOURS, ReadOnly

# Each action: (label, scheduler call taking the names and who asked, permission)
ScheduleAction = tuple[str, Callable[[list[str], str], scheduler.ScheduleOutcome], str]
ACTIONS: dict[str, ScheduleAction] = {
    "pause_schedules": (
        "Pause: enqueue nothing until resumed",
        lambda names, by: scheduler.pause(names),
        "pause",
    ),
    "resume_schedules": (
        "Resume: missed occurrences go by the catch-up policy",
        lambda names, by: scheduler.resume(names),
        "resume",
    ),
    "run_schedules_now": (
        "Run now: one job each, outside the cadence",
        lambda names, by: scheduler.run_now(names, by=by),
        "run",
    ),
}


def _make_action(name: str) -> Callable[..., HttpResponse | None]:
    label, _, permission = ACTIONS[name]

    def action(
        model_admin: ScheduleAdmin, request: HttpRequest, queryset: QuerySet[Schedule]
    ) -> HttpResponse | None:
        return model_admin.run_action(request, queryset, name)

    action.__name__ = name
    return admin.action(description=label, permissions=[permission])(action)


class ScheduleAdmin(ReadOnly, admin.ModelAdmin):
    list_display = [
        "name",
        "expression",
        "time_zone",
        "catch_up",
        "next_occurrence",
        "last_fired",
        "last_job",
        "state",
    ]
    list_display_links = None
    ordering = ["name"]
    actions = [_make_action(name) for name in ACTIONS]

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("feishu_inbox.pause_schedule")

    def has_resume_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("feishu_inbox.resume_schedule")

    def has_run_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("feishu_inbox.run_schedule")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        last_status = EventJob.objects.filter(pk=OuterRef("last_job_id")).values("status")[:1]
        return super().get_queryset(request).annotate(last_job_status=Subquery(last_status))

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        name = request.POST.get("action") if request.method == "POST" else None
        if name in ACTIONS and name not in self.get_actions(request):
            raise PermissionDenied(f"You may not run {name}.")
        scheduler.ensure_rows()  # a schedule declared since the last look gets its row
        return super().changelist_view(request, extra_context)

    # --- columns ------------------------------------------------------------------------------

    def _spec(self, obj: Schedule) -> ScheduleSpec | None:
        return declared().get(obj.name)

    @admin.display(description="when")
    def expression(self, obj: Schedule) -> str:
        spec = self._spec(obj)
        if spec is None:
            return format_html("<em>{}</em>", "no longer declared: never fires")
        return format_html(
            '<span style="display:inline-block;min-width:14em">{}</span><br>'
            '<code style="white-space:nowrap">{}</code>',
            spec.cron.describe(),
            spec.expression,
        )

    @admin.display(description="time zone")
    def time_zone(self, obj: Schedule) -> str:
        spec = self._spec(obj)
        return spec.tz if spec else "—"

    @admin.display(description="catch-up")
    def catch_up(self, obj: Schedule) -> str:
        spec = self._spec(obj)
        if spec is None:
            return "—"
        if spec.catch_up == "run-all":
            return f"run-all, ≤ {spec.max_catch_up} a tick"
        return spec.catch_up

    @admin.display(description="next occurrence")
    def next_occurrence(self, obj: Schedule) -> str:
        spec = self._spec(obj)
        if spec is None or obj.paused:
            return "—"
        found = spec.cron.after(obj.watermark)
        if found is None:
            return "never"
        return format_html(
            '<span style="white-space:nowrap">{}</span> {}',
            spec.cron.local(found).strftime("%Y-%m-%d"),
            spec.cron.local(found).strftime("%H:%M:%S %Z"),
        )

    @admin.display(description="last fired", ordering="last_fired_at")
    def last_fired(self, obj: Schedule) -> str:
        if obj.last_fired_at is None:
            return "never"
        return format_html(
            '<span title="{}">{} ago</span>',
            obj.last_fired_at.isoformat(),
            timesince(obj.last_fired_at),
        )

    @admin.display(description="last job")
    def last_job(self, obj: Schedule) -> str:
        if obj.last_job_id is None:
            return "—"
        status = getattr(obj, "last_job_status", None)
        if status is None:
            return f"#{obj.last_job_id} (purged)"
        return format_html(
            '<a href="{}">#{}</a> <span class="fi-status" data-status="{}" style="background:{};'
            'color:#fff;padding:1px 6px;border-radius:8px">{}</span>',
            reverse("admin:feishu_inbox_eventjob_change", args=[obj.last_job_id]),
            obj.last_job_id,
            status,
            STATUS_COLOURS.get(status, "#555"),
            status,
        )

    @admin.display(description="state", ordering="paused")
    def state(self, obj: Schedule) -> str:
        return format_html(
            '<span class="fi-schedule-state" data-paused="{}" style="background:{};color:#fff;'
            'padding:1px 6px;border-radius:8px">{}</span>',
            "yes" if obj.paused else "no",
            "#d97706" if obj.paused else "#16a34a",
            "paused" if obj.paused else "active",
        )

    # --- actions ------------------------------------------------------------------------------

    def run_action(
        self, request: HttpRequest, queryset: QuerySet[Schedule], name: str
    ) -> HttpResponse | None:
        label, call, _ = ACTIONS[name]
        rows = {s.name: s for s in queryset.order_by("name")}
        outcome = call(list(rows), request.user.get_username())
        for done in outcome.done:
            job = outcome.job_ids.get(done)
            self.log_change(
                request,
                rows[done],
                f"{label.split(':')[0]} (schedule {done})" + (f": job #{job}" if job else ""),
            )
        if outcome.done:
            self.message_user(
                request,
                ngettext(
                    "%(n)d schedule: %(label)s.", "%(n)d schedules: %(label)s.", len(outcome.done)
                )
                % {"n": len(outcome.done), "label": label},
                messages.SUCCESS,
            )
        if outcome.refused:
            reasons = "; ".join(f"{n}: {err.message}" for n, err in outcome.refused.items())
            self.message_user(
                request,
                ngettext(
                    "%(n)d schedule refused, nothing changed for it: %(reasons)s",
                    "%(n)d schedules refused, nothing changed for them: %(reasons)s",
                    len(outcome.refused),
                )
                % {"n": len(outcome.refused), "reasons": reasons},
                messages.ERROR if not outcome.done else messages.WARNING,
            )
        return None
