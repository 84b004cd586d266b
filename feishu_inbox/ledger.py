"""The ledger's state machine (SPEC §3). Every operation is one database transaction.

A refused operation changes nothing and raises a typed error (``errors.py``). Each transition is
an UPDATE whose WHERE states its precondition; a row count of 0 means the caller lost a race.

Concurrency rules (PostgreSQL; SQLite has one writer at a time, so they hold trivially):

- Lock order is always partition row, then job row(s).
- The partition row mirrors its head (first non-completed job). Whoever changes a head locks the
  partition row *first*, then recomputes the head in a later statement, so it sees every
  enqueue that committed before it got the lock; an enqueue that comes later finds the new head.
- Enqueue takes the receipt sequence (the job id) while holding the partition row lock, so within
  a partition sequence order is commit order.
- Times are the database's clock (``now()`` on PostgreSQL), never the worker host's.
"""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection

from .conf import InboxSettings, checked_settings
from .errors import InvalidState, JobNotFound, LeaseLost, LedgerError
from .models import CLAIMABLE, EventJob, Resolution
from .sql import (
    CLAIMABLE_SQL,
    COMPLETED,
    FAILED,
    IDLE,
    QUEUED,
    RETRY,
    RUNNING,
    UNKNOWN,
    UNRESOLVED,
    A,
    Dialect,
    J,
    P,
    aware,
    dialect,
    execute,
    fetchall,
    in_list,
    lock_partitions,
    notify,
    record_attempts,
    resync_heads,
    serialized,
    truncate,
    write_txn,
)
from .stats import (
    Stats,
    database_now,
    next_wakeup,
    seconds_until_wakeup,
    stats,
)

log = logging.getLogger("feishu_inbox.ledger")


# --- results -------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnqueueResult:
    job_id: int
    created: bool


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

    @property
    def id(self) -> int:
        return self.lease.job_id


@dataclass
class Outcome:
    """Per-job result of an operator action over several jobs."""

    done: list[int] = field(default_factory=list)
    refused: dict[int, LedgerError] = field(default_factory=dict)


def backoff_seconds(attempt: int, conf: InboxSettings | None = None) -> float:
    """Delay before retrying after failed attempt number ``attempt`` (1-based)."""
    conf = conf or checked_settings()
    ceiling = min(conf.BACKOFF_CAP, conf.BACKOFF_BASE * 2 ** max(attempt - 1, 0))
    return ceiling * (1 - conf.BACKOFF_JITTER * random.random())


# --- enqueue -------------------------------------------------------------------------------


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
) -> EnqueueResult:
    """Store an event once. A second enqueue of the same (app, dedupe key) changes nothing.

    ``payload_json``, when given, is ``payload`` already serialised (the webhook has the
    decrypted text): it is stored as is instead of serialising ``payload`` again.
    """
    dedupe_key = dedupe_key or event_id
    for name, value, limit in (
        ("event_id", event_id, 128),
        ("event_type", event_type, 128),
        ("dedupe_key", dedupe_key, 255),
        ("partition_key", partition_key, 255),
        ("app", app, 64),
    ):
        if not value or not isinstance(value, str) or len(value) > limit:
            raise LedgerError(
                f"enqueue needs {name} as a non-empty string of at most {limit} characters "
                f"(got {value!r:.80}).",
                fix="Fix the caller; nothing was stored.",
            )
    if not isinstance(payload, dict):
        raise LedgerError(
            f"enqueue needs payload as a dict (got {type(payload).__name__}).",
            fix="Pass the decoded event envelope; nothing was stored.",
        )
    d = dialect()
    if payload_json is None:
        payload_json = EventJob._meta.get_field("payload").get_db_prep_value(
            payload, connection, prepared=False
        )
    if d.pg:  # one round trip: the same steps, server-side (migration 0002)
        job_id, created = fetchall(
            "SELECT * FROM feishu_inbox_enqueue(%s, %s, %s, %s, %s, %s, %s)",
            [app, event_id, event_type, dedupe_key, partition_key, private_message, payload_json],
        )[0]
        return EnqueueResult(job_id=job_id, created=created)
    with write_txn():
        # 1. Lock (or create) the partition row: enqueues into one partition serialise here.
        head_id = fetchall(
            f"""
            INSERT INTO {P} (key, head_id, head_state, head_due_at) VALUES (%s, NULL, %s, NULL)
            ON CONFLICT (key) DO UPDATE SET key = excluded.key
            RETURNING head_id
            """,
            [partition_key, IDLE],
        )[0][0]
        # 2. Take the receipt sequence (the id) under that lock.
        rows = fetchall(
            f"""
            INSERT INTO {J} (app, event_id, event_type, dedupe_key, partition_key,
                private_message, payload, status, attempt, received_at, available_at,
                worker_id, lease_token, effects_in_flight, side_effect_started,
                effect_uncertain, error_type, error_message, resolution)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 0, {d.now}, {d.now},
                '', '', 0, FALSE, FALSE, '', '', '')
            ON CONFLICT (app, dedupe_key) DO NOTHING
            RETURNING id
            """,
            [
                app,
                event_id,
                event_type,
                dedupe_key,
                partition_key,
                private_message,
                payload_json,
                QUEUED,
            ],
        )
        if not rows:
            existing = fetchall(
                f"SELECT id FROM {J} WHERE app = %s AND dedupe_key = %s", [app, dedupe_key]
            )
            return EnqueueResult(job_id=existing[0][0], created=False)
        job_id = rows[0][0]
        # 3. An idle partition gets this job as its head; only then is there new claimable work.
        if head_id is None:
            execute(
                f"UPDATE {P} SET head_id = %s, head_state = %s, "
                f"head_due_at = (SELECT available_at FROM {J} WHERE id = %s) WHERE key = %s",
                [job_id, QUEUED, job_id, partition_key],
            )
    return EnqueueResult(job_id=job_id, created=True)


