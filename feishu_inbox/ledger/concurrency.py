"""Concurrency per key (SPEC §9c): at most N running jobs per key, across all workers, for
work that is not ordered but must not flood one downstream (``@handler(concurrency=(key,
N))``).

A job takes a slot before its handler runs and gives it back when its attempt ends. Taking
locks the key's row (one acquirer of a key at a time), counts the slots whose job still runs
under the same lease with its lease unexpired, and adds one when fewer than N: a slot held by
a crashed worker stops counting when its lease ends, without any sweep.
"""

from __future__ import annotations

from django.db.models import Exists, OuterRef

from ..models import ConcurrencyKey, ConcurrencySlot, EventJob, Status
from ..store import store
from .rules import Lease


def take(key: str, limit: int, lease: Lease) -> bool:
    """Take one of ``key``'s ``limit`` slots for the leased job; False when all are held."""
    with store().transaction():
        now = store().clock()
        ConcurrencyKey.objects.get_or_create(key=key, defaults={"limit": limit})
        ConcurrencyKey.objects.select_for_update().filter(key=key).update(limit=limit)
        live = EventJob.objects.filter(
            pk=OuterRef("job_id"),
            lease_token=OuterRef("lease_token"),
            status=Status.RUNNING,
            lease_until__gt=now,
        )
        slots = ConcurrencySlot.objects.filter(key=key)
        slots.exclude(Exists(live)).delete()  # their jobs ended, or their leases did
        if slots.filter(job_id=lease.job_id).exists():
            slots.filter(job_id=lease.job_id).update(lease_token=lease.token)
            return True
        if slots.count() >= limit:
            return False
        ConcurrencySlot.objects.create(
            key=key, job_id=lease.job_id, lease_token=lease.token, acquired_at=now
        )
        return True


def give_back(keys: list[str], lease: Lease) -> None:
    """The attempt ended: its slots are free."""
    ConcurrencySlot.objects.filter(
        key__in=keys, job_id=lease.job_id, lease_token=lease.token
    ).delete()


def held(key: str) -> int:
    return ConcurrencySlot.objects.filter(key=key).count()
