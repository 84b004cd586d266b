"""Operator pauses (SPEC §9c): a partition, an app, an event type or a task queue.

A pause holds the jobs it matches that are queued or waiting: they are due at ``HELD_AT``,
far away, so no claim finds them and no worker wakes for them (the claim and the next
wake-up are not changed: a site that pauses nothing pays nothing). Running jobs finish. Their
partitions keep their order: a held head holds every later job of its chat. A job stored
while a pause is on is held as it is stored; a worker that claims one anyway (its view of the
pauses is up to ``CACHE_SECONDS`` old) hands it back held, spending no attempt. Resuming makes
the jobs the pause held due now (unless another pause still holds them).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from django.db import IntegrityError, connections, transaction
from django.db.models import Q
from django.utils import timezone as dj_timezone

from ..errors import LedgerError, PauseNotFound
from ..models import EventJob, Pause, PauseKind, Status
from ..store import store
from .kinds import queue_prefix

#: Where a held job is due: far enough that nothing reaches it. Jobs due after HELD_FROM are
#: held ones (a retry is never that far).
HELD_AT = datetime(2999, 1, 1, tzinfo=timezone.utc)
HELD_FROM = datetime(2900, 1, 1, tzinfo=timezone.utc)
#: The error type of a job a worker claimed and handed back because a pause matched it.
PAUSED = "Paused"
#: How old a process's view of the pauses may be (enqueue, claim).
CACHE_SECONDS = 0.5
KINDS = [k.value for k in PauseKind]


@dataclass(frozen=True)
class Outcome:
    pause: Pause
    changed: bool  # False: it was paused (resumed) already
    jobs: int  # jobs held (released)


def _matching(kind: str, value: str) -> Q:
    if kind == PauseKind.PARTITION:
        return Q(partition_key=value)
    if kind == PauseKind.APP:
        return Q(app=value)
    if kind == PauseKind.EVENT_TYPE:
        return Q(event_type=value)
    return Q(partition_key__startswith=queue_prefix(value))


def _check(kind: str, value: str) -> None:
    problems = []
    if kind not in KINDS:
        problems.append(f"a pause is of a {', '.join(KINDS)}, not {kind!r}")
    if not isinstance(value, str) or not value or len(value) > 255:
        problems.append(f"the {kind} to pause must be 1 to 255 characters (got {value!r})")
    if problems:
        raise LedgerError(
            "; ".join(problems).capitalize() + ".", fix="Fix the call; nothing was paused."
        )


def _waiting(q: Q) -> list[int]:
    return list(
        EventJob.objects.filter(q, status__in=[Status.QUEUED, Status.RETRY_WAIT]).values_list(
            "id", flat=True
        )
    )


def pause(kind: str, value: str, *, by: str = "", reason: str = "") -> Outcome:
    """Hold what ``kind``/``value`` matches from now on (and what is waiting already)."""
    _check(kind, value)
    try:
        with transaction.atomic():
            row, created = Pause.objects.get_or_create(
                kind=kind,
                value=value,
                defaults={"since": dj_timezone.now(), "by": by[:150], "reason": reason},
            )
    except IntegrityError:  # another operator paused it at the same moment
        row, created = Pause.objects.get(kind=kind, value=value), False
    forget_cache()
    held = store().hold_jobs(_waiting(_matching(kind, value)), HELD_AT)
    return Outcome(row, created, held)


def resume(kind: str, value: str, *, by: str = "") -> Outcome:
    """End the pause; the jobs it held (and no other pause holds) are due now."""
    _check(kind, value)
    row = Pause.objects.filter(kind=kind, value=value).first()
    if row is None:
        raise PauseNotFound(
            f"No {kind} {value!r} is paused.",
            fix="`python manage.py inbox pauses` lists what is paused.",
        )
    row.delete()
    forget_cache()
    others = Pause.objects.all()
    still = Q()
    for other in others:
        still |= _matching(other.kind, other.value)
    held = _matching(kind, value) & Q(available_at__gte=HELD_FROM)
    ids = list(
        EventJob.objects.filter(held, status__in=[Status.QUEUED, Status.RETRY_WAIT])
        .exclude(still if others else Q(pk__in=[]))
        .values_list("id", flat=True)
    )
    released = store().hold_jobs(ids, store().now())
    row.by = by or row.by
    return Outcome(row, True, released)


def listed() -> list[Pause]:
    return list(Pause.objects.all())


def as_dict(p: Pause) -> dict[str, object]:
    return {
        "kind": p.kind,
        "value": p.value,
        "since": p.since.isoformat(),
        "by": p.by,
        "reason": p.reason,
        "held": EventJob.objects.filter(
            _matching(p.kind, p.value),
            status__in=[Status.QUEUED, Status.RETRY_WAIT],
            available_at__gte=HELD_FROM,
        ).count()
        if p.pk
        else 0,
    }


# --- what a process knows of the pauses ----------------------------------------------------

_cache: dict[str, object] = {"at": -1e9, "pauses": ()}
_lock = threading.Lock()
#: One thread of a process reads the pauses at a time: at each expiry, every handler thread
#: that starts a job looks, and a worker of 250 threads asked for 250 connections at once.
_reading = threading.Lock()


def forget_cache() -> None:
    with _lock:
        _cache["at"] = -1e9


def active() -> tuple[Pause, ...]:
    """The pauses, as of at most CACHE_SECONDS ago (one query per interval per process). A
    thread that finds them stale while another thread reads them takes the last view (older
    by that read's time); with no view yet (or forgotten), it waits for the read."""
    now = time.monotonic()
    at, known = _cache["at"], _cache["pauses"]  # one read of each: no lock on the hot path
    if now - float(at) < CACHE_SECONDS:  # type: ignore[arg-type]
        return known  # type: ignore[return-value]
    if not _reading.acquire(blocking=float(at) <= -1e9):  # type: ignore[arg-type]
        return known  # type: ignore[return-value]
    try:
        if time.monotonic() - float(_cache["at"]) < CACHE_SECONDS:  # type: ignore[arg-type]
            # (read by another thread while this one waited)
            return _cache["pauses"]  # type: ignore[return-value]
        return _read()
    finally:
        _reading.release()


def _read() -> tuple[Pause, ...]:
    """The pauses as stored now, kept as the process's view. On a thread that had no
    connection (a handler thread whose jobs never touch the database), the one this read
    opened is closed again: a pool thread keeps its connection for ever, and a worker's
    threads would hold one each for this read alone."""
    started = time.monotonic()
    conn = connections[Pause.objects.db]
    opened = conn.connection is None
    try:
        found = tuple(Pause.objects.all())
    finally:
        if opened and not conn.in_atomic_block:
            conn.close()
    with _lock:
        _cache["pauses"], _cache["at"] = found, started
    return found


def holding(*, app: str, event_type: str, partition_key: str) -> Pause | None:
    """The pause that holds a job of this app, type and partition, if any. A match in the
    cached view is read again: a pause resumed meanwhile must not hold its jobs again."""
    found = _holding(active(), app, event_type, partition_key)
    if found is None:
        return None
    return _holding(_read(), app, event_type, partition_key)


def _holding(
    known: tuple[Pause, ...], app: str, event_type: str, partition_key: str
) -> Pause | None:
    for p in known:
        if (
            (p.kind == PauseKind.PARTITION and partition_key == p.value)
            or (p.kind == PauseKind.APP and app == p.value)
            or (p.kind == PauseKind.EVENT_TYPE and event_type == p.value)
            or (p.kind == PauseKind.QUEUE and partition_key.startswith(queue_prefix(p.value)))
        ):
            return p
    return None


def hold_new(job_id: int, *, app: str, event_type: str, partition_key: str) -> bool:
    """A job just stored: held at once when a pause matches it."""
    if holding(app=app, event_type=event_type, partition_key=partition_key) is None:
        return False
    held = store().hold_jobs([job_id], HELD_AT) > 0
    release_if_unheld(job_id, app=app, event_type=event_type, partition_key=partition_key)
    return held


def release_if_unheld(job_id: int, *, app: str, event_type: str, partition_key: str) -> bool:
    """After holding a job: if no pause matches it any more (resumed meanwhile), it is due
    now. Resume deletes its pause, then releases what it finds held; a holder writes its
    hold, then looks at the pauses again. Whichever comes second sees the other's write, so
    no job stays held by a pause that is gone (on SQLite the two cannot even interleave)."""
    forget_cache()
    if holding(app=app, event_type=event_type, partition_key=partition_key) is not None:
        return False
    store().hold_jobs([job_id], store().now())
    return True


def seconds_until_held() -> float:
    """For a worker that hands a paused job back: the delay that makes it due at HELD_AT."""
    return (HELD_AT - store().now()).total_seconds()
