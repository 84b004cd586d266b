"""The ledger's state machine (SPEC §3): what each operation means, whatever the database.

Every operation is one database transaction, run by the store (``store/``): this module checks
the arguments, states the rules (fencing, leases, backoff, which state an operator action
starts from) and turns what the store found into results or typed errors. A refused operation
changes nothing; a retried write never applies twice (the lease token fences it).

Concurrency rules, kept by both stores' SQL (SQLite has one writer, so they hold trivially):

- Lock order is always partition row, then job row(s).
- The partition row mirrors its head (first non-completed job). Whoever changes a head locks the
  partition row *first*, then recomputes the head in a later statement, so it sees every
  enqueue that committed before it got the lock; an enqueue that comes later finds the new head.
- Enqueue takes the receipt sequence (the job id) under the partition row lock: within a
  partition sequence order is commit order. Times are the database's clock, not the host's.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connection

from .. import telemetry, tracing
from ..conf import checked_settings
from ..errors import (
    Cancelled,
    DuplicateStep,
    InvalidState,
    LeaseLost,
    LedgerError,
    Superseded,
    truncate,
)
from ..models import EventJob
from ..store import EVERY_KEY, KeyFilter, Row, store
from ..store.base import aware
from . import pauses, tenants, waits, wakeups
from .fencing import lease_lost as _lease_lost
from .fencing import why_not_held as _why_not_held
from .idempotency import Idempotent, window_params, window_passed
from .operators import Outcome as Outcome  # the operator actions, offered here too
from .operators import cancel as cancel
from .operators import discard as discard
from .operators import reconcile as reconcile
from .operators import replay as replay
from .operators import requeue as requeue
from .payloads import MAX_JSON_DEPTH, object_deeper_than
from .retry import own_attempts, site_policy

log = logging.getLogger("feishu_inbox.ledger")

# --- results -------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnqueueResult:
    job_id: int
    created: bool
    #: The receipt time the ledger keeps (the duplicate's, when not created); not part of
    #: the result's equality.
    received_at: datetime | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Lease:
    """What a worker holds for a claimed job: the fencing handle of every later call."""

    job_id: int
    worker_id: str
    token: str
    partition_key: str
    attempt: int


@dataclass(frozen=True)
class ClaimedJob:
    lease: Lease
    event_id: str
    event_type: str
    app: str
    payload: dict[str, Any]
    private_message: bool
    lease_until: datetime
    #: A step of this job was recorded before: its memo is worth reading (SPEC §7).
    has_steps: bool = False
    #: When the ledger stored it, and when it was due (this attempt's ``available_at``).
    received_at: datetime | None = None
    due_at: datetime | None = None
    #: The trace context stored with it ("" when its enqueue was not traced).
    trace_parent: str = ""
    #: Whose job it is (SPEC §9j; "" for none).
    tenant: str = ""

    @property
    def id(self) -> int:
        return self.lease.job_id

    @classmethod
    def from_row(cls, row: Row, worker_id: str, token: str) -> ClaimedJob:
        payload = row["payload"]
        return cls(
            lease=Lease(row["id"], worker_id, token, row["partition_key"], row["attempt"]),
            event_id=row["event_id"],
            event_type=row["event_type"],
            app=row["app"],
            payload=json.loads(payload) if isinstance(payload, str | bytes) else payload,
            private_message=bool(row["private_message"]),
            lease_until=aware(row["lease_until"]),
            has_steps=bool(row["has_steps"]),
            received_at=aware(row.get("received_at")),
            trace_parent=row.get("trace_parent") or "",
            due_at=aware(row.get("available_at")),
            tenant=row.get("tenant") or "",
        )


def _claimed(rows: list[Row], worker_id: str, token: str) -> list[ClaimedJob]:
    """The claimed jobs in the claim's own order, highest priority first, then receipt (a
    worker's buffer starts them in this order)."""
    ordered = sorted(rows, key=lambda r: (-(r.get("priority") or 0), r["id"]))
    return [ClaimedJob.from_row(r, worker_id, token) for r in ordered]


# --- enqueue -------------------------------------------------------------------------------


#: The longest value of each text field of a job (its column's length).
_ENQUEUE_LIMITS = dict(event_id=128, event_type=128, dedupe_key=255, partition_key=255, app=64)


