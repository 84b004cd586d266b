"""Conversation turns (SPEC §9g), the ledger's side: what waits behind a turn, the turn's
membership decided once, and its cleanup effects run once after it ends.

- **Behind.** A turn is formed from its chat's partition: the jobs behind the turn's first
  message, in receipt order (``behind``). Nothing is read from anywhere else, so the worker
  that forms it and every worker after it see the same messages in the same order.
- **Membership.** ``take`` ends the messages a turn takes in (``completed``, error type
  ``Coalesced``, "taken into the turn of job N") and records what the turn holds as a step of
  the turn's job, in one transaction fenced by its lease, its chat's row locked first (the
  ledger's lock order). A message an operator cancelled meanwhile makes the whole take change
  nothing (``TurnChanged``: the worker looks again). A retried or replayed turn reads the step:
  its membership never changes after it was recorded.
- **Cleanups.** ``add_cleanup`` records a job spec for when the running job ends (fenced; the
  same name twice is one cleanup). ``fire_cleanups`` — every worker, at every sweep — finds the
  cleanups whose job has ended (completed, failed, ``unknown``; or purged), enqueues each one's
  job and deletes its row in one transaction, the rows locked ``SKIP LOCKED``: each runs once,
  whichever worker sees it first, and a crash before the commit leaves it to the next sweep. A
  job whose lease expired without an effect is retried (it has not ended): its cleanup waits
  for the retry's end, and the retry's ``on_finish`` finds the same row.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Exists, Max, OuterRef
from django.utils import timezone

from .. import telemetry
from ..conf import checked_settings
from ..errors import InboxError, LeaseLost
from ..models import Attempt, EventJob, Status
from ..store import store
from ..tables.turns import TurnCleanup
from .fencing import why_not_held
from .workflows import enqueue_spec

log = logging.getLogger("feishu_inbox.ledger")

#: The error type of a message a turn took in, and of a turn that ended without running.
COALESCED = "Coalesced"
#: The states that end a job for its cleanups: ``unknown`` too (nothing will run it again
#: without an operator, and a reaction must not wait for one).
ENDED = (Status.COMPLETED.value, Status.FAILED.value, Status.UNKNOWN.value)
#: The most cleanups one ``fire_cleanups`` enqueues (the rest wait for the next sweep).
FIRE_LIMIT = 200


class TurnChanged(Exception):
    """A message the turn would take in is no longer waiting (an operator ended it): nothing
    was taken; look again."""


@dataclass(frozen=True)
class Behind:
    """A job waiting behind a turn in its chat."""

    id: int
    event_type: str
    payload: dict[str, Any]
    received_at: datetime
    status: str


def behind(
    job_id: int, partition_key: str, limit: int, *, clock: bool = True
) -> tuple[datetime | None, list[Behind]]:
    """The database's clock (None unless ``clock``), and the unresolved jobs after ``job_id``
    in its partition, oldest first, at most ``limit`` (through the partition's index of
    unresolved jobs)."""
    now, rows = store().turn_behind(job_id, partition_key, limit)
    found = [
        Behind(r["id"], r["event_type"], r["payload"], r["received_at"], r["status"]) for r in rows
    ]
    return (now if clock else None), found


def partition_of(app: str, dedupe_key: str) -> str | None:
    """The partition of the app's job of this dedupe key (a message's), if it is stored."""
    found = (
        EventJob.objects.filter(app=app, dedupe_key=dedupe_key)
        .values_list("partition_key", flat=True)
        .first()
    )
    return str(found) if found is not None else None


def clock() -> datetime:
    """The database's clock (a start deadline is kept by it)."""
    return store().now()


