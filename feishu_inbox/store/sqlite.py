"""The SQLite store: one writer at a time, the host's clock, polling instead of NOTIFY.

Every write runs in an IMMEDIATE transaction (the database OPTIONS of the README), so no
statement needs a row lock; the PostgreSQL functions' steps run here one query at a time inside
that transaction. Writers of one process queue on an in-process lock first: SQLite's busy
handler sleeps in growing steps (up to 100 ms) instead of waking when the lock frees, so only
writers of other processes meet it.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

from django.db import connection, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..errors import LedgerError
from .base import EVERY_KEY, Fence, KeyFilter, Row, SqlStore, fence_params

_writer = threading.RLock()


@contextmanager
def _serialized() -> Iterator[None]:
    with _writer:
        yield


@contextmanager
def _write_transaction() -> Iterator[None]:
    with _writer, transaction.atomic():
        yield


def _clock(offset_seconds: float | None = 0.0) -> str:
    """UTC now (+ offset) in the text form Django stores datetimes in on SQLite."""
    when = datetime.now(timezone.utc) + timedelta(seconds=offset_seconds or 0)
    return when.replace(tzinfo=None).isoformat(" ", timespec="microseconds")


#: Django's probe of the JSON functions (``DatabaseFeatures.supports_json_field``).
JSON_PROBE = """SELECT JSON('{"a": "b"}')"""


def _has_json(connection: BaseDatabaseWrapper) -> bool:
    """Whether this SQLite has the JSON functions: Django's own probe, outside a transaction.
    Django runs it inside one, which ``transaction_mode = "IMMEDIATE"`` makes take the write
    lock: behind a busy writer it waits out the busy timeout, and the error reads as "no JSON"
    (a worker refused at start with ``fields.E180`` on every JSONField; a process that ran on
    would pick SQL for a database without JSON). A lone SELECT needs no lock."""
    try:
        connection.connection.execute(JSON_PROBE).fetchone()
    except sqlite3.OperationalError:
        return False
    return True


def _probe_json(features: Any) -> bool:
    connection = features.connection
    connection.ensure_connection()
    return _has_json(connection)


def install_json_probe() -> None:
    """Make Django's SQLite ``supports_json_field`` our probe (:func:`_has_json`), on the class.

    Setting it on each new connection (``connection_created``) is too late when the first thing
    to touch a wrapper is the probe itself (the system checks at a worker's start do): Django's
    getter connects, our hook runs inside it, and the getter's own answer, taken in the busy
    transaction, overwrites ours. Idempotent; it changes no other feature."""
    from django.db.backends.sqlite3.features import DatabaseFeatures
    from django.utils.functional import cached_property

    if getattr(DatabaseFeatures.supports_json_field, "func", None) is _probe_json:
        return
    probe = cached_property(_probe_json)
    probe.__set_name__(DatabaseFeatures, "supports_json_field")
    DatabaseFeatures.supports_json_field = probe  # type: ignore[assignment]


def _adapt(value: Any) -> Any:
    if isinstance(value, list):
        return json.dumps(value)
    if isinstance(value, datetime):
        return connection.ops.adapt_datetimefield_value(value)
    return value


class SqliteStore(SqlStore):
    query_file = "sqlite.sql"
    # One writer at a time: a second transaction would only wait in its busy handler's sleeps.
    concurrent_writers = 1
    server_sessions = False
    # SQLite binds no arrays: a list parameter is sent as a JSON array (see ``adapt``).
    list_parameters = {
        "job_ids": "(SELECT value FROM json_each(%(job_ids)s))",
        "keys": "(SELECT value FROM json_each(%(keys)s))",
        "statuses": "(SELECT value FROM json_each(%(statuses)s))",
        "prefixes": "(SELECT value AS prefix FROM json_each(%(prefixes)s))",
    }

    def prepare_connection(self, connection: BaseDatabaseWrapper) -> None:
        # The clock the queries read: now() and feishu_inbox_now_plus(seconds).
        connection.connection.create_function("now", 0, _clock)
        connection.connection.create_function("feishu_inbox_now_plus", 1, _clock)

    def settings_problems(self, settings_dict: Mapping[str, Any]) -> list[str]:
        options = settings_dict.get("OPTIONS", {})
        problems = []
        if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
            problems.append("OPTIONS['transaction_mode'] = 'IMMEDIATE'")
        if not options.get("timeout"):
            problems.append("OPTIONS['timeout'] (busy timeout in seconds, e.g. 20)")
        if "journal_mode=wal" not in str(options.get("init_command", "")).lower().replace(" ", ""):
            problems.append("OPTIONS['init_command'] containing 'PRAGMA journal_mode=WAL'")
        return problems

    def transaction(self) -> AbstractContextManager[None]:
        return _write_transaction()

    def write(self) -> AbstractContextManager[None]:
        return _serialized()

    def adapt(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        # A list parameter is read with json_each() (SQLite binds no arrays); a datetime is
        # sent as the text Django's ORM stores, so a value read back compares equal to it.
        return {k: _adapt(v) for k, v in params.items()}

    def enqueue(self, job: dict[str, Any]) -> Row:
        with self.transaction():
            partition = self.rows("enqueue_partition", job)[0]
            stored = self.row("enqueue_job", job)
            if stored is None:
                found = self.rows("duplicate_of", job)[0]
                return {
                    "job_id": found["id"],
                    "created": False,
                    "received_at": found["received_at"],
                }
            if partition["head_id"] is None:
                self.execute("set_first_head", {**job, "job_id": stored["id"]})
        return {"job_id": stored["id"], "created": True, "received_at": stored["received_at"]}

    def claim(
        self,
        worker_id: str,
        token: str,
        lease_seconds: float,
        limit: int,
        keys: KeyFilter = EVERY_KEY,
    ) -> list[Row]:
        with self.transaction():
            return self._claim(worker_id, token, lease_seconds, limit, keys)

    def _claim(
        self,
        worker_id: str,
        token: str,
        lease_seconds: float,
        limit: int,
        keys: KeyFilter = EVERY_KEY,
    ) -> list[Row]:
        if limit < 1:
            return []
        first = self.row("claimable_tenant", {})
        if first is None:
            return []
        tenant = first["head_tenant"]
        if self.row("another_tenant", {"tenant": tenant}) is not None:  # several: fair shares
            every = {"prefixes": [], "excluding": True}  # no prefix, excluded: every partition
            params = keys.params() if keys else every
            heads = self.rows("claimable_heads_fair", {"limit": limit, **params})
        elif keys:  # a worker of some task queues only, or of all but some (tasks/)
            heads = self.rows(
                "claimable_heads_in_queues", {"limit": limit, "tenant": tenant, **keys.params()}
            )
        else:
            heads = self.rows("claimable_heads", {"limit": limit, "tenant": tenant})
        if not heads:
            return []
        self.execute("claim_partitions", {"keys": [h["key"] for h in heads]})
        job_ids = [h["head_id"] for h in heads]
        claimed = self.rows(
            "claim_jobs",
            {
                "worker_id": worker_id,
                "token": token,
                "lease_seconds": lease_seconds,
                "job_ids": job_ids,
            },
        )
        if len(claimed) != len(job_ids):  # the mirror disagrees with the jobs: never expected
            raise LedgerError(
                f"partition heads {job_ids} did not match claimable jobs; claim rolled back.",
                fix="Report this as a bug; `python manage.py inbox stats` shows the ledger.",
            )
        return claimed

    def _end_attempt(self, fence: Fence, query: str, params: dict[str, Any]) -> str | None:
        self.lock_partitions([fence.partition_key])
        ended = self.row(query, {**fence_params(fence), **params})
        if ended is None:
            return None
        self.record_attempts([fence.job_id], token=fence.token)
        self.resync_heads([fence.partition_key])
        return str(ended["status"])

    def finish(self, fence: Fence, error_type: str) -> str | None:
        with self.transaction():
            return self._end_attempt(fence, "finish_job", {"error_type": error_type})

    def fail(
        self,
        fence: Fence,
        *,
        error_type: str,
        message: str,
        max_attempts: int,
        retry_in: float | None,
    ) -> str | None:
        with self.transaction():
            return self._end_attempt(
                fence,
                "fail_job",
                {
                    "error_type": error_type,
                    "error_message": message,
                    "max_attempts": max_attempts,
                    "retry_in": retry_in,
                },
            )

    def record_step(self, fence: Fence, *, name: str, result: str, took: float) -> bool:
        params = {**fence_params(fence), "name": name, "result": result, "took": took}
        with self.transaction():
            if self.row("record_step", params) is None:
                return False
            self.execute("mark_has_steps", {"job_id": fence.job_id})
        return True

    def finish_and_claim(
        self,
        fence: Fence,
        error_type: str,
        *,
        token: str,
        lease_seconds: float,
        limit: int,
        keys: KeyFilter = EVERY_KEY,
    ) -> tuple[str | None, list[Row]]:
        # One transaction (one commit) for both, as PostgreSQL's one statement.
        with self.transaction():
            status = self._end_attempt(fence, "finish_job", {"error_type": error_type})
            if status is None or limit < 1:
                return status, []
            return status, self._claim(fence.worker_id, token, lease_seconds, limit, keys)

    def finish_batch(
        self,
        worker_id: str,
        finishes: Sequence[tuple[Fence, str]],
        *,
        token: str,
        lease_seconds: float,
        limit: int,
        keys: KeyFilter = EVERY_KEY,
    ) -> tuple[list[str | None], list[Row]]:
        # One transaction (one commit) for all, as PostgreSQL's one statement; SQLite has one
        # writer at a time, so the order of the finishes' locks does not matter here.
        with self.transaction():
            ended = [
                self._end_attempt(fence, "finish_job", {"error_type": error})
                for fence, error in finishes
            ]
            claimed = self._claim(worker_id, token, lease_seconds, limit, keys) if limit else []
            return ended, claimed

    def finish_together(
        self,
        finishes: Sequence[tuple[Fence, str, str]],
        lease_seconds: float,
        keys: KeyFilter = EVERY_KEY,
    ) -> list[tuple[str | None, list[Row]]]:
        # One transaction (one commit) for all, as PostgreSQL's one statement.
        with self.transaction():
            return [
                self.finish_and_claim(
                    fence,
                    error,
                    token=token,
                    lease_seconds=lease_seconds,
                    limit=int(bool(token)),
                    keys=keys,
                )
                for fence, error, token in finishes
            ]