# --- claim and lease expiry ----------------------------------------------------------------


def expire_leases(limit: int = 100) -> int:
    """Recover running jobs whose lease passed (SPEC §3 Lease expiry). Returns how many."""
    conf = checked_settings()
    d = dialect()
    probe = f"SELECT id, partition_key FROM {J} WHERE status = %s AND lease_until <= {d.now} "
    if not fetchall(probe + "LIMIT 1", [RUNNING]):  # the usual case: one cheap index probe
        return 0
    with write_txn():
        candidates = fetchall(probe + "ORDER BY id LIMIT %s", [RUNNING, limit])
        if not candidates:
            return 0
        # Partitions another transaction holds are left for the next claimer.
        locked = set(lock_partitions(d, (k for _, k in candidates), skip_locked=True))
        ids = [i for i, k in candidates if k in locked]
        if not ids:
            return 0
        rows = fetchall(
            f"""
            UPDATE {J} SET
                status = CASE
                    WHEN side_effect_started OR effects_in_flight > 0 OR effect_uncertain
                        THEN '{UNKNOWN}'
                    WHEN attempt >= %s THEN '{FAILED}'
                    ELSE '{RETRY}' END,
                error_type = CASE
                    WHEN side_effect_started OR effects_in_flight > 0 OR effect_uncertain
                        THEN 'LeaseExpiredAfterSideEffect'
                    ELSE 'LeaseExpired' END,
                error_message = 'The worker ' || worker_id || ' stopped renewing its lease.',
                available_at = {d.now},
                finished_at = {d.now},
                lease_token = '', lease_until = NULL
            WHERE id IN {in_list(ids)} AND status = %s AND lease_until <= {d.now}
            RETURNING id, partition_key, status
            """,
            [conf.MAX_ATTEMPTS, *ids, RUNNING],
        )
        expired = [r[0] for r in rows]
        record_attempts(d, expired)
        resync_heads(r[1] for r in rows)
    for job_id, key, status in rows:
        log.warning("job %s lease expired: now %s (partition %s)", job_id, status, key)
    return len(rows)


#: A busy claimer sweeps for expired leases at most this often; an idle one on every claim.
EXPIRY_SWEEP_INTERVAL = 1.0
_last_sweep = [0.0]