def take(
    lease: Any,
    *,
    members: Sequence[int],
    memo: str,
    value: Any,
    private: bool = False,
    keep_private: bool = False,
    how: str = "coalesced",
    lease_seconds: float | None = None,
) -> None:
    """End ``members`` (jobs waiting behind the lease's job in its chat) as taken into its turn
    and record ``value`` as its step ``memo``; one transaction, fenced (``LeaseLost``: nothing
    changed). ``TurnChanged`` when a member is no longer waiting: nothing changed either.

    The turn's job stops being a private message (SPEC §4's supersede: ``private``, its flag)
    unless ``keep_private``: its handler's ``during`` says what a newer message does to it. A
    turn of its first message alone is its record: one fenced statement."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    if not members and not (private and not keep_private):
        _record(lease, memo, text)
        return
    seconds = lease_seconds or checked_settings().LEASE_SECONDS
    key = lease.partition_key
    with store().transaction():
        store().lock_partitions([key])
        if store().renew(lease, seconds) is None:
            why = why_not_held(lease) or "its lease is lost"
            raise LeaseLost(f"Cannot form the turn of job {lease.job_id}: {why}.")
        if members:
            taken = (
                EventJob.objects.filter(
                    id__in=list(members),
                    partition_key=key,
                    status__in=(Status.QUEUED, Status.RETRY_WAIT),
                )
                .exclude(id=lease.job_id)
                .update(
                    status=Status.COMPLETED,
                    error_type=COALESCED,
                    error_message=f"Taken into the turn of job {lease.job_id}.",
                    finished_at=timezone.now(),
                )
            )
            if taken != len(set(members)):
                transaction.set_rollback(True)
                raise TurnChanged(
                    f"{len(set(members)) - taken} of the messages behind job {lease.job_id} "
                    "stopped waiting while its turn was formed."
                )
        # The partition's head stays the running turn: its finish moves the head past them.
        _record(lease, memo, text)
        if private and not keep_private:
            EventJob.objects.filter(id=lease.job_id).update(private_message=False)
    telemetry.TURN_MESSAGES.labels(how).inc(len(members))


def _record(lease: Any, memo: str, text: str) -> None:
    """The turn's step, fenced: ``LeaseLost`` when the lease is gone; ``TurnChanged`` when the
    step is there already (the caller's numbering was stale)."""
    if not store().record_step(lease, name=memo, result=text, took=0.0):
        lost = why_not_held(lease)
        if lost is None:
            raise TurnChanged(f"Job {lease.job_id} recorded its step {memo!r} already.")
        raise LeaseLost(f"Cannot record the turn of job {lease.job_id}: {lost}.")


# --- cleanups ------------------------------------------------------------------------------


def add_cleanup(
    lease: Any, *, name: str, spec: dict[str, Any], lease_seconds: float | None = None
) -> bool:
    """Record ``spec`` to be enqueued once the lease's job has ended; fenced (``LeaseLost``).
    False when a cleanup of that name was recorded already (by an earlier attempt)."""
    seconds = lease_seconds or checked_settings().LEASE_SECONDS
    with store().transaction():
        if store().renew(lease, seconds) is None:
            why = why_not_held(lease) or "its lease is lost"
            raise LeaseLost(f"Cannot add a cleanup to job {lease.job_id}: {why}.")
        if TurnCleanup.objects.filter(job_id=lease.job_id, name=name).exists():
            return False
        try:
            with transaction.atomic():
                TurnCleanup.objects.create(
                    job_id=lease.job_id, name=name, spec=spec, created_at=timezone.now()
                )
        except IntegrityError:  # the same job's other thread, at the same instant
            return False
    return True


def fire_cleanups(limit: int = FIRE_LIMIT) -> int:
    """Enqueue the cleanups of jobs that have ended, each once; returns how many."""
    if not TurnCleanup.objects.exists():  # one statement, no transaction: the usual answer
        return 0
    live = EventJob.objects.filter(id=OuterRef("job_id")).exclude(status__in=ENDED)
    with store().transaction():
        due = list(
            TurnCleanup.objects.select_for_update(skip_locked=True)
            .filter(~Exists(live))
            .order_by("id")[:limit]
        )
        if not due:
            return 0
        owners = {
            job_id: (app, tenant)
            for job_id, app, tenant in EventJob.objects.filter(
                id__in={c.job_id for c in due}
            ).values_list("id", "app", "tenant")
        }
        for cleanup in due:
            app, tenant = owners.get(cleanup.job_id, ("default", ""))
            spec = dict(cleanup.spec)
            if spec.get("tenant") is None:  # its job's (recorded before tenants, or none)
                spec["tenant"] = tenant
            try:
                with transaction.atomic():
                    enqueue_spec(
                        spec,
                        {
                            "parent": cleanup.job_id,
                            "generation": "end",
                            "name": cleanup.name,
                            "index": cleanup.pk,
                            "app": app,
                        },
                    )
            except InboxError as refused:  # its spec cannot be stored (a task gone): dropped
                log.error(
                    "the cleanup %r of job %s was refused and is dropped: %s",
                    cleanup.name,
                    cleanup.job_id,
                    refused,
                )
        TurnCleanup.objects.filter(id__in=[c.pk for c in due]).delete()
    telemetry.TURN_CLEANUPS.inc(len(due))
    return len(due)


#: How an attempt ends while its handler's thread may still be running: at its timeout (the
#: thread abandoned), or its lease expired (a worker paused, cut off from the database).
ABANDONED = ("TimedOut", "LeaseExpired", "LeaseExpiredAfterSideEffect", "WorkerCrashed")


def abandoned_for(job_id: int, window: float) -> float:
    """Seconds until ``window`` has passed since the newest attempt of ``job_id`` that ended
    while its thread may have run on (``ABANDONED``); 0 when none did, or long enough ago.
    By the database's clock, which ended the attempts."""
    newest = Attempt.objects.filter(job_id=job_id, error_type__in=ABANDONED).aggregate(
        at=Max("ended_at")
    )["at"]
    if newest is None:
        return 0.0
    return max(0.0, (newest + timedelta(seconds=window) - clock()).total_seconds())


def pending_cleanups(job_ids: Sequence[int]) -> dict[int, list[str]]:
    """The cleanups still waiting for each of these jobs to end (admin, ``inbox show``)."""
    found: dict[int, list[str]] = {}
    for job_id, name in (
        TurnCleanup.objects.filter(job_id__in=list(job_ids))
        .order_by("id")
        .values_list("job_id", "name")
    ):
        found.setdefault(job_id, []).append(name)
    return found
