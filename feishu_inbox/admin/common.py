"""What the admin's pages share: the status colours, read-only rows, a paginator that never
counts a whole ledger."""

from __future__ import annotations

from typing import Any

from django.core.paginator import Paginator
from django.http import HttpRequest
from django.utils.functional import cached_property

from ..models import Status

STATUS_COLOURS: dict[str, str] = {
    Status.QUEUED: "#2563eb",
    Status.RUNNING: "#7c3aed",
    Status.RETRY_WAIT: "#d97706",
    Status.COMPLETED: "#16a34a",
    Status.FAILED: "#dc2626",
    Status.UNKNOWN: "#be185d",
}
COUNT_CAP = 10_000


class ReadOnly:
    """Operators change the ledger only through its actions, never by editing its rows."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class CappedCountPaginator(Paginator):
    """Counts at most COUNT_CAP rows: never a COUNT(*) over a million-row ledger per page."""

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        return len(qs.values_list("pk", flat=True)[: COUNT_CAP + 1])  # type: ignore[attr-defined]


def log_change(request: HttpRequest, obj: Any, message: str) -> None:
    """An operator's change of one object, in Django admin's history (who, what, when)."""
    from django.contrib.admin.models import CHANGE, LogEntry

    LogEntry.objects.log_actions(
        user_id=request.user.pk or 0,
        queryset=[obj],
        action_flag=CHANGE,
        change_message=message,
        single_object=True,
    )