def enqueue(
    *,
    event_id: str,
    event_type: str,
    partition_key: str,
    payload: dict[str, Any],
    dedupe_key: str | None = None,
    private_message: bool = False,
    app: str = "default",
    payload_json: str | None = None,
    max_attempts: int | None = None,
    tenant: str | None = None,
) -> EnqueueResult:
    """Store an event once. A second enqueue of the same (app, tenant, dedupe key) changes
    nothing.

    ``tenant``: whose job it is (SPEC §9j, ``ledger/tenants.py``): None takes the enclosing
    ``tenant`` block's (a running handler's: its job's), else none, or ``TenantRequired``
    when the site requires one; "" is explicitly none.

    ``payload_json``, when given, is ``payload`` already serialised (the webhook has the
    decrypted text): it is stored as is instead of serialising ``payload`` again.
    ``max_attempts`` defaults to the event type's handler's retry policy, if it has its own
    (else the site's MAX_ATTEMPTS applies when an attempt ends).
    Every bad argument is named in one refusal.
    """
    job: dict[str, Any] = {
        "event_id": event_id,
        "event_type": event_type,
        "dedupe_key": dedupe_key or event_id,
        "partition_key": partition_key,
        "app": app,
    }
    problems = [
        f"{name} must be a non-empty string of at most {limit} characters (got {job[name]!r:.80})"
        for name, limit in _ENQUEUE_LIMITS.items()
        if not job[name] or not isinstance(job[name], str) or len(job[name]) > limit
    ]
    if not isinstance(payload, dict):
        problems.append(f"payload must be a dict (got {type(payload).__name__})")
    elif payload_json is None and object_deeper_than(payload):  # the webhook checked its text
        problems.append(f"payload must be nested at most {MAX_JSON_DEPTH} levels deep")
    if max_attempts is None and not problems:
        max_attempts = own_attempts(event_type)
    if max_attempts is not None and (type(max_attempts) is not int or max_attempts < 1):
        problems.append(f"max_attempts must be a whole number >= 1 (got {max_attempts!r})")
    if problems:
        raise LedgerError(
            "enqueue was refused: " + "; ".join(problems) + ".",
            fix="Fix the call; nothing was stored.",
        )
    job["tenant"] = tenants.resolve(tenant, what=f"A job of type {event_type!r}")
    if payload_json is None:
        payload_json = EventJob._meta.get_field("payload").get_db_prep_value(
            payload, connection, prepared=False
        )
    stored = store().enqueue(
        {
            **job,
            "private_message": private_message,
            "payload": payload_json,
            "max_attempts": max_attempts,
            "trace_parent": tracing.current_parent(),
        }
    )
    result = EnqueueResult(
        job_id=stored["job_id"],
        created=bool(stored["created"]),
        received_at=aware(stored["received_at"]),
    )
    if result.created:  # an operator's pause holds it from the start
        pauses.hold_new(result.job_id, app=app, event_type=event_type, partition_key=partition_key)
    return result


def enqueue_ranked(*, run_after: datetime | None, priority: int, **job: Any) -> EnqueueResult:
    """``enqueue`` a job due at ``run_after`` (None: now) and ranked by ``priority`` among the
    due heads (a django.tasks task's): one transaction, in the caller's if there is one. A
    plain job (due now, priority 0) is one statement (PostgreSQL: one round trip)."""
    if run_after is None and priority == 0:
        return enqueue(**job)
    with store().transaction():
        stored = enqueue(**job)
        store().defer_and_rank_new_job(stored.job_id, job["partition_key"], run_after, priority)
    return stored


# --- claim and lease expiry ----------------------------------------------------------------


def expire_leases(limit: int = 100) -> int:
    """Recover running jobs whose lease passed (SPEC §3 Lease expiry). Returns how many."""
    expired = store().expire_leases(max_attempts=checked_settings().MAX_ATTEMPTS, limit=limit)
    for row in expired:
        log.warning("job %(id)s lease expired: now %(status)s (partition %(partition_key)s)", row)
    if expired:
        telemetry.LEASE_EXPIRIES.inc(len(expired))
    return len(expired)


#: A busy claimer sweeps for expired leases at most this often; an idle one on every claim.
EXPIRY_SWEEP_INTERVAL = 1.0
_last_sweep = [0.0]


