"""The kinds of job the ledger holds, told apart by their event type (SPEC §8, §9).

Feishu events carry Feishu's event types; a schedule's occurrences are of type
``schedule.<name>``; a ``django.tasks`` task is of type ``task:<its path>`` and its partition
key starts with ``task:<queue>:``. The admin's filters and ``inbox list --kind/--queue`` select
a kind with these prefixes, which the event type and partition key indexes serve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from django.db.models import Q, QuerySet

if TYPE_CHECKING:
    from ..models import EventJob

#: The prefix of a schedule's event type: ``schedule.<name>``.
SCHEDULE_PREFIX = "schedule."
#: The prefix of a task's event type (``task:<path>``) and of its partition key
#: (``task:<queue>:…``).
TASK_PREFIX = "task:"

KINDS = {
    "event": "Feishu events",
    "schedule": "schedule occurrences",
    "task": "django.tasks tasks",
}


QS = TypeVar("QS", bound="QuerySet[EventJob]")


def queue_prefix(queue: str) -> str:
    """The start of every partition key of a queue's tasks (what ``--queue`` claims)."""
    return f"{TASK_PREFIX}{queue}:"


def of_kind(queryset: QS, kind: str) -> QS:
    """The jobs of one kind: ``event``, ``schedule`` or ``task`` (admin, ``inbox list``)."""
    if kind == "task":
        return queryset.filter(event_type__startswith=TASK_PREFIX)
    if kind == "schedule":
        return queryset.filter(event_type__startswith=SCHEDULE_PREFIX)
    return queryset.exclude(
        Q(event_type__startswith=TASK_PREFIX) | Q(event_type__startswith=SCHEDULE_PREFIX)
    )


def in_queue(queryset: QS, queue: str) -> QS:
    """The tasks of one queue (their partition key starts with it)."""
    return queryset.filter(partition_key__startswith=queue_prefix(queue))
