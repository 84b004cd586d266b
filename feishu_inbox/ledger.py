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
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction

from .conf import InboxSettings, checked_settings
from .errors import InvalidState, JobNotFound, LeaseLost, LedgerError
from .models import (
    BLOCKING,
    CLAIMABLE,
    Attempt,
    EventJob,
    Partition,
    PartitionState,
    Resolution,
    Status,
)

log = logging.getLogger("feishu_inbox.ledger")

J = EventJob._meta.db_table
P = Partition._meta.db_table
A = Attempt._meta.db_table
NOTIFY_CHANNEL = "feishu_inbox"

_QUEUED = Status.QUEUED.value
_RUNNING = Status.RUNNING.value
_RETRY = Status.RETRY_WAIT.value
_COMPLETED = Status.COMPLETED.value
_FAILED = Status.FAILED.value
_UNKNOWN = Status.UNKNOWN.value
_IDLE = PartitionState.IDLE.value
_CLAIMABLE_SQL = f"('{_QUEUED}', '{_RETRY}')"
# Written exactly as the partial index's predicate: SQLite uses a partial index only when the
# query's WHERE names its condition in the same form.
_UNRESOLVED = f"NOT (status = '{_COMPLETED}')"
_ERROR_MESSAGE_LIMIT = 4000


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


# --- SQL dialect -----------------------------------------------------------------------------


def _sqlite_now(offset_seconds: float | None) -> str:
    when = datetime.now(UTC) + timedelta(seconds=offset_seconds or 0)
    return when.replace(tzinfo=None).isoformat(" ", timespec="microseconds")


class _Dialect:
    """The few SQL fragments that differ between PostgreSQL and SQLite."""

    def __init__(self, pg: bool) -> None:
        self.pg = pg
        # ``now()`` is the transaction's start on PostgreSQL: one clock for every host.
        self.now = "now()" if pg else "feishu_inbox_now(0)"
        self.lock = " FOR UPDATE" if pg else ""
        self.skip_locked = " FOR UPDATE SKIP LOCKED" if pg else ""

    def now_plus(self) -> str:
        """``now + %s seconds`` (one parameter)."""
        return "(now() + %s * interval '1 second')" if self.pg else "feishu_inbox_now(%s)"


_PG = _Dialect(pg=True)
_SQLITE = _Dialect(pg=False)


def _dialect() -> _Dialect:
    if connection.vendor == "postgresql":
        return _PG
    connection.ensure_connection()
    raw = connection.connection
    if connection.__dict__.get("_feishu_inbox_raw") is not raw:
        raw.create_function("feishu_inbox_now", 1, _sqlite_now)
        connection.__dict__["_feishu_inbox_raw"] = raw
    return _SQLITE


#: SQLite has one writer at a time, and its busy handler sleeps in growing steps (up to 100 ms)
#: instead of waking when the lock frees. Writers of one process queue on this lock instead,
#: which wakes the next at once; only writers of other processes meet the busy handler.
_sqlite_writer = threading.RLock()


@contextmanager
def _serialized() -> Iterator[None]:
    if connection.vendor == "sqlite":
        with _sqlite_writer:
            yield
    else:
        yield


@contextmanager
def _write_txn() -> Iterator[None]:
    """One ledger transaction (IMMEDIATE on SQLite, per the database OPTIONS)."""
    with _serialized(), transaction.atomic():
        yield


def _in(values: Sequence[Any]) -> str:
    return "(" + ", ".join(["%s"] * len(values)) + ")"


def _fetchall(sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return list(cur.fetchall())


def _execute(sql: str, params: Sequence[Any] = ()) -> int:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.rowcount


def _lock_partitions(d: _Dialect, keys: Iterable[str], *, skip_locked: bool = False) -> list[str]:
    """Lock partition rows (PostgreSQL) in key order; returns the keys locked."""
    keys = sorted(set(keys))
    if not keys or not d.pg:
        return keys
    suffix = d.skip_locked if skip_locked else d.lock
    rows = _fetchall(f"SELECT key FROM {P} WHERE key IN {_in(keys)} ORDER BY key{suffix}", keys)
    return [r[0] for r in rows]


def _resync_heads(keys: Iterable[str]) -> None:
    """Point each partition at its first non-completed job (call with the rows locked).

    The key is bound as a parameter (not correlated) and the order matches the partial index
    ``(partition_key, id)``: a correlated subquery gets a generic plan that walks the primary
    key through the whole backlog.
    """
    head = f"FROM {J} WHERE partition_key = %s AND {_UNRESOLVED} ORDER BY partition_key, id LIMIT 1"
    for key in sorted(set(keys)):
        _execute(
            f"""
            UPDATE {P} SET
                head_id = (SELECT id {head}),
                head_state = COALESCE((SELECT status {head}), '{_IDLE}'),
                head_due_at = (SELECT available_at {head})
            WHERE key = %s
            """,
            [key, key, key, key],
        )


def _notify(d: _Dialect, key: str) -> None:
    """Wake idle workers (PostgreSQL; delivered at commit): a head became claimable."""
    if d.pg:
        _execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, key[:200]])