def claim(
    worker_id: str, *, lease_seconds: float | None = None, limit: int = 1
) -> list[ClaimedJob]:
    """Claim up to ``limit`` due partition heads, lowest receipt sequence first.

    Expired leases are recovered first (SPEC §3): by every claim that finds nothing, and by a
    busy claimer at most once per ``EXPIRY_SWEEP_INTERVAL`` seconds.
    """
    if not worker_id or len(worker_id) > 128:
        raise LedgerError("claim needs a worker_id of 1 to 128 characters.")
    conf = checked_settings()
    lease_seconds = conf.LEASE_SECONDS if lease_seconds is None else lease_seconds
    if lease_seconds <= 0:
        raise LedgerError(f"lease_seconds must be > 0 (got {lease_seconds}).")
    if limit < 1:
        return []
    swept = _maybe_sweep()
    jobs = _pick(worker_id, lease_seconds, limit)
    if not jobs and not swept and expire_leases():
        jobs = _pick(worker_id, lease_seconds, limit)
    return jobs


_CLAIMED_COLUMNS = (
    "id, event_id, event_type, app, payload, private_message, attempt, partition_key, lease_until"
)


def _maybe_sweep() -> bool:
    """Recover expired leases if this process has not looked for a while; True if it did."""
    if time.monotonic() - _last_sweep[0] < EXPIRY_SWEEP_INTERVAL:
        return False
    _last_sweep[0] = time.monotonic()
    expire_leases()
    return True


def _claimed_jobs(rows: list[tuple[Any, ...]], worker_id: str, token: str) -> list[ClaimedJob]:
    rows = sorted(rows, key=lambda r: r[0])
    return [
        ClaimedJob(
            lease=Lease(job_id, worker_id, token, key, attempt),
            event_id=event_id,
            event_type=event_type,
            app=app,
            payload=json.loads(payload) if isinstance(payload, str | bytes) else payload,
            private_message=bool(private),
            lease_until=aware(lease_until),
        )
        for job_id, event_id, event_type, app, payload, private, attempt, key, lease_until in rows
    ]


def _pick(worker_id: str, lease_seconds: float, limit: int) -> list[ClaimedJob]:
    d = dialect()
    token = uuid.uuid4().hex
    if d.pg:  # one round trip, plan cached server-side (migration 0002)
        rows = fetchall(
            f"SELECT {_CLAIMED_COLUMNS} FROM feishu_inbox_claim(%s, %s, %s, %s)",
            [worker_id, token, lease_seconds, limit],
        )
    else:  # SQLite: one writer at a time, so no row locks are needed
        with write_txn():
            picked = fetchall(
                f"SELECT key, head_id FROM {P} "
                f"WHERE head_state IN {CLAIMABLE_SQL} AND head_due_at <= {d.now} "
                "ORDER BY head_id LIMIT %s",
                [limit],
            )
            if not picked:
                return []
            keys = [k for k, _ in picked]
            ids = [i for _, i in picked]
            execute(
                f"UPDATE {P} SET head_state = %s WHERE key IN {in_list(keys)}", [RUNNING, *keys]
            )
            rows = fetchall(
                f"UPDATE {J} SET status = '{RUNNING}', attempt = attempt + 1, "
                f"worker_id = %s, lease_token = %s, lease_until = {d.now_plus()}, "
                f"claimed_at = {d.now}, error_type = '', error_message = '' "
                f"WHERE id IN {in_list(ids)} AND status IN {CLAIMABLE_SQL} "
                f"RETURNING {_CLAIMED_COLUMNS}",
                [worker_id, token, lease_seconds, *ids],
            )
            if len(rows) != len(ids):  # the mirror disagrees with the jobs: never expected
                raise LedgerError(
                    f"partition heads {ids} did not match claimable jobs; claim rolled back.",
                    fix="Report this as a bug; `python manage.py inbox stats` shows the ledger.",
                )
    return _claimed_jobs(rows, worker_id, token)


# --- fenced operations of the lease holder -------------------------------------------------


def _fence_sql(d: Dialect) -> str:
    return (
        f"id = %s AND status = '{RUNNING}' AND worker_id = %s AND lease_token = %s "
        f"AND lease_until > {d.now}"
    )


def _fence_params(lease: Lease) -> list[Any]:
    return [lease.job_id, lease.worker_id, lease.token]


