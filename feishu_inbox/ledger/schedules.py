"""The schedules' rows (SPEC §8): each schedule's watermark, its pause, its last job.

A tick moves a watermark by compare-and-set and enqueues the occurrences it covers in the same
transaction (``advance``): of the workers that read one watermark, exactly one moves it and
enqueues; the others match nothing. What is due is ``schedules.plan``'s to say; the rows and
their transitions are the ledger's, here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..store import Row, store
from . import rules

__all__ = ["Occurrence", "Row", "advance", "enqueue_now", "now", "set_paused", "states"]


@dataclass(frozen=True)
class Occurrence:
    """One job a schedule enqueues: its dedupe key (also its event id) and what it runs."""

    key: str
    event_type: str
    partition_key: str
    payload: dict[str, Any]
    #: Whose job it is (SPEC §9j): the schedule's tenant, "" for none.
    tenant: str = ""

    def enqueue(self) -> rules.EnqueueResult:
        return rules.enqueue(
            event_id=self.key,
            event_type=self.event_type,
            partition_key=self.partition_key,
            payload=self.payload,
            dedupe_key=self.key,
            tenant=self.tenant,
        )


def now() -> datetime:
    """The clock the schedules go by: the database's (SQLite: this host's)."""
    return store().now()


def states(names: list[str], now: datetime) -> dict[str, Row]:
    """Each named schedule's row (watermark, paused), made at ``now`` for one never seen.

    A new schedule starts at a whole second: occurrences are whole seconds, and a watermark
    written by a worker compares equal to the same value read back (compare-and-set)."""
    return {r["name"]: r for r in store().schedule_states(names, now.replace(microsecond=0))}


def advance(
    name: str, *, old: datetime, new: datetime, now: datetime, jobs: Sequence[Occurrence]
) -> list[rules.EnqueueResult] | None:
    """In one transaction: move the watermark from ``old`` to ``new``, enqueue ``jobs``, and
    record the last one stored as the schedule's last job. None: another worker moved the
    watermark first (or the schedule was paused meanwhile); nothing was enqueued."""
    ledger_store = store()
    with ledger_store.transaction():
        if not ledger_store.advance_schedule(name, old=old, new=new, now=now):
            return None
        stored = [job.enqueue() for job in jobs]
        created = [s.job_id for s in stored if s.created]
        if created:
            ledger_store.record_schedule_job(name, created[-1], now)
    return stored


def enqueue_now(name: str, job_at: Callable[[datetime], Occurrence]) -> rules.EnqueueResult:
    """One job of a schedule now, outside its cadence (the watermark stays), in one
    transaction: ``job_at(now)`` says what, by the database's clock; recorded as the
    schedule's last job when it was stored."""
    ledger_store = store()
    with ledger_store.transaction():
        at = ledger_store.now()
        states([name], at)
        stored = job_at(at).enqueue()
        if stored.created:
            ledger_store.record_schedule_job(name, stored.job_id, at)
    return stored


def set_paused(name: str, paused: bool) -> bool:
    """Pause or resume a schedule; False: it was already so (nothing changed)."""
    return store().set_schedule_paused(name, paused)
