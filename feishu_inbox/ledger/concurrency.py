"""Concurrency per key (SPEC §9c): at most N running jobs per key, across all workers, for
work that is not ordered but must not flood one downstream (``@handler(concurrency=(key,
N))``).

A job takes a slot before its handler runs and gives it back when its attempt ends. Taking
locks the key's row (one acquirer of a key at a time), counts the slots whose job still runs
under the same lease with its lease unexpired, and adds one when fewer than N: a slot held by
a crashed worker stops counting when its lease ends, without any sweep.

A job that finds every slot held is parked (a ``ConcurrencyWaiter`` row, written under the
same lock): it is handed back due when the first holder's lease would end (at most
``PARK_LONGEST``), and the job that gives a slot back makes the oldest waiters due at once.
So a waiter costs one hand-back, not one every half second; a holder that crashed frees its
slot when its lease ends, when the waiters' own due time comes too.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Exists, OuterRef, QuerySet

from ..models import ConcurrencyKey, ConcurrencySlot, ConcurrencyWaiter, EventJob, Status
from ..store import store
from .pauses import HELD_FROM
from .rules import Lease

#: The longest a parked waiter waits before it looks again by itself: a holder that crashed
#: frees its slot only when its lease ends, and a give-back in the few milliseconds between
#: a waiter's parking and its hand-back finds it still running and cannot make it due.
PARK_LONGEST = 5.0


def take(key: str, limit: int, lease: Lease) -> float | None:
    """Take one of ``key``'s ``limit`` slots for the leased job: None when taken; else the job
    is parked, and the seconds until the first holder's lease ends (at most ``PARK_LONGEST``)."""
    with store().transaction():
        now = store().clock()
        ConcurrencyKey.objects.get_or_create(key=key, defaults={"limit": limit})
        ConcurrencyKey.objects.select_for_update().filter(key=key).update(limit=limit)
        slots = _live_slots(key, now)
        if slots.filter(job_id=lease.job_id).exists():
            slots.filter(job_id=lease.job_id).update(lease_token=lease.token)
            ConcurrencyWaiter.objects.filter(key=key, job_id=lease.job_id).delete()
            return None
        if slots.count() >= limit:
            ConcurrencyWaiter.objects.get_or_create(
                key=key, job_id=lease.job_id, defaults={"parked_at": now}
            )
            first_end = (
                EventJob.objects.filter(pk__in=slots.values("job_id"))
                .order_by("lease_until")
                .values_list("lease_until", flat=True)
                .first()
            )
            until = PARK_LONGEST if first_end is None else (first_end - now).total_seconds()
            return min(max(until, 0.05), PARK_LONGEST)
        ConcurrencySlot.objects.create(
            key=key, job_id=lease.job_id, lease_token=lease.token, acquired_at=now
        )
        ConcurrencyWaiter.objects.filter(key=key, job_id=lease.job_id).delete()
        return None


def _live_slots(key: str, now: datetime) -> QuerySet[ConcurrencySlot]:
    """The key's slots whose job still runs under the same unexpired lease (the others are
    deleted: their jobs ended, or their leases did). The key's row is locked."""
    live = EventJob.objects.filter(
        pk=OuterRef("job_id"),
        lease_token=OuterRef("lease_token"),
        status=Status.RUNNING,
        lease_until__gt=now,
    )
    slots = ConcurrencySlot.objects.filter(key=key)
    slots.exclude(Exists(live)).delete()
    return slots


def give_back(keys: list[str], lease: Lease) -> None:
    """The attempt ended: its slots are free, and as many of each key's oldest waiters as
    there are free slots are made due now, in the same transaction (a retried give-back
    finds its waiters still parked). Only a waiter that waits can be woken: one whose job
    ended (or is gone) loses its row, one still running (between its parking and its hand-
    back) or held by an operator's pause keeps it and is passed over."""
    woken: list[int] = []
    with store().transaction():
        now = store().clock()
        for key in sorted(keys):  # the keys' rows in key order, as take locks them
            limits = list(
                ConcurrencyKey.objects.select_for_update()
                .filter(key=key)
                .values_list("limit", flat=True)
            )
            ConcurrencySlot.objects.filter(
                key=key, job_id=lease.job_id, lease_token=lease.token
            ).delete()
            if not limits:
                continue
            waiting = ConcurrencyWaiter.objects.filter(key=key)
            unresolved = EventJob.objects.filter(pk=OuterRef("job_id")).exclude(
                status__in=[Status.COMPLETED, Status.FAILED, Status.UNKNOWN]
            )
            waiting.exclude(Exists(unresolved)).delete()  # ended, purged: nothing to wake
            free = limits[0] - _live_slots(key, now).count()
            if free <= 0:
                continue
            wakeable = EventJob.objects.filter(
                pk=OuterRef("job_id"),
                status__in=[Status.QUEUED, Status.RETRY_WAIT],
                available_at__lt=HELD_FROM,
            )
            chosen = list(
                waiting.filter(Exists(wakeable))
                .order_by("job_id")
                .values_list("job_id", flat=True)[:free]
            )
            waiting.filter(job_id__in=chosen).delete()
            woken.extend(chosen)
        if woken:  # due now; lock order: the keys (above), then partitions, then jobs
            store().hold_jobs(sorted(set(woken)), now)


def held(key: str) -> int:
    return ConcurrencySlot.objects.filter(key=key).count()
