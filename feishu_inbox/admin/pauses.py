"""The Pauses page of the admin: what is paused, since when, by whom, and what it holds.

Adding a pause (``pause_work``) and resuming one (``resume_work``, the page's delete) call
``ledger.pauses``, never a plain save or delete, and are written to the admin history; a
pause is never edited. The jobs list offers "Pause their chats" for selected jobs too.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import ADDITION, DELETION, LogEntry
from django.db.models import QuerySet
from django.http import HttpRequest

from ..errors import InboxError
from ..ledger import pauses
from ..models import EventJob, Pause


class PauseAdmin(admin.ModelAdmin):
    list_display = ["kind", "value", "since", "by", "reason", "held"]
    list_filter = ["kind"]
    fields = ["kind", "value", "reason"]
    actions = ["resume_selected"]

    @admin.display(description="jobs held now")
    def held(self, obj: Pause) -> object:
        return pauses.as_dict(obj)["held"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("feishu_inbox.pause_work")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a pause ends by "Resume", which releases what it held

    def has_resume_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("feishu_inbox.resume_work")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("feishu_inbox.view_pause") or self.has_add_permission(request)

    def save_model(self, request: HttpRequest, obj: Pause, form: Any, change: bool) -> None:
        outcome = pauses.pause(
            obj.kind, obj.value, by=request.user.get_username(), reason=obj.reason
        )
        obj.pk = outcome.pause.pk  # the history's link
        obj.since, obj.by = outcome.pause.since, outcome.pause.by
        self.message_user(
            request,
            f"Paused {obj.kind} {obj.value}: {outcome.jobs} waiting jobs held"
            + ("" if outcome.changed else " (it was paused already)"),
            messages.SUCCESS,
        )

    @admin.action(description="Resume: what they held is due now, in order", permissions=["resume"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Pause]) -> None:
        for p in list(queryset):
            try:
                outcome = pauses.resume(p.kind, p.value, by=request.user.get_username())
            except InboxError as exc:
                self.message_user(request, exc.described(), messages.ERROR)
                continue
            LogEntry.objects.log_actions(
                request.user.pk,  # type: ignore[arg-type]
                [p],
                DELETION,
                change_message=f"Resumed {p.kind} {p.value}",
            )
            self.message_user(
                request,
                f"Resumed {p.kind} {p.value}: {outcome.jobs} jobs due now",
                messages.SUCCESS,
            )


@admin.action(description="Pause their chats (hold their partitions)", permissions=["pause"])
def pause_chats(admin_: Any, request: HttpRequest, queryset: QuerySet[EventJob]) -> None:
    keys = sorted(set(queryset.values_list("partition_key", flat=True)))
    held = 0
    for key in keys:
        outcome = pauses.pause("partition", key, by=request.user.get_username())
        held += outcome.jobs
        if outcome.changed:
            LogEntry.objects.log_actions(
                request.user.pk,  # type: ignore[arg-type]
                [outcome.pause],
                ADDITION,
                change_message=f"Paused partition {key}",
            )
    admin_.message_user(
        request,
        f"Paused {len(keys)} partitions: {held} waiting jobs held (running ones finish).",
        messages.SUCCESS,
    )