def _record_attempts(d: _Dialect, job_ids: Sequence[int], number_offset: int = 0) -> None:
    """History row for each job's attempt that just ended (run after the job's update)."""
    if not job_ids:
        return
    _execute(
        f"""
        INSERT INTO {A} (job_id, number, worker_id, started_at, ended_at, outcome,
                         error_type, error_message)
        SELECT id, attempt + %s, worker_id, COALESCE(claimed_at, {d.now}), {d.now}, status,
               error_type, error_message
        FROM {J} WHERE id IN {_in(job_ids)}
        """,
        [number_offset, *job_ids],
    )


def _aware(value: Any) -> Any:
    """A timestamp read by raw SQL as an aware datetime (SQLite gives text or naive UTC)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime) and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


def _truncate(message: str) -> str:
    if len(message) <= _ERROR_MESSAGE_LIMIT:
        return message
    return message[: _ERROR_MESSAGE_LIMIT - 1] + "…"


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
    d = _dialect()
    if payload_json is None:
        payload_json = EventJob._meta.get_field("payload").get_db_prep_value(
            payload, connection, prepared=False
        )
    if d.pg:  # one round trip: the same steps, server-side (migration 0002)
        job_id, created = _fetchall(
            "SELECT * FROM feishu_inbox_enqueue(%s, %s, %s, %s, %s, %s, %s)",
            [app, event_id, event_type, dedupe_key, partition_key, private_message, payload_json],
        )[0]
        return EnqueueResult(job_id=job_id, created=created)
    with _write_txn():
        # 1. Lock (or create) the partition row: enqueues into one partition serialise here.
        head_id = _fetchall(
            f"""
            INSERT INTO {P} (key, head_id, head_state, head_due_at) VALUES (%s, NULL, %s, NULL)
            ON CONFLICT (key) DO UPDATE SET key = excluded.key
            RETURNING head_id
            """,
            [partition_key, _IDLE],
        )[0][0]
        # 2. Take the receipt sequence (the id) under that lock.
        rows = _fetchall(
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
                _QUEUED,
            ],
        )
        if not rows:
            existing = _fetchall(
                f"SELECT id FROM {J} WHERE app = %s AND dedupe_key = %s", [app, dedupe_key]
            )
            return EnqueueResult(job_id=existing[0][0], created=False)
        job_id = rows[0][0]
        # 3. An idle partition gets this job as its head; only then is there new claimable work.
        if head_id is None:
            _execute(
                f"UPDATE {P} SET head_id = %s, head_state = %s, "
                f"head_due_at = (SELECT available_at FROM {J} WHERE id = %s) WHERE key = %s",
                [job_id, _QUEUED, job_id, partition_key],
            )
    return EnqueueResult(job_id=job_id, created=True)


# --- claim and lease expiry ----------------------------------------------------------------


def expire_leases(limit: int = 100) -> int:
    """Recover running jobs whose lease passed (SPEC §3 Lease expiry). Returns how many."""
    conf = checked_settings()
    d = _dialect()
    probe = f"SELECT id, partition_key FROM {J} WHERE status = %s AND lease_until <= {d.now} "
    if not _fetchall(probe + "LIMIT 1", [_RUNNING]):  # the usual case: one cheap index probe
        return 0
    with _write_txn():
        candidates = _fetchall(probe + "ORDER BY id LIMIT %s", [_RUNNING, limit])
        if not candidates:
            return 0
        # Partitions another transaction holds are left for the next claimer.
        locked = set(_lock_partitions(d, (k for _, k in candidates), skip_locked=True))
        ids = [i for i, k in candidates if k in locked]
        if not ids:
            return 0
        rows = _fetchall(
            f"""
            UPDATE {J} SET
                status = CASE
                    WHEN side_effect_started OR effects_in_flight > 0 OR effect_uncertain
                        THEN '{_UNKNOWN}'
                    WHEN attempt >= %s THEN '{_FAILED}'
                    ELSE '{_RETRY}' END,
                error_type = CASE
                    WHEN side_effect_started OR effects_in_flight > 0 OR effect_uncertain
                        THEN 'LeaseExpiredAfterSideEffect'
                    ELSE 'LeaseExpired' END,
                error_message = 'The worker ' || worker_id || ' stopped renewing its lease.',
                available_at = {d.now},
                finished_at = {d.now},
                lease_token = '', lease_until = NULL
            WHERE id IN {_in(ids)} AND status = %s AND lease_until <= {d.now}
            RETURNING id, partition_key, status
            """,
            [conf.MAX_ATTEMPTS, *ids, _RUNNING],
        )
        expired = [r[0] for r in rows]
        _record_attempts(d, expired)
        _resync_heads(r[1] for r in rows)
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
            lease_until=_aware(lease_until),
        )
        for job_id, event_id, event_type, app, payload, private, attempt, key, lease_until in rows
    ]


def _pick(worker_id: str, lease_seconds: float, limit: int) -> list[ClaimedJob]:
    d = _dialect()
    token = uuid.uuid4().hex
    if d.pg:  # one round trip, plan cached server-side (migration 0002)
        rows = _fetchall(
            f"SELECT {_CLAIMED_COLUMNS} FROM feishu_inbox_claim(%s, %s, %s, %s)",
            [worker_id, token, lease_seconds, limit],
        )
    else:  # SQLite: one writer at a time, so no row locks are needed
        with _write_txn():
            picked = _fetchall(
                f"SELECT key, head_id FROM {P} "
                f"WHERE head_state IN {_CLAIMABLE_SQL} AND head_due_at <= {d.now} "
                "ORDER BY head_id LIMIT %s",
                [limit],
            )
            if not picked:
                return []
            keys = [k for k, _ in picked]
            ids = [i for _, i in picked]
            _execute(f"UPDATE {P} SET head_state = %s WHERE key IN {_in(keys)}", [_RUNNING, *keys])
            rows = _fetchall(
                f"UPDATE {J} SET status = '{_RUNNING}', attempt = attempt + 1, "
                f"worker_id = %s, lease_token = %s, lease_until = {d.now_plus()}, "
                f"claimed_at = {d.now}, error_type = '', error_message = '' "
                f"WHERE id IN {_in(ids)} AND status IN {_CLAIMABLE_SQL} "
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


def _fence_sql(d: _Dialect) -> str:
    return (
        f"id = %s AND status = '{_RUNNING}' AND worker_id = %s AND lease_token = %s "
        f"AND lease_until > {d.now}"
    )


def _fence_params(lease: Lease) -> list[Any]:
    return [lease.job_id, lease.worker_id, lease.token]


def _lease_lost(lease: Lease, doing: str) -> LeaseLost:
    """Explain why a fenced call matched nothing (read outside the failed statement)."""
    d = _dialect()
    rows = _fetchall(
        f"SELECT status, worker_id, lease_token, lease_until <= {d.now} FROM {J} WHERE id = %s",
        [lease.job_id],
    )
    if not rows:
        return LeaseLost(f"Cannot {doing} job {lease.job_id}: it no longer exists.")
    status, owner, token, expired = rows[0]
    if status != _RUNNING:
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
    d = _dialect()
    with _serialized():
        rows = _fetchall(
            f"UPDATE {J} SET lease_until = {d.now_plus()} WHERE {_fence_sql(d)} "
            "RETURNING lease_until",
            [seconds, *_fence_params(lease)],
        )
    if not rows:
        raise _lease_lost(lease, "renew")
    return _aware(rows[0][0])


def begin_effect(lease: Lease) -> None:
    """Persist "an effect is in flight" before the effect starts (SPEC §3 Effects)."""
    d = _dialect()
    with _serialized():
        updated = _execute(
            f"UPDATE {J} SET effects_in_flight = effects_in_flight + 1, "
            f"side_effect_started = TRUE WHERE {_fence_sql(d)}",
            _fence_params(lease),
        )
    if not updated:
        raise _lease_lost(lease, "start an effect for")


def end_effect(lease: Lease, *, ok: bool) -> None:
    """Record the effect as finished (``ok``) or uncertain (it raised)."""
    d = _dialect()
    with _serialized():
        updated = _execute(
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
    d = _dialect()
    with _write_txn():
        _lock_partitions(d, [lease.partition_key])
        rows = _fetchall(
            f"UPDATE {J} SET {set_sql}, lease_token = '', lease_until = NULL "
            f"WHERE {_fence_sql(d)} RETURNING status",
            [*params, *_fence_params(lease)],
        )
        if not rows:
            raise _lease_lost(lease, doing)
        _record_attempts(d, [lease.job_id])
        _resync_heads([lease.partition_key])
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
    status = _fetchall(
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
    d = _dialect()
    kept = "Superseded" if superseded else note
    if d.pg:
        return _end_attempt_pg(lease, "finish", fail=False, error_type=kept)
    return _end_attempt(
        lease,
        "finish",
        f"""
        status = CASE WHEN {_EFFECT_OPEN} THEN '{_UNKNOWN}' ELSE '{_COMPLETED}' END,
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
    d = _dialect()
    if not d.pg or limit < 1:
        status = finish(lease, superseded=superseded, note=note)
        jobs = claim(lease.worker_id, lease_seconds=lease_seconds, limit=limit) if limit else []
        return status, jobs
    conf = checked_settings()
    seconds = conf.LEASE_SECONDS if lease_seconds is None else lease_seconds
    _maybe_sweep()
    token = uuid.uuid4().hex
    columns = ", ".join(f"c.{c.strip()}" for c in _CLAIMED_COLUMNS.split(","))
    rows = _fetchall(
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
    d = _dialect()
    delay = backoff_seconds(lease.attempt, conf) if retry_in is None else retry_in
    error_type, message = error_type[:128] or "Error", _truncate(message)
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
        status = CASE WHEN {_EFFECT_ANY} THEN '{_UNKNOWN}'
                      WHEN attempt >= %s THEN '{_FAILED}' ELSE '{_RETRY}' END,
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
            _truncate(message),
        ],
    )


