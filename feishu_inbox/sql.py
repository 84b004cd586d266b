"""The SQL the ledger is built from: table names, the dialect, and small helpers.

PostgreSQL and SQLite differ in a few fragments only (the clock, row locks); everything else is
one SQL text. Times are the database's clock on PostgreSQL (``now()``), the host's on SQLite
(the same host: the database is a local file).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

from django.db import connection, transaction

from .models import Attempt, EventJob, Partition, PartitionState, Status

J = EventJob._meta.db_table
P = Partition._meta.db_table
A = Attempt._meta.db_table
NOTIFY_CHANNEL = "feishu_inbox"

QUEUED = Status.QUEUED.value
RUNNING = Status.RUNNING.value
RETRY = Status.RETRY_WAIT.value
COMPLETED = Status.COMPLETED.value
FAILED = Status.FAILED.value
UNKNOWN = Status.UNKNOWN.value
IDLE = PartitionState.IDLE.value
CLAIMABLE_SQL = f"('{QUEUED}', '{RETRY}')"
# Written exactly as the partial index's predicate: SQLite uses a partial index only when the
# query's WHERE names its condition in the same form.
UNRESOLVED = f"NOT (status = '{COMPLETED}')"
ERROR_MESSAGE_LIMIT = 4000

# --- SQL dialect -----------------------------------------------------------------------------


def _sqlite_now(offset_seconds: float | None) -> str:
    when = datetime.now(timezone.utc) + timedelta(seconds=offset_seconds or 0)
    return when.replace(tzinfo=None).isoformat(" ", timespec="microseconds")


class Dialect:
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


_PG = Dialect(pg=True)
_SQLITE = Dialect(pg=False)


def dialect() -> Dialect:
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
def serialized() -> Iterator[None]:
    if connection.vendor == "sqlite":
        with _sqlite_writer:
            yield
    else:
        yield


@contextmanager
def write_txn() -> Iterator[None]:
    """One ledger transaction (IMMEDIATE on SQLite, per the database OPTIONS)."""
    with serialized(), transaction.atomic():
        yield


def in_list(values: Sequence[Any]) -> str:
    return "(" + ", ".join(["%s"] * len(values)) + ")"


def fetchall(sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return list(cur.fetchall())


def execute(sql: str, params: Sequence[Any] = ()) -> int:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.rowcount


def lock_partitions(d: Dialect, keys: Iterable[str], *, skip_locked: bool = False) -> list[str]:
    """Lock partition rows (PostgreSQL) in key order; returns the keys locked."""
    keys = sorted(set(keys))
    if not keys or not d.pg:
        return keys
    suffix = d.skip_locked if skip_locked else d.lock
    rows = fetchall(f"SELECT key FROM {P} WHERE key IN {in_list(keys)} ORDER BY key{suffix}", keys)
    return [r[0] for r in rows]


def resync_heads(keys: Iterable[str]) -> None:
    """Point each partition at its first non-completed job (call with the rows locked).

    The key is bound as a parameter (not correlated) and the order matches the partial index
    ``(partition_key, id)``: a correlated subquery gets a generic plan that walks the primary
    key through the whole backlog.
    """
    head = f"FROM {J} WHERE partition_key = %s AND {UNRESOLVED} ORDER BY partition_key, id LIMIT 1"
    for key in sorted(set(keys)):
        execute(
            f"""
            UPDATE {P} SET
                head_id = (SELECT id {head}),
                head_state = COALESCE((SELECT status {head}), '{IDLE}'),
                head_due_at = (SELECT available_at {head})
            WHERE key = %s
            """,
            [key, key, key, key],
        )


def notify(d: Dialect, key: str) -> None:
    """Wake idle workers (PostgreSQL; delivered at commit): a head became claimable."""
    if d.pg:
        execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, key[:200]])


def record_attempts(d: Dialect, job_ids: Sequence[int], number_offset: int = 0) -> None:
    """History row for each job's attempt that just ended (run after the job's update)."""
    if not job_ids:
        return
    execute(
        f"""
        INSERT INTO {A} (job_id, number, worker_id, started_at, ended_at, outcome,
                         error_type, error_message)
        SELECT id, attempt + %s, worker_id, COALESCE(claimed_at, {d.now}), {d.now}, status,
               error_type, error_message
        FROM {J} WHERE id IN {in_list(job_ids)}
        """,
        [number_offset, *job_ids],
    )


def aware(value: Any) -> Any:
    """A timestamp read by raw SQL as an aware datetime (SQLite gives text or naive UTC)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime) and value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value


def truncate(message: str) -> str:
    if len(message) <= ERROR_MESSAGE_LIMIT:
        return message
    return message[: ERROR_MESSAGE_LIMIT - 1] + "…"
