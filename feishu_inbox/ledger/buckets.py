"""Token buckets in the database, shared by every worker on every host (SPEC §9c).

``take`` takes one token from each of several buckets (a chat's and its app's), all or none,
in one short transaction that locks their rows in key order; it answers how long to wait when
one of them is empty or blocked. ``block`` empties buckets until a time a remote side named
(Feishu's 429 with ``x-ogw-ratelimit-reset``). The clock is the database's (as it runs:
``store.clock``), so hosts agree.

A bucket of rate r and burst b holds at most b tokens and gains r a second; a call takes one.
A site that declares no limit never reads this table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..models import EventJob, RateBucket, Status
from ..store import store
from .limits import WAITING, Bucket


def take(buckets: Sequence[Bucket]) -> float:
    """Take one token from every bucket, or none: 0.0 when taken, else the seconds until
    they all could be (the longest refill or block)."""
    if not buckets:
        return 0.0
    wanted = {b.key: b for b in buckets}
    keys = sorted(wanted)
    specs = [wanted[k] for k in keys]
    rates, bursts = [b.per_second for b in specs], [b.capacity for b in specs]
    one = store().take_tokens(keys, rates, bursts)  # PostgreSQL: one statement
    if one is not None:
        wait, found = one
        if found == len(keys):
            return wait
        _create(wanted, store().clock())  # a bucket seen for the first time: full
        again = store().take_tokens(keys, rates, bursts)
        if again is not None and again[1] == len(keys):
            return again[0]
        # a row still missing (deleted meanwhile): the steps one by one, which create it
    with store().transaction():
        rows = _locked(wanted, store().clock())
        now = store().clock()  # after the locks: a take that waited for them counts from here
        wait = 0.0
        for row in rows:
            wait = max(wait, _wait(row, wanted[row.key], now))
        for row in rows:
            spec = wanted[row.key]
            row.tokens, row.updated_at = _level(row, spec, now), max(now, row.updated_at)
            row.rate, row.burst = spec.per_second, spec.capacity
            if wait == 0:
                row.tokens -= 1
                row.taken += 1
            else:
                row.refused += 1
        RateBucket.objects.bulk_update(
            rows, ["tokens", "updated_at", "rate", "burst", "taken", "refused"]
        )
    return wait


def block(buckets: Sequence[Bucket], seconds: float) -> None:
    """No token from these buckets for ``seconds`` (by the database's clock); they refill from
    empty after that."""
    wanted = {b.key: b for b in buckets}
    with store().transaction():
        rows = _locked(wanted, store().clock())
        now = store().clock()
        until = now + timedelta(seconds=max(seconds, 0.0))
        for row in rows:
            if row.blocked_until is None or row.blocked_until < until:
                row.blocked_until = until
            row.tokens, row.updated_at = 0.0, max(now, until)
        RateBucket.objects.bulk_update(rows, ["blocked_until", "tokens", "updated_at"])


def _locked(wanted: Mapping[str, Bucket], now: datetime) -> list[RateBucket]:
    """The buckets' rows, locked in key order (created full when new)."""
    keys = sorted(wanted)
    rows = list(RateBucket.objects.select_for_update().filter(key__in=keys).order_by("key"))
    if len(rows) < len(keys):
        _create(wanted, now, found={r.key for r in rows})
        rows = list(RateBucket.objects.select_for_update().filter(key__in=keys).order_by("key"))
    return rows


def _create(wanted: Mapping[str, Bucket], now: datetime, found: set[str] | None = None) -> None:
    """The rows of buckets seen for the first time, full (another taker's win is kept)."""
    RateBucket.objects.bulk_create(
        [
            RateBucket(
                key=k,
                tokens=b.capacity,
                rate=b.per_second,
                burst=b.capacity,
                updated_at=now,
            )
            for k, b in sorted(wanted.items())
            if found is None or k not in found
        ],
        ignore_conflicts=True,
    )


def _level(row: RateBucket, spec: Bucket, now: datetime) -> float:
    elapsed = max((now - row.updated_at).total_seconds(), 0.0)
    return min(spec.capacity, row.tokens + elapsed * spec.per_second)


def _wait(row: RateBucket, spec: Bucket, now: datetime) -> float:
    if row.blocked_until is not None and row.blocked_until > now:
        return (row.blocked_until - now).total_seconds()
    level = _level(row, spec, now)
    return 0.0 if level >= 1 else (1 - level) / spec.per_second


@dataclass(frozen=True)
class BucketState:
    key: str
    tokens: float
    per_second: float
    burst: float
    blocked_until: datetime | None
    taken: int
    refused: int

    def as_dict(self) -> dict[str, object]:
        return {
            "key": self.key,
            "tokens": round(self.tokens, 2),
            "per_second": self.per_second,
            "burst": self.burst,
            "blocked_until": self.blocked_until.isoformat() if self.blocked_until else None,
            "taken": self.taken,
            "refused": self.refused,
        }


def states(limit: int = 50) -> list[BucketState]:
    """The buckets that refused most often first: what an operator looks at."""
    now = store().clock()
    rows = list(RateBucket.objects.order_by("-refused", "key")[:limit])
    blocked = [r.blocked_until is not None and r.blocked_until > now for r in rows]
    return [
        BucketState(
            r.key,
            0.0 if is_blocked else _level(r, Bucket(r.key, r.rate, r.burst), now),
            r.rate,
            r.burst,
            r.blocked_until if is_blocked else None,
            r.taken,
            r.refused,
        )
        for r, is_blocked in zip(rows, blocked, strict=True)
    ]


def waiting_jobs() -> int:
    """Jobs waiting for a rate limit or a concurrency slot now (not due yet)."""
    return EventJob.objects.filter(
        status__in=[Status.QUEUED, Status.RETRY_WAIT], error_type=WAITING
    ).count()