def hand_back(lease: Lease) -> str:
    """Return a job that started no effect to the queue at once, without spending an attempt."""
    d = _dialect()
    with _write_txn():
        _lock_partitions(d, [lease.partition_key])
        rows = _fetchall(
            f"""
            UPDATE {J} SET
                status = CASE WHEN attempt > 1 THEN '{_RETRY}' ELSE '{_QUEUED}' END,
                attempt = attempt - 1, available_at = {d.now},
                error_type = 'HandedBack', error_message = 'The worker shut down.',
                lease_token = '', lease_until = NULL
            WHERE {_fence_sql(d)} AND NOT {_EFFECT_ANY}
            RETURNING status
            """,
            _fence_params(lease),
        )
        if not rows:
            held = _fetchall(f"SELECT 1 FROM {J} WHERE {_fence_sql(d)}", _fence_params(lease))
            if held:  # the lease is fine: what stopped it is the effect
                raise InvalidState(
                    f"Cannot hand back job {lease.job_id}: an effect has started.",
                    fix="Let the handler finish; if it cannot, its lease expires and the job "
                    "becomes unknown for an operator to reconcile.",
                )
            raise _lease_lost(lease, "hand back")
        _record_attempts(d, [lease.job_id], number_offset=1)
        _resync_heads([lease.partition_key])
        _notify(d, lease.partition_key)
    return str(rows[0][0])