def _lease_lost(lease: Lease, doing: str) -> LeaseLost:
    """Explain why a fenced call matched nothing (read outside the failed statement)."""
    d = dialect()
    rows = fetchall(
        f"SELECT status, worker_id, lease_token, lease_until <= {d.now} FROM {J} WHERE id = %s",
        [lease.job_id],
    )
    if not rows:
        return LeaseLost(f"Cannot {doing} job {lease.job_id}: it no longer exists.")
    status, owner, token, expired = rows[0]
    if status != RUNNING:
        why = f"it is {status} now"
    elif owner != lease.worker_id or token != lease.token:
        why = f"worker {owner} holds it now"
    elif expired:
        why = "its lease expired"
    else:
        why = "its lease changed"
    return LeaseLost(f"Cannot {doing} job {lease.job_id} as worker {lease.worker_id}: {why}.")


def renew(lease: Lease, *, lease_seconds: float | None = None) -> datetime:
    """Extend the lease; returns the new deadline (database clock)."""
    conf = checked_settings()
    seconds = conf.LEASE_SECONDS if lease_seconds is None else lease_seconds
    d = dialect()
    with serialized():
        rows = fetchall(
            f"UPDATE {J} SET lease_until = {d.now_plus()} WHERE {_fence_sql(d)} "
            "RETURNING lease_until",
            [seconds, *_fence_params(lease)],
        )
    if not rows:
        raise _lease_lost(lease, "renew")
    return aware(rows[0][0])


def begin_effect(lease: Lease) -> None:
    """Persist "an effect is in flight" before the effect starts (SPEC §3 Effects)."""
    d = dialect()
    with serialized():
        updated = execute(
            f"UPDATE {J} SET effects_in_flight = effects_in_flight + 1, "
            f"side_effect_started = TRUE WHERE {_fence_sql(d)}",
            _fence_params(lease),
        )
    if not updated:
        raise _lease_lost(lease, "start an effect for")


def end_effect(lease: Lease, *, ok: bool) -> None:
    """Record the effect as finished (``ok``) or uncertain (it raised)."""
    d = dialect()
    with serialized():
        updated = execute(
            f"UPDATE {J} SET effects_in_flight = effects_in_flight - 1, "
            f"effect_uncertain = (effect_uncertain OR %s) "
            f"WHERE {_fence_sql(d)} AND effects_in_flight > 0",
            [not ok, *_fence_params(lease)],
        )
    if not updated:
        raise _lease_lost(lease, "end an effect of")


_EFFECT_OPEN = "(effects_in_flight > 0 OR effect_uncertain)"
_EFFECT_ANY = "(side_effect_started OR effects_in_flight > 0 OR effect_uncertain)"


def _end_attempt(lease: Lease, doing: str, set_sql: str, params: list[Any]) -> str:
    """Apply a fenced terminal update of the running head; returns the new status."""
    d = dialect()
    with write_txn():
        lock_partitions(d, [lease.partition_key])
        rows = fetchall(
            f"UPDATE {J} SET {set_sql}, lease_token = '', lease_until = NULL "
            f"WHERE {_fence_sql(d)} RETURNING status",
            [*params, *_fence_params(lease)],
        )
        if not rows:
            raise _lease_lost(lease, doing)
        record_attempts(d, [lease.job_id])
        resync_heads([lease.partition_key])
    return str(rows[0][0])


def _end_attempt_pg(
    lease: Lease,
    doing: str,
    *,
    fail: bool,
    error_type: str,
    message: str = "",
    max_attempts: int = 0,
    retry_in: float = 0.0,
) -> str:
    """The same transition as ``_end_attempt``, in one round trip (migration 0002)."""
    status = fetchall(
        "SELECT feishu_inbox_end_attempt(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        [
            lease.job_id,
            lease.worker_id,
            lease.token,
            lease.partition_key,
            fail,
            error_type,
            message,
            max_attempts,
            retry_in,
        ],
    )[0][0]
    if status is None:
        raise _lease_lost(lease, doing)
    return str(status)