def _maybe_sweep() -> bool:
    """Recover expired leases if this process has not looked for a while; True if it did."""
    if time.monotonic() - _last_sweep[0] < EXPIRY_SWEEP_INTERVAL:
        return False
    _last_sweep[0] = time.monotonic()
    expire_leases()
    waits.time_out_due()
    fire_batches()
    fire_cleanups()
    return True


def fire_cleanups() -> int:
    """Enqueue the cleanups of turns that ended (SPEC §9g), at every sweep; a failure waits
    for the next one (never the claim's)."""
    from . import turns

    try:
        return turns.fire_cleanups()
    except DatabaseError as exc:
        log.warning("enqueueing the turns' cleanups failed (%s); trying again later", exc)
        return 0


def fire_batches() -> int:
    """Fold the batches' member events and fire what is done (SPEC §9f): at once when
    PostgreSQL said a member ended, and at every sweep (SQLite's only way; PostgreSQL's net
    under a lost notice or a crash before a fold committed)."""
    from . import workflows

    wakeups.batches_due.clear()
    folded = 0
    try:
        while (done := workflows.fire_ready()) >= workflows.FOLD_LIMIT:
            folded += done
    except DatabaseError as exc:
        # Never the claim's failure: what was not folded or fired waits for the next look.
        log.warning("folding the batches' events failed (%s); trying again later", exc)
        wakeups.batches_due.set()
        return folded
    return folded + done


def _lease_seconds(lease_seconds: float | None) -> float:
    seconds = checked_settings().LEASE_SECONDS if lease_seconds is None else lease_seconds
    if seconds <= 0:
        raise LedgerError(f"lease_seconds must be > 0 (got {seconds}).")
    return seconds


def claim(
    worker_id: str,
    *,
    lease_seconds: float | None = None,
    limit: int = 1,
    token: str | None = None,
    keys: KeyFilter = EVERY_KEY,
) -> list[ClaimedJob]:
    """Claim up to ``limit`` due partition heads, lowest receipt sequence first (of only the
    partitions ``keys`` takes, if given: some task queues, or all but some).

    Expired leases are recovered first (SPEC §3), and waits whose time came resolved (§9e):
    by every claim that finds nothing, and by a busy claimer at most once per
    ``EXPIRY_SWEEP_INTERVAL`` seconds. ``token`` (default: a new
    one) becomes the jobs' lease token; a claim whose reply was lost finds its jobs again with
    ``claimed_with`` and that token.
    """
    if not worker_id or len(worker_id) > 128:
        raise LedgerError("claim needs a worker_id of 1 to 128 characters.")
    seconds = _lease_seconds(lease_seconds)
    if limit < 1:
        return []
    swept = _maybe_sweep()
    if not swept and wakeups.batches_due.is_set():
        fire_batches()
    token = token or new_token()
    rows = store().claim(worker_id, token, seconds, limit, keys)
    if not rows and not swept and (expire_leases() + waits.time_out_due() + fire_batches()):
        rows = store().claim(worker_id, token, seconds, limit, keys)
    return _claimed(rows, worker_id, token)


def claimed_with(worker_id: str, token: str) -> list[ClaimedJob]:
    """The jobs a claim (or finish-and-claim) with this token took and still runs."""
    return _claimed(store().claimed_with(worker_id, token), worker_id, token)


def new_token() -> str:
    return uuid.uuid4().hex


# --- fenced operations of the lease holder -------------------------------------------------


def renew(lease: Lease, *, lease_seconds: float | None = None) -> datetime:
    """Extend the lease; returns the new deadline (database clock)."""
    deadline = store().renew(lease, _lease_seconds(lease_seconds))
    if deadline is None:
        raise _lease_lost(lease, "renew")
    return deadline


def begin_effect(
    lease: Lease, *, in_flight: int | None = None, idempotent: Idempotent | None = None
) -> int:
    """Persist "an effect is in flight" before it starts (SPEC §3 Effects); returns the job's
    replay generation. ``in_flight``: this attempt's effects in flight once it begins, a value
    so a retry cannot count one twice (None: one more); ``idempotent``: its name and window.
    Raises ``Superseded``, ``Cancelled`` or ``IdempotencyWindowPassed``: nothing started."""
    interrupt = checked_settings().INTERRUPT_PRIVATE
    params = window_params(idempotent)
    gen = store().begin_effect(lease, in_flight=in_flight, interrupt_private=interrupt, **params)
    if gen is not None:
        return gen
    found = store().lease_state(lease.job_id)
    if _why_not_held(lease, found) is not None:
        raise _lease_lost(lease, "start an effect for")
    if found and found["cancel_requested"]:
        raise Cancelled(f"Job {lease.job_id} was cancelled; its effect was not started.")
    if found and found["window_passed"]:
        raise window_passed(lease.job_id, idempotent)
    raise Superseded(
        f"Job {lease.job_id} was superseded by a newer message; its effect was not started."
    )


