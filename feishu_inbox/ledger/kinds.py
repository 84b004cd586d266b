"""The kinds of job the ledger holds, in one open registry (SPEC §8, §9).

A kind is told apart by the start of its jobs' event type: Feishu events carry Feishu's own
types (the kind ``event``, whose prefix is empty: every type no other kind claims); a
schedule's occurrences are ``schedule.<name>``; a ``django.tasks`` task is ``task:<its
path>``, its partition key starting with ``task:<queue>:``. Each kind says how its jobs run
(one function for every type, or None: each type's own handler), its retry policy and timeout,
and what a failed attempt records. The worker, the admin's kind filter, ``inbox list --kind``
and the metrics read this registry; every built-in kind is registered in ``AppConfig.ready``,
and a capability that adds a kind registers it there too.

The event type and partition key indexes serve the prefixes' filters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from django.db.models import QuerySet

from ..errors import InboxError
from .retry import RetryPolicy

if TYPE_CHECKING:
    from ..models import EventJob

#: The prefix of a schedule's event type: ``schedule.<name>``.
SCHEDULE_PREFIX = "schedule."
#: The prefix of a task's event type (``task:<path>``) and of its partition key
#: (``task:<queue>:…``).
TASK_PREFIX = "task:"


def _no_policy(event_type: str) -> RetryPolicy | None:
    return None


def _no_timeout(event_type: str) -> float | None:
    return None


def _class_and_text(error: BaseException) -> tuple[str, str]:
    """The exception's class name and text; ours with their code and fix (``[code] … — fix``),
    as the admin and the CLI show every refusal."""
    return type(error).__name__, error.described() if isinstance(error, InboxError) else str(error)


#: Workflows (SPEC §9f): the event id of a job a workflow enqueued for a handler (a child, a
#: batch member, a callback, a chain link), and the step its handler's return value is
#: memoized as (its result, which a parent or a chain reads). Other handlers' return values
#: are not stored.
WORKFLOW_EVENT_PREFIX = "wf:"
RESULT_STEP = "feishu_inbox:result"


#: The key of a parent's wait for its children (``workflows.children_key``): no one signals it,
#: a batch of them delivers it.
CHILDREN_KEY_PREFIX = "\x1fchildren:"


def describe_key(key: str, *, signal: str = "the signal", time: str = "its time") -> str:
    """What a wait of this key waits for, in words: a signal, its time, or children."""
    if key.startswith(CHILDREN_KEY_PREFIX):
        mode, count, _ = key[len(CHILDREN_KEY_PREFIX) :].split(":", 2)
        return f"{'all' if mode == 'all' else 'any'} of its {count} children"
    return f"{signal} {key!r}" if key else time


@dataclass(frozen=True)
class JobKind:
    """One kind of job: its jobs' event types start with ``prefix`` ("": the catch-all)."""

    #: The kind's name: the admin filter's value and ``inbox list --kind``'s choice.
    name: str
    #: What its jobs are, in words (plural): "Feishu events".
    label: str
    prefix: str
    #: The one function that runs every job of the kind (it gets the ``Event``); None: each
    #: event type's own handler (``@feishu_inbox.handler``).
    run: Callable[[Any], Any] | None = None
    #: An event type's retry policy (None: its handler's own, else the site's).
    policy: Callable[[str], RetryPolicy | None] = _no_policy
    #: An event type's timeout in seconds (None: its handler's, else none).
    timeout: Callable[[str], float | None] = _no_timeout
    #: What a failed attempt records (error type, message).
    describe_error: Callable[[BaseException], tuple[str, str]] = _class_and_text
    #: Whether its handlers may wait (SPEC §9e); a kind whose callers expect one run to the
    #: end (a django.tasks task's result) refuses a wait with ``WaitRefused``.
    can_wait: bool = True


#: Feishu events: every event type no other kind claims.
FEISHU_EVENTS = JobKind("event", "Feishu events", "")
#: A schedule's occurrences, each run by the handler of its ``schedule.<name>`` type.
SCHEDULE_OCCURRENCES = JobKind("schedule", "schedule occurrences", SCHEDULE_PREFIX)

_kinds: dict[str, JobKind] = {}
#: Each event type's kind, once looked up (a worker asks two or three times a job); emptied
#: when a kind is registered, and when it grows past ``_KNOWN_TYPES`` (types are few).
_kind_of_type: dict[str, JobKind] = {}
_KNOWN_TYPES = 10_000


def register(kind: JobKind) -> None:
    """Add a kind (again: replace it). Two kinds with one prefix or one name are refused."""
    for other in _kinds.values():
        if other.name != kind.name and other.prefix == kind.prefix:
            raise ValueError(
                f"job kind {kind.name!r} has the prefix {kind.prefix!r} of kind {other.name!r}"
            )
    _kinds[kind.name] = kind
    _kind_of_type.clear()


def unregister(name: str) -> None:
    """Remove a kind (a test's, or a capability's that a site turned off)."""
    _kinds.pop(name, None)
    _kind_of_type.clear()


def registered() -> list[JobKind]:
    """Every kind, Feishu events first, then by name."""
    return sorted(_kinds.values(), key=lambda k: (k.prefix != "", k.name))


def choices() -> dict[str, str]:
    """Each kind's name and label (the admin filter's lookups, the CLI's choices)."""
    return {k.name: k.label for k in registered()}


def kind_of(event_type: str) -> JobKind:
    """The kind of a job of this event type: the one with the longest prefix it starts with
    (Feishu events when no other kind claims it)."""
    try:
        return _kind_of_type[event_type]
    except KeyError:
        pass
    found = max(
        (k for k in _kinds.values() if event_type.startswith(k.prefix)),
        key=lambda k: len(k.prefix),
        default=FEISHU_EVENTS,
    )
    if len(_kind_of_type) >= _KNOWN_TYPES:
        _kind_of_type.clear()
    _kind_of_type[event_type] = found
    return found


QS = TypeVar("QS", bound="QuerySet[EventJob]")


def queue_prefix(queue: str) -> str:
    """The start of every partition key of a queue's tasks (what ``--queue`` claims)."""
    return f"{TASK_PREFIX}{queue}:"


def of_kind(queryset: QS, name: str) -> QS:
    """The jobs of one kind (admin, ``inbox list``): their event type starts with its prefix
    and with no longer prefix of another kind."""
    kind = _kinds.get(name)
    if kind is None:
        return queryset.none()
    longer = [k.prefix for k in _kinds.values() if k.prefix.startswith(kind.prefix) and k != kind]
    if kind.prefix:
        queryset = queryset.filter(event_type__startswith=kind.prefix)
    for prefix in longer:
        queryset = queryset.exclude(event_type__startswith=prefix)
    return queryset


def in_queue(queryset: QS, queue: str) -> QS:
    """The tasks of one queue (their partition key starts with it)."""
    return queryset.filter(partition_key__startswith=queue_prefix(queue))


__all__ = [
    "FEISHU_EVENTS",
    "SCHEDULE_OCCURRENCES",
    "SCHEDULE_PREFIX",
    "TASK_PREFIX",
    "JobKind",
    "choices",
    "in_queue",
    "kind_of",
    "of_kind",
    "queue_prefix",
    "register",
    "registered",
    "unregister",
]