def finish(lease: Lease, *, superseded: bool = False, note: str = "") -> str:
    """The handler returned: ``completed``, or ``unknown`` if an effect is open or uncertain.

    ``superseded`` records that a newer private message replaced this one (SPEC §4); ``note``
    is an error type kept on a completed job (``NoHandler``).
    """
    d = dialect()
    kept = "Superseded" if superseded else note
    if d.pg:
        return _end_attempt_pg(lease, "finish", fail=False, error_type=kept)
    return _end_attempt(
        lease,
        "finish",
        f"""
        status = CASE WHEN {_EFFECT_OPEN} THEN '{UNKNOWN}' ELSE '{COMPLETED}' END,
        error_type = CASE WHEN {_EFFECT_OPEN} THEN 'UncertainEffect' ELSE %s END,
        error_message = CASE WHEN {_EFFECT_OPEN}
            THEN 'An effect was in flight or raised when the handler ended; check whether it '
                 || 'happened, then reconcile.'
            ELSE '' END,
        finished_at = {d.now}
        """,
        [kept],
    )


def finish_and_claim(
    lease: Lease,
    *,
    limit: int,
    lease_seconds: float | None = None,
    superseded: bool = False,
    note: str = "",
) -> tuple[str, list[ClaimedJob]]:
    """``finish``, then claim up to ``limit`` next heads for the same worker.

    On PostgreSQL both happen in one statement: one round trip and one commit per job instead
    of two, for a worker whose slot would otherwise claim again at once. Nothing is claimed if
    the lease was lost (LeaseLost is raised, as by ``finish``).
    """
    d = dialect()
    if not d.pg or limit < 1:
        status = finish(lease, superseded=superseded, note=note)
        jobs = claim(lease.worker_id, lease_seconds=lease_seconds, limit=limit) if limit else []
        return status, jobs
    conf = checked_settings()
    seconds = conf.LEASE_SECONDS if lease_seconds is None else lease_seconds
    _maybe_sweep()
    token = uuid.uuid4().hex
    columns = ", ".join(f"c.{c.strip()}" for c in _CLAIMED_COLUMNS.split(","))
    rows = fetchall(
        f"""
        SELECT d.status, {columns}
        FROM (SELECT feishu_inbox_end_attempt(%s, %s, %s, %s, FALSE, %s, '', 0, 0) AS status) d
        LEFT JOIN LATERAL feishu_inbox_claim(
            %s, %s, %s, CASE WHEN d.status IS NULL THEN 0 ELSE %s END
        ) c ON TRUE
        """,
        [
            lease.job_id,
            lease.worker_id,
            lease.token,
            lease.partition_key,
            "Superseded" if superseded else note,
            lease.worker_id,
            token,
            seconds,
            limit,
        ],
    )
    status = rows[0][0]
    if status is None:
        raise _lease_lost(lease, "finish")
    claimed = [r[1:] for r in rows if r[1] is not None]
    return str(status), _claimed_jobs(claimed, lease.worker_id, token)


def fail(lease: Lease, *, error_type: str, message: str = "", retry_in: float | None = None) -> str:
    """The handler raised: ``unknown`` if any effect started, else retry or ``failed``."""
    conf = checked_settings()
    d = dialect()
    delay = backoff_seconds(lease.attempt, conf) if retry_in is None else retry_in
    error_type, message = error_type[:128] or "Error", truncate(message)
    if d.pg:
        return _end_attempt_pg(
            lease,
            "fail",
            fail=True,
            error_type=error_type,
            message=message,
            max_attempts=conf.MAX_ATTEMPTS,
            retry_in=delay,
        )
    return _end_attempt(
        lease,
        "fail",
        f"""
        status = CASE WHEN {_EFFECT_ANY} THEN '{UNKNOWN}'
                      WHEN attempt >= %s THEN '{FAILED}' ELSE '{RETRY}' END,
        available_at = CASE WHEN {_EFFECT_ANY} OR attempt >= %s THEN available_at
                            ELSE {d.now_plus()} END,
        finished_at = {d.now},
        error_type = %s, error_message = %s
        """,
        [
            conf.MAX_ATTEMPTS,
            conf.MAX_ATTEMPTS,
            delay,
            error_type[:128] or "Error",
            truncate(message),
        ],
    )