def end_effect(lease: Lease, *, ok: bool, in_flight: int | None = None) -> None:
    """Record the effect as finished (``ok``) or uncertain (it raised); ``in_flight`` is how
    many of this attempt's effects are still in flight after it."""
    if not store().end_effect(lease, in_flight=in_flight, uncertain=not ok):
        raise _lease_lost(lease, "end an effect of")


def record_step(
    lease: Lease, *, name: str, result: str, took: float, retrying: bool = False
) -> None:
    """Memoize a step's result (JSON text), fenced, as its function returns (SPEC §7).

    Raises ``LeaseLost`` (nothing written) once the lease is gone, and ``DuplicateStep`` when
    the job already has a step of that name, unless ``retrying`` a write whose reply was lost:
    then the step is this attempt's own, and that try landed.
    """
    if store().record_step(lease, name=name, result=result, took=took):
        return
    why = _why_not_held(lease)
    if why is not None:
        raise LeaseLost(f"Cannot record step {name!r} of job {lease.job_id}: {why}.")
    if not (retrying and store().step_attempt(lease.job_id, name) == lease.attempt):
        raise DuplicateStep(f"Job {lease.job_id} already has a step named {name!r}.")


def job_steps(job_id: int) -> dict[str, Any]:
    """The job's memoized step results, by name."""
    return store().job_steps(job_id)


def finish(
    lease: Lease, *, superseded: bool = False, note: str = "", retrying: bool = False
) -> str:
    """The handler returned: ``completed``, or ``unknown`` if an effect is open or uncertain.

    ``superseded`` records that a newer private message replaced this one (SPEC §4); ``note``
    is an error type kept on a completed job (``NoHandler``). ``retrying``: this call repeats
    one whose reply was lost (see ``_ended_before``); so do ``fail`` and ``hand_back``.
    """
    status = store().finish(lease, "Superseded" if superseded else note)
    return status or _ended_before(lease, "finish", retrying)


def _ended_before(lease: Lease, doing: str, retrying: bool) -> str:
    """A fenced end of attempt matched nothing. When ``retrying`` a call whose reply was lost
    (the connection broke) and this lease's end is recorded, that earlier try landed: its
    outcome is the answer, so a retry never applies twice. Otherwise the lease is lost."""
    landed = store().ended_with(lease) if retrying else None
    if landed is None:
        raise _lease_lost(lease, doing)
    return landed


def finish_and_claim(
    lease: Lease,
    *,
    limit: int,
    lease_seconds: float | None = None,
    superseded: bool = False,
    note: str = "",
    token: str | None = None,
    retrying: bool = False,
    keys: KeyFilter = EVERY_KEY,
) -> tuple[str, list[ClaimedJob]]:
    """``finish``, then claim up to ``limit`` next heads for the same worker.

    Both happen in one transaction (on PostgreSQL in one statement): one round trip and one
    commit per job instead of two, for a worker whose slot would otherwise claim again at once.
    Nothing is claimed if the lease was lost (LeaseLost is raised, as by ``finish``).
    ``token`` is the claimed jobs' lease token, ``keys`` their filter (see ``claim``).
    """
    seconds = _lease_seconds(lease_seconds)
    if limit < 1:
        return finish(lease, superseded=superseded, note=note, retrying=retrying), []
    _maybe_sweep()
    token = token or new_token()
    status, rows = store().finish_and_claim(
        lease,
        "Superseded" if superseded else note,
        token=token,
        lease_seconds=seconds,
        limit=limit,
        keys=keys,
    )
    if status is None:  # lost, or a retry of a finish that landed: then find what it claimed
        return _ended_before(lease, "finish", retrying), claimed_with(lease.worker_id, token)
    return status, _claimed(rows, lease.worker_id, token)


