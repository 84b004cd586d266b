"""What the admin's ledger shows of django.tasks tasks (SPEC §9): they are jobs beside the
Feishu events, with the same actions; these filters tell the kinds and the task queues apart.
Both read indexes: the event type and the partition key start with the task's prefixes."""

from __future__ import annotations

from typing import Any, TypeVar

from django.conf import settings
from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from .models import EventJob
from .task_jobs import PREFIX, queue_prefix

BACKEND = "feishu_inbox.tasks.LedgerBackend"
#: Schedules' jobs are of type ``schedule.<name>`` (scheduler.py).
SCHEDULE_PREFIX = "schedule."

KINDS = {
    "event": "Feishu events",
    "schedule": "schedule occurrences",
    "task": "django.tasks tasks",
}


QS = TypeVar("QS", bound=QuerySet[EventJob])


def of_kind(queryset: QS, kind: str) -> QS:
    """The jobs of one kind: ``event``, ``schedule`` or ``task`` (admin, ``inbox list``)."""
    if kind == "task":
        return queryset.filter(event_type__startswith=PREFIX)
    if kind == "schedule":
        return queryset.filter(event_type__startswith=SCHEDULE_PREFIX)
    return queryset.exclude(
        Q(event_type__startswith=PREFIX) | Q(event_type__startswith=SCHEDULE_PREFIX)
    )


def in_queue(queryset: QS, queue: str) -> QS:
    """The tasks of one queue (their partition key starts with it)."""
    return queryset.filter(partition_key__startswith=queue_prefix(queue))


def bad_queue_names(queues: list[str]) -> list[str]:
    """Queue names the ledger cannot use: its partition keys are ``task:<queue>:…``."""
    return sorted(q for q in queues if not isinstance(q, str) or not q or ":" in q or len(q) > 64)


def configured_queues() -> list[str]:
    """The queues of every task backend of this site that is the ledger."""
    found: set[str] = set()
    for params in getattr(settings, "TASKS", {}).values():
        if params.get("BACKEND") == BACKEND:
            found.update(params.get("QUEUES") or ["default"])
    return sorted(found)


class KindFilter(admin.SimpleListFilter):
    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(KINDS.items())

    def queryset(self, request: HttpRequest, queryset: QuerySet[EventJob]) -> QuerySet[EventJob]:
        value = self.value()
        return of_kind(queryset, value) if value is not None and value in KINDS else queryset


class QueueFilter(admin.SimpleListFilter):
    title = "task queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(q, q) for q in configured_queues()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[EventJob]) -> QuerySet[EventJob]:
        value = self.value()
        return in_queue(queryset, value) if value else queryset