def hand_back(lease: Lease) -> str:
    """Return a job that started no effect to the queue at once, without spending an attempt."""
    d = dialect()
    with write_txn():
        lock_partitions(d, [lease.partition_key])
        rows = fetchall(
            f"""
            UPDATE {J} SET
                status = CASE WHEN attempt > 1 THEN '{RETRY}' ELSE '{QUEUED}' END,
                attempt = attempt - 1, available_at = {d.now},
                error_type = 'HandedBack', error_message = 'The worker shut down.',
                lease_token = '', lease_until = NULL
            WHERE {_fence_sql(d)} AND NOT {_EFFECT_ANY}
            RETURNING status
            """,
            _fence_params(lease),
        )
        if not rows:
            held = fetchall(f"SELECT 1 FROM {J} WHERE {_fence_sql(d)}", _fence_params(lease))
            if held:  # the lease is fine: what stopped it is the effect
                raise InvalidState(
                    f"Cannot hand back job {lease.job_id}: an effect has started.",
                    fix="Let the handler finish; if it cannot, its lease expires and the job "
                    "becomes unknown for an operator to reconcile.",
                )
            raise _lease_lost(lease, "hand back")
        record_attempts(d, [lease.job_id], number_offset=1)
        resync_heads([lease.partition_key])
        notify(d, lease.partition_key)
    return str(rows[0][0])


def should_interrupt(lease: Lease, *, private_message: bool) -> bool:
    """True when this private job should stop at its next checkpoint (SPEC §4)."""
    if not private_message or not checked_settings().INTERRUPT_PRIVATE:
        return False
    rows = fetchall(
        f"SELECT private_message FROM {J} WHERE partition_key = %s AND id > %s "
        f"AND {UNRESOLVED} ORDER BY partition_key, id LIMIT 1",
        [lease.partition_key, lease.job_id],
    )
    return bool(rows and rows[0][0])


# --- operator actions ----------------------------------------------------------------------


def _operator_action(
    job_ids: Iterable[int],
    *,
    doing: str,
    from_status: str,
    set_sql: str,
    resolution: str,
    hint: str,
) -> Outcome:
    """Apply one guarded transition per job, each in its own transaction."""
    d = dialect()
    outcome = Outcome()
    for job_id in dict.fromkeys(job_ids):
        try:
            with write_txn():
                rows = fetchall(f"SELECT partition_key FROM {J} WHERE id = %s", [job_id])
                if not rows:
                    raise JobNotFound(f"Cannot {doing} job {job_id}: there is no such job.")
                lock_partitions(d, [rows[0][0]])
                changed = fetchall(
                    f"UPDATE {J} SET {set_sql}, resolution = %s "
                    "WHERE id = %s AND status = %s RETURNING partition_key",
                    [resolution, job_id, from_status],
                )
                if not changed:
                    status = fetchall(f"SELECT status FROM {J} WHERE id = %s", [job_id])[0][0]
                    raise InvalidState(
                        f"Cannot {doing} job {job_id}: it is {status}, not {from_status}.",
                        fix=hint,
                    )
                resync_heads([changed[0][0]])
                notify(d, changed[0][0])
            outcome.done.append(job_id)
        except LedgerError as exc:
            outcome.refused[job_id] = exc
    return outcome


def requeue(job_ids: Iterable[int]) -> Outcome:
    """``failed`` → ``queued``, attempt 0, due now."""
    d = dialect()
    return _operator_action(
        job_ids,
        doing="requeue",
        from_status=FAILED,
        set_sql=f"status = '{QUEUED}', attempt = 0, available_at = {d.now}, finished_at = NULL",
        resolution=Resolution.REQUEUED,
        hint="Only failed jobs can be requeued; unknown jobs need reconcile.",
    )


def reconcile(job_ids: Iterable[int], *, applied: bool) -> Outcome:
    """``unknown`` → ``completed`` (the effect happened) or ``queued`` (it did not: run again)."""
    d = dialect()
    if applied:
        set_sql = f"status = '{COMPLETED}', finished_at = {d.now}"
        resolution = Resolution.APPLIED
    else:
        set_sql = (
            f"status = '{QUEUED}', attempt = 0, available_at = {d.now}, finished_at = NULL, "
            "effects_in_flight = 0, side_effect_started = FALSE, effect_uncertain = FALSE"
        )
        resolution = Resolution.NOT_APPLIED
    return _operator_action(
        job_ids,
        doing="reconcile",
        from_status=UNKNOWN,
        set_sql=set_sql,
        resolution=resolution,
        hint="Only unknown jobs are reconciled; failed jobs are requeued or discarded.",
    )