def should_interrupt(lease: Lease, *, private_message: bool) -> bool:
    """True when this private job should stop at its next checkpoint (SPEC §4)."""
    if not private_message or not checked_settings().INTERRUPT_PRIVATE:
        return False
    rows = _fetchall(
        f"SELECT private_message FROM {J} WHERE partition_key = %s AND id > %s "
        f"AND {_UNRESOLVED} ORDER BY partition_key, id LIMIT 1",
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
    d = _dialect()
    outcome = Outcome()
    for job_id in dict.fromkeys(job_ids):
        try:
            with _write_txn():
                rows = _fetchall(f"SELECT partition_key FROM {J} WHERE id = %s", [job_id])
                if not rows:
                    raise JobNotFound(f"Cannot {doing} job {job_id}: there is no such job.")
                _lock_partitions(d, [rows[0][0]])
                changed = _fetchall(
                    f"UPDATE {J} SET {set_sql}, resolution = %s "
                    "WHERE id = %s AND status = %s RETURNING partition_key",
                    [resolution, job_id, from_status],
                )
                if not changed:
                    status = _fetchall(f"SELECT status FROM {J} WHERE id = %s", [job_id])[0][0]
                    raise InvalidState(
                        f"Cannot {doing} job {job_id}: it is {status}, not {from_status}.",
                        fix=hint,
                    )
                _resync_heads([changed[0][0]])
                _notify(d, changed[0][0])
            outcome.done.append(job_id)
        except LedgerError as exc:
            outcome.refused[job_id] = exc
    return outcome


def requeue(job_ids: Iterable[int]) -> Outcome:
    """``failed`` → ``queued``, attempt 0, due now."""
    d = _dialect()
    return _operator_action(
        job_ids,
        doing="requeue",
        from_status=_FAILED,
        set_sql=f"status = '{_QUEUED}', attempt = 0, available_at = {d.now}, finished_at = NULL",
        resolution=Resolution.REQUEUED,
        hint="Only failed jobs can be requeued; unknown jobs need reconcile.",
    )


def reconcile(job_ids: Iterable[int], *, applied: bool) -> Outcome:
    """``unknown`` → ``completed`` (the effect happened) or ``queued`` (it did not: run again)."""
    d = _dialect()
    if applied:
        set_sql = f"status = '{_COMPLETED}', finished_at = {d.now}"
        resolution = Resolution.APPLIED
    else:
        set_sql = (
            f"status = '{_QUEUED}', attempt = 0, available_at = {d.now}, finished_at = NULL, "
            "effects_in_flight = 0, side_effect_started = FALSE, effect_uncertain = FALSE"
        )
        resolution = Resolution.NOT_APPLIED
    return _operator_action(
        job_ids,
        doing="reconcile",
        from_status=_UNKNOWN,
        set_sql=set_sql,
        resolution=resolution,
        hint="Only unknown jobs are reconciled; failed jobs are requeued or discarded.",
    )


def discard(job_ids: Iterable[int]) -> Outcome:
    """``failed`` → ``completed`` (resolution recorded), unblocking its partition."""
    d = _dialect()
    return _operator_action(
        job_ids,
        doing="discard",
        from_status=_FAILED,
        set_sql=f"status = '{_COMPLETED}', finished_at = {d.now}",
        resolution=Resolution.DISCARDED,
        hint="Only failed jobs can be discarded; unknown jobs need reconcile.",
    )


# --- retention -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PurgeResult:
    completed_deleted: int
    unknown_expired: int


def purge(*, max_batches: int | None = None) -> PurgeResult:
    """Delete completed jobs past retention, one small transaction per batch."""
    conf = checked_settings()
    d = _dialect()
    expired_unknown = 0
    if conf.UNKNOWN_RETENTION is not None:
        old = [
            r[0]
            for r in _fetchall(
                f"SELECT id FROM {J} WHERE status = %s AND finished_at < {d.now_plus()}",
                [_UNKNOWN, -conf.UNKNOWN_RETENTION.total_seconds()],
            )
        ]
        expired_unknown = len(
            _operator_action(
                old,
                doing="expire",
                from_status=_UNKNOWN,
                set_sql=f"status = '{_COMPLETED}', error_type = 'UnknownExpired'",
                resolution=Resolution.NONE,
                hint="",
            ).done
        )
    deleted = 0
    batches = 0
    cutoff = -conf.COMPLETED_RETENTION.total_seconds()
    while max_batches is None or batches < max_batches:
        with _write_txn():
            ids = [
                r[0]
                for r in _fetchall(
                    f"SELECT id FROM {J} WHERE status = %s AND finished_at < {d.now_plus()} "
                    f"ORDER BY finished_at LIMIT %s{d.skip_locked}",
                    [_COMPLETED, cutoff, conf.PURGE_BATCH_SIZE],
                )
            ]
            if ids:
                _execute(f"DELETE FROM {A} WHERE job_id IN {_in(ids)}", ids)
                _execute(f"DELETE FROM {J} WHERE id IN {_in(ids)}", ids)
        deleted += len(ids)
        batches += 1
        if len(ids) < conf.PURGE_BATCH_SIZE:
            break
    return PurgeResult(completed_deleted=deleted, unknown_expired=expired_unknown)


# --- reading -------------------------------------------------------------------------------


def next_wakeup() -> datetime | None:
    """The earliest time a claim may find work: a due head or a lease to expire."""
    rows = _fetchall(
        f"""
        SELECT MIN(t) FROM (
            SELECT MIN(head_due_at) AS t FROM {P} WHERE head_state IN {_CLAIMABLE_SQL}
            UNION ALL
            SELECT MIN(lease_until) AS t FROM {J} WHERE status = '{_RUNNING}'
        ) AS w
        """
    )
    return _aware(rows[0][0])


def seconds_until_wakeup() -> float | None:
    """Seconds until ``next_wakeup()`` by the database's clock (negative: overdue)."""
    wake = next_wakeup()
    if wake is None:
        return None
    return (wake - database_now()).total_seconds()


def database_now() -> datetime:
    """The database's clock (PostgreSQL); the local clock on SQLite (same host)."""
    d = _dialect()
    if not d.pg:
        return datetime.now(UTC)
    return _fetchall("SELECT now()")[0][0]


@dataclass(frozen=True)
class Stats:
    counts: dict[str, int]
    due: int
    delayed: int
    oldest_due_age_seconds: float | None
    blocked_partitions: int
    running_partitions: int
    #: True when ``counts["completed"]`` is the planner's estimate (a very large ledger).
    completed_estimated: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "counts": self.counts,
            "completed_estimated": self.completed_estimated,
            "due": self.due,
            "delayed": self.delayed,
            "oldest_due_age_seconds": self.oldest_due_age_seconds,
            "blocked_partitions": self.blocked_partitions,
            "running_partitions": self.running_partitions,
        }