def finish_together(
    finishes: list[tuple[Lease, str, str]],
    *,
    lease_seconds: float | None = None,
    keys: KeyFilter = EVERY_KEY,
) -> list[tuple[str | None, list[ClaimedJob]]]:
    """``ledger.finish_and_claim`` for several leases of one worker, in one transaction (on
    PostgreSQL one statement). Each is (lease, error type as ``ledger.finish`` writes it, token
    of its one next claim or "" for none) and is fenced on its own: None for one whose lease
    was lost (nothing of it changed), the others unaffected. ``keys``: the partitions the claims
    take (a worker of some task queues, or of all but some)."""
    _maybe_sweep()
    ended = store().finish_together(finishes, _lease_seconds(lease_seconds), keys)
    return [
        (status, _claimed(rows, lease.worker_id, token))
        for (lease, _, token), (status, rows) in zip(finishes, ended, strict=True)
    ]


def finish_batch(
    worker_id: str,
    finishes: list[tuple[Lease, str]],
    *,
    limit: int,
    token: str,
    lease_seconds: float | None = None,
    keys: KeyFilter = EVERY_KEY,
) -> tuple[list[str | None], list[ClaimedJob]]:
    """A worker's batch: the finishes it gathered (lease, error type as ``ledger.finish``
    writes it), each fenced on its own (None for one whose lease was lost, or whose finish had
    landed already: nothing of it changed), and one claim of up to ``limit`` next heads with
    ``token``, in one transaction (on PostgreSQL one statement). A finished partition's next
    job can be claimed by it, never before the finish. A batch whose reply was lost finds its
    jobs with ``claimed_with`` and that token."""
    if not finishes and limit < 1:
        return [], []
    if not _maybe_sweep() and wakeups.batches_due.is_set():
        fire_batches()
    ended, rows = store().finish_batch(
        worker_id,
        finishes,
        token=token,
        lease_seconds=_lease_seconds(lease_seconds),
        limit=max(limit, 0),
        keys=keys,
    )
    return ended, _claimed(rows, worker_id, token)


def fail(
    lease: Lease,
    *,
    error_type: str,
    message: str = "",
    retry_in: float | None = None,
    retrying: bool = False,
    final: bool = False,
) -> str:
    """The handler raised: ``unknown`` if an effect started (unless all were idempotent and
    it runs again in their window), ``completed`` if cancelled, ``failed`` when its attempts
    are spent (or ``final``), else ``retry_wait`` in ``retry_in`` s (default: backoff)."""
    retry_in = site_policy().delay_before(lease.attempt) if retry_in is None else retry_in
    status = store().fail(
        lease,
        error_type=error_type[:128] or "Error",
        message=truncate(message),
        max_attempts=checked_settings().MAX_ATTEMPTS,  # unless the job carries its own
        retry_in=None if final else retry_in,
    )
    return status or _ended_before(lease, "fail", retrying)


def hand_back(
    lease: Lease,
    *,
    retrying: bool = False,
    delay: float = 0.0,
    error_type: str = "HandedBack",
    message: str = "The worker shut down.",
) -> str:
    """Return a job that started no effect to the queue, due in ``delay`` seconds, without
    spending an attempt (the worker shuts down; a rate limit has no token for it yet)."""
    status = store().hand_back(
        lease, delay=max(delay, 0.0), error_type=error_type, message=truncate(message)
    ) or (store().ended_with(lease) if retrying else None)
    if status is not None:
        return status
    if _why_not_held(lease) is None:  # the lease is fine: what stopped it is the effect
        raise InvalidState(
            f"Cannot hand back job {lease.job_id}: an effect has started.",
            fix="Let the handler finish; if it cannot, its lease expires and the job "
            "becomes unknown for an operator to reconcile.",
        )
    raise _lease_lost(lease, "hand back")


@dataclass(frozen=True)
class Signals:
    """What a worker should tell a running job's handler at its next checkpoint."""

    cancelled: bool = False
    superseded: bool = False


def signals(leases: Iterable[Lease]) -> dict[int, Signals]:
    """For running jobs: cancelled by an operator? superseded by a newer private message?
    One statement for all of a worker's jobs (it asks at least twice a second)."""
    found = store().job_signals(
        [lease.job_id for lease in leases],
        interrupt_private=checked_settings().INTERRUPT_PRIVATE,
    )
    return {
        job_id: Signals(bool(row["cancel_requested"]), bool(row["superseded"]))
        for job_id, row in found.items()
    }