def discard(job_ids: Iterable[int]) -> Outcome:
    """``failed`` → ``completed`` (resolution recorded), unblocking its partition."""
    d = dialect()
    return _operator_action(
        job_ids,
        doing="discard",
        from_status=FAILED,
        set_sql=f"status = '{COMPLETED}', finished_at = {d.now}",
        resolution=Resolution.DISCARDED,
        hint="Only failed jobs can be discarded; unknown jobs need reconcile.",
    )


# --- retention -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PurgeResult:
    completed_deleted: int
    unknown_expired: int
    #: Idle partition rows (one per chat) with no job left in the ledger.
    partitions_deleted: int = 0


def purge(*, max_batches: int | None = None) -> PurgeResult:
    """Delete completed jobs past retention, one small transaction per batch."""
    conf = checked_settings()
    d = dialect()
    expired_unknown = 0
    if conf.UNKNOWN_RETENTION is not None:
        old = [
            r[0]
            for r in fetchall(
                f"SELECT id FROM {J} WHERE status = %s AND finished_at < {d.now_plus()}",
                [UNKNOWN, -conf.UNKNOWN_RETENTION.total_seconds()],
            )
        ]
        expired_unknown = len(
            _operator_action(
                old,
                doing="expire",
                from_status=UNKNOWN,
                set_sql=f"status = '{COMPLETED}', error_type = 'UnknownExpired'",
                resolution=Resolution.NONE,
                hint="",
            ).done
        )
    batch = conf.PURGE_BATCH_SIZE
    cutoff = -conf.COMPLETED_RETENTION.total_seconds()

    def completed_batch() -> int:
        ids = [
            r[0]
            for r in fetchall(
                f"SELECT id FROM {J} WHERE status = %s AND finished_at < {d.now_plus()} "
                f"ORDER BY finished_at LIMIT %s{d.skip_locked}",
                [COMPLETED, cutoff, batch],
            )
        ]
        if ids:
            execute(f"DELETE FROM {A} WHERE job_id IN {in_list(ids)}", ids)
            execute(f"DELETE FROM {J} WHERE id IN {in_list(ids)}", ids)
        return len(ids)

    def idle_partitions_batch() -> int:
        # Chats with no job left: a row an enqueue holds is skipped (SKIP LOCKED), and an
        # enqueue after the delete simply creates the row again.
        keys = [
            r[0]
            for r in fetchall(
                f"SELECT p.key FROM {P} p WHERE p.head_state = %s AND NOT EXISTS "
                f"(SELECT 1 FROM {J} j WHERE j.partition_key = p.key) "
                f"LIMIT %s{d.skip_locked}",
                [IDLE, batch],
            )
        ]
        if keys:
            execute(
                f"DELETE FROM {P} WHERE head_state = %s AND key IN {in_list(keys)}",
                [IDLE, *keys],
            )
        return len(keys)

    return PurgeResult(
        completed_deleted=_in_batches(completed_batch, batch, max_batches),
        unknown_expired=expired_unknown,
        partitions_deleted=_in_batches(idle_partitions_batch, batch, max_batches),
    )


def _in_batches(step: Callable[[], int], batch: int, max_batches: int | None) -> int:
    """Run ``step`` (one transaction each) until it handles less than a full batch."""
    total = batches = 0
    while max_batches is None or batches < max_batches:
        with write_txn():
            done = step()
        total += done
        batches += 1
        if done < batch:
            break
    return total


def new_worker_id() -> str:
    """hostname:pid:random, unique per worker process start."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


__all__ = [
    "CLAIMABLE",
    "ClaimedJob",
    "EnqueueResult",
    "Lease",
    "Outcome",
    "PurgeResult",
    "Stats",
    "backoff_seconds",
    "begin_effect",
    "claim",
    "database_now",
    "discard",
    "end_effect",
    "enqueue",
    "expire_leases",
    "fail",
    "finish",
    "finish_and_claim",
    "hand_back",
    "new_worker_id",
    "next_wakeup",
    "purge",
    "reconcile",
    "renew",
    "requeue",
    "seconds_until_wakeup",
    "should_interrupt",
    "stats",
]