#: Above this many rows (PostgreSQL's estimate) the completed count is estimated, not counted.
EXACT_COUNT_LIMIT = 200_000


def stats() -> Stats:
    """Queue statistics (SPEC §3): counts per state, due vs delayed, oldest due age, blocked.

    ``due``: queued/retry-wait jobs whose time has come (some may wait behind their
    partition's head); ``delayed``: retry-wait jobs not yet due; ``oldest_due_age_seconds``:
    how long the oldest claimable head has been due (how far workers lag).
    """
    d = _dialect()
    counts = {s.value: 0 for s in Status}
    # Unresolved states are few and counted exactly through the status index; completed jobs
    # are counted exactly only while the ledger is small, else estimated (no full scan on
    # every dashboard refresh).
    unresolved = [s.value for s in Status if s != Status.COMPLETED]
    for status, n in _fetchall(
        f"SELECT status, COUNT(*) FROM {J} WHERE status IN {_in(unresolved)} GROUP BY status",
        unresolved,
    ):
        counts[status] = n
    estimated = False
    rows_estimate = -1
    if d.pg:
        rows_estimate = int(
            _fetchall("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [J])[0][0]
        )
    if rows_estimate > EXACT_COUNT_LIMIT:
        counts[_COMPLETED] = max(0, rows_estimate - sum(counts.values()))
        estimated = True
    else:
        counts[_COMPLETED] = _fetchall(f"SELECT COUNT(*) FROM {J} WHERE status = %s", [_COMPLETED])[
            0
        ][0]
    due, delayed = _fetchall(
        f"""
        SELECT COALESCE(SUM(CASE WHEN available_at <= {d.now} THEN 1 ELSE 0 END), 0),
               COALESCE(SUM(CASE WHEN available_at > {d.now} THEN 1 ELSE 0 END), 0)
        FROM {J} WHERE status IN {_CLAIMABLE_SQL}
        """
    )[0]
    now = database_now()
    oldest = _fetchall(
        f"SELECT MIN(head_due_at) FROM {P} WHERE head_state IN {_CLAIMABLE_SQL} "
        f"AND head_due_at <= {d.now}"
    )[0][0]
    oldest = _aware(oldest)
    blocked_states = tuple(s.value for s in BLOCKING)
    per_state = dict(
        _fetchall(
            f"SELECT head_state, COUNT(*) FROM {P} WHERE head_state IN {_in(blocked_states)} "
            f"OR head_state = %s GROUP BY head_state",
            [*blocked_states, _RUNNING],
        )
    )
    return Stats(
        counts=counts,
        due=int(due),
        delayed=int(delayed),
        oldest_due_age_seconds=(
            None if oldest is None else max(0.0, (now - oldest).total_seconds())
        ),
        blocked_partitions=sum(per_state.get(s, 0) for s in blocked_states),
        running_partitions=per_state.get(_RUNNING, 0),
        completed_estimated=estimated,
    )


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
