"""The PostgreSQL store: row locks with SKIP LOCKED, the server's clock, NOTIFY on commit.

Enqueue, claim and the end of an attempt are one stored-function call each (one round trip,
plans cached in the session); a worker's finish and its next claim share one statement. These
hot statements are prepared on the server (``PREPARED``): each connection parses and plans
them once, then sends only their parameters; in autocommit they run on libpq directly
(``PostgresStore._fast``), without psycopg's and Django's cursors.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg
import psycopg.conninfo
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg import pq
from psycopg.adapt import AdaptersMap, PyFormat, Transformer
from psycopg.generators import execute
from psycopg.pq import ExecStatus, TransactionStatus

from ..conf import InboxSettings, checked_settings
from . import listener
from .base import EVERY_KEY, Fence, KeyFilter, Row, SqlStore, fence_params

log = logging.getLogger("feishu_inbox.worker")

#: Connection parameters of Django's that psycopg.connect does not take.
_NOT_FOR_LISTEN = ("cursor_factory", "context", "prepare_threshold", "client_encoding")

#: The statements a worker or the webhook sends for every job: prepared on the server. Sent as
#: text, each one cost PostgreSQL a parse and a plan per job (9% of its CPU per job); prepared,
#: a no-op job runs about 1.5 times as fast (bench/worker.py).
PREPARED = frozenset(
    {
        "enqueue",
        "claim",
        "end_attempt",
        "finish_and_claim",
        "finish_together",
        "finish_batch",
        "claim_in_queues",
        "finish_and_claim_in_queues",
        # A running job's own writes: its heartbeat, the end of each effect, each step.
        # (begin_effect is not: it tests parameters for NULL, whose type the server cannot
        # infer when preparing it untyped, and common.sql takes no PostgreSQL-only casts.)
        "renew",
        "end_effect",
        "record_step",
    }
)
#: psycopg's prepare_threshold that prepares a statement only when its execute says so.
_ONLY_WHEN_ASKED = 2**31 - 1


class _Prepared:
    """A psycopg cursor with server-side binding whose ``execute`` prepares its statement.

    Django's cursors bind parameters on the client (its default keeps connection poolers
    working), so a statement cannot be prepared through them; this one is wrapped by Django
    all the same (``make_cursor``), so its errors are Django's and its queries are logged.
    """

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        return self._raw.execute(sql, params, prepare=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def __iter__(self) -> Any:
        return iter(self._raw)


#: A placeholder of the store's queries (``%(name)s``).
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
_IDLE = TransactionStatus.IDLE
#: SQLSTATE of "prepared statement ... does not exist" (DEALLOCATE ALL, DISCARD ALL).
_NO_SUCH_STATEMENT = "26000"
#: SQLSTATE of "prepared statement ... already exists".
_ALREADY_PREPARED = "42P05"


class _Statement:
    """A hot statement in the server's own form: ``$n`` placeholders, prepared by name."""

    __slots__ = ("columns", "name", "params", "sql")

    def __init__(self, name: str, sql: str) -> None:
        self.name = f"feishu_inbox_{name}".encode()
        self.params: list[str] = []

        def number(m: re.Match[str]) -> str:
            if m.group(1) not in self.params:
                self.params.append(m.group(1))
            return f"${self.params.index(m.group(1)) + 1}"

        text = _PLACEHOLDER.sub(number, sql)
        if "%" in text:
            raise ValueError(f"{name}: the fast path takes no literal % in a statement")
        self.sql = text.encode()
        self.columns: list[str] | None = None  # the same for every result: read once


class _Adapting:
    """The context of the fast path's transformer: the connection's adapters (Django's), but
    psycopg's own loader for ``timestamptz``. Django's (``BaseTzLoader``) is psycopg's pure
    Python one with the connection's zone set after it, and a claimed job's three
    timestamps made it a tenth of a worker's CPU per job; psycopg's C loader gives the same
    instant, in the session's zone (UTC: Django sets it)."""

    __slots__ = ("adapters", "connection")

    def __init__(self, pg: psycopg.Connection[Any]) -> None:
        self.connection = pg
        self.adapters = AdaptersMap(pg.adapters)
        oid = pg.adapters.types["timestamptz"].oid
        loader = psycopg.adapters.get_loader(oid, pq.Format.TEXT)  # the C one, when built
        if loader is not None:
            self.adapters.register_loader(oid, loader)


class _Session:
    """What the fast path keeps for one PostgreSQL connection: the statements prepared on it
    so far, and a transformer with its adapters (Django's, but for ``_Adapting``'s), so
    values are dumped and loaded as through Django's cursors."""

    __slots__ = ("pg", "prepared", "tx")

    def __init__(self, pg: psycopg.Connection[Any]) -> None:
        self.pg = pg
        self.prepared: set[bytes] = set()
        self.tx = Transformer(_Adapting(pg))


def _array(items: Sequence[object]) -> str:
    """An array's text form, e.g. ``{"a","b\\"c"}``: a hot statement's list parameter sent
    as one text value (the statement casts it), not dumped element by element in Python."""
    quoted = (
        str(i)
        if isinstance(i, int)
        else '"' + str(i).replace("\\", "\\\\").replace('"', '\\"') + '"'
        for i in items
    )
    return "{" + ",".join(quoted) + "}"


def _error(pgconn: pq.abc.PGconn, result: pq.abc.PGresult, encoding: str) -> psycopg.Error:
    """The error of a failed result, as psycopg's cursor raises it. A connection lost during
    the call leaves a result with no SQLSTATE: that is an OperationalError, as psycopg raises
    when it reads from a closed socket, so the worker treats it as a blink (SPEC §6)."""
    if pgconn.status == pq.ConnStatus.BAD:
        message = result.get_error_message(encoding) or "the connection was lost"
        return psycopg.OperationalError(message.strip())
    return psycopg.errors.error_from_result(result, encoding=encoding)


def _prepares(conf: InboxSettings) -> bool:
    """Whether the hot statements are prepared on the server: never behind a transaction
    pooler, where the next transaction may run on another server session (PgBouncer before
    1.21 keeps no prepared statement across them)."""
    return conf.PREPARE_STATEMENTS and not conf.TRANSACTION_POOLER


class PostgresStore(SqlStore):
    query_file = "postgres.sql"
    concurrent_writers = 2
    server_sessions = True
    list_parameters = {
        "job_ids": "(SELECT unnest(%(job_ids)s::bigint[]))",
        "keys": "(SELECT unnest(%(keys)s::text[]))",
        "statuses": "(SELECT unnest(%(statuses)s::text[]))",
        "prefixes": "(SELECT unnest(%(prefixes)s::text[]) AS prefix)",
    }

    def __init__(self) -> None:
        super().__init__()
        self._statements = {name: _Statement(name, self.queries[name].sql) for name in PREPARED}

    def rows(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        if name not in PREPARED or not _prepares(checked_settings()):
            return super().rows(name, params)
        # The connection is looked up once: each use of django.db.connection (a proxy to the
        # thread's or task's connection) is a lookup, about 4 µs, and a job's statement
        # made nine of them.
        db = connections[DEFAULT_DB_ALIAS]
        db.close_if_health_check_failed()  # as Django's own cursor() does
        db.ensure_connection()
        db.validate_thread_sharing()
        pg = db.connection
        if pg.autocommit and not db.queries_logged and not db.execute_wrappers:
            # In autocommit only (the worker's and the webhook's statements, each its own
            # transaction): psycopg deallocates every prepared statement of the session when
            # it rolls back while it holds some of its own, and in a transaction a missing
            # statement would abort it; in autocommit it is prepared again and run.
            return self._fast(db, pg, self._statements[name], params or {})
        if pg.prepare_threshold is None:  # Django's default: none prepared
            # Prepare only what is asked for (prepare=True), never the site's other queries.
            pg.prepare_threshold = _ONLY_WHEN_ASKED
        raw: Any = _Prepared(psycopg.Cursor(pg))  # stubs: a CursorWrapper
        cursor = db.make_debug_cursor(raw) if db.queries_logged else db.make_cursor(raw)
        with cursor:
            cursor.execute(self.queries[name].sql, params or {})
            columns = [c[0] for c in cursor.description]
            return [dict(zip(columns, values, strict=True)) for values in cursor.fetchall()]

    @staticmethod
    def _fast(
        db: BaseDatabaseWrapper,
        pg: psycopg.Connection[Any],
        statement: _Statement,
        params: Mapping[str, Any],
    ) -> list[Row]:
        """Run a hot statement on libpq directly: prepared once per connection, then bound and
        executed in one message. psycopg's cursor, in pure Python, cost a round trip about
        60 µs of the client's CPU on top of libpq's, and Django's wrapper about 45 µs more: a
        fifth of a whole job at one worker (bench/throughput.py). What Django's cursor does
        around a query is kept: a broken transaction refuses it, errors are Django's, and the
        wait is psycopg's own (interruptible)."""
        db.validate_no_broken_transaction()
        session: _Session | None = getattr(db, "_feishu_inbox_session", None)
        if session is None or session.pg is not pg:  # a new connection: nothing prepared
            session = _Session(pg)
            db._feishu_inbox_session = session  # type: ignore[attr-defined]
        pgconn = pg.pgconn
        encoding = pg.info.encoding
        with db.wrap_database_errors:  # a value psycopg cannot send (a NUL) is a DataError too
            values = session.tx.dump_sequence(
                [params[p] for p in statement.params], [PyFormat.TEXT] * len(statement.params)
            )
            for tries_left in (1, 0):
                if statement.name not in session.prepared:
                    pgconn.send_prepare(statement.name, statement.sql)
                    [done] = pg.wait(execute(pgconn))
                    if done.status != ExecStatus.COMMAND_OK:
                        failed = _error(pgconn, done, encoding)
                        if failed.sqlstate != _ALREADY_PREPARED:  # else: it is there, use it
                            raise failed
                    session.prepared.add(statement.name)
                pgconn.send_query_prepared(statement.name, values)  # None: NULL
                # psycopg's wait, in slices: a signal's handler runs meanwhile, and an
                # interrupt cancels the query, as through psycopg's cursor.
                [result] = pg.wait(execute(pgconn))
                if result.status == ExecStatus.TUPLES_OK:
                    break
                error = _error(pgconn, result, encoding)
                if error.sqlstate == _NO_SUCH_STATEMENT:
                    # Deallocated behind our back (DEALLOCATE ALL, DISCARD ALL): prepare it
                    # again. Nothing ran; in autocommit nothing was aborted either.
                    session.prepared.discard(statement.name)
                    if tries_left and pgconn.transaction_status == _IDLE:
                        continue
                raise error
        if statement.columns is None:
            statement.columns = [result.fname(i).decode(encoding) for i in range(result.nfields)]
        tx = session.tx
        tx.set_pgresult(result)
        columns = statement.columns
        return [
            dict(zip(columns, row, strict=True)) for row in tx.load_rows(0, result.ntuples, tuple)
        ]

    def listen(
        self,
        wake: Callable[[str], None],
        done: threading.Event,
        listening: Callable[[bool], None],
    ) -> None:
        """LISTEN on a connection of its own (``wakeups.py``: LISTEN_URL's, else the default
        database's), or not at all (POLL_ONLY, or a transaction pooler and no LISTEN_URL)."""
        conf = checked_settings()
        if conf.POLL_ONLY or (conf.TRANSACTION_POOLER and not conf.LISTEN_URL):
            log.info(
                "wake-ups: polling every %.2fs (%s)",
                conf.POLL_INTERVAL,
                "POLL_ONLY" if conf.POLL_ONLY else "TRANSACTION_POOLER without LISTEN_URL",
            )
            return
        if conf.LISTEN_URL:
            args: tuple[str, ...] = (conf.LISTEN_URL,)
            given = set(psycopg.conninfo.conninfo_to_dict(conf.LISTEN_URL))
            params: dict[str, Any] = {}
        else:
            args = ()
            params = {
                k: v
                for k, v in connection.get_connection_params().items()
                if k not in _NOT_FOR_LISTEN
            }
            given = set(params)
        # A primary that vanished without closing its sockets (a host down, a network cut)
        # must not leave the listener waiting on a dead one: TCP keepalives and a user
        # timeout end it within seconds; libpq's own options win when the site set them.
        params.update({k: v for k, v in listener.LISTEN_SOCKET.items() if k not in given})
        listener.listen(
            lambda: psycopg.connect(*args, **params, autocommit=True),
            wake=wake,
            done=done,
            listening=listening,
            probe=self._probe,
        )

    def notify(self, partition_key: str) -> None:
        self.execute("notify", {"partition_key": partition_key})

    def _probe(self, notice: str) -> None:
        """A NOTIFY sent the way the enqueuers send theirs (the default database, through the
        pooler if there is one), for the listener to hear; then this thread's connection is
        closed (the listener's thread has no other use for it)."""
        try:
            self.notify(notice)
        finally:
            connection.close()

    def enqueue(self, job: dict[str, Any]) -> Row:
        return self.rows("enqueue", job)[0]

    def claim(
        self,
        worker_id: str,
        token: str,
        lease_seconds: float,
        limit: int,
        keys: KeyFilter = EVERY_KEY,
    ) -> list[Row]:
        params = {
            "worker_id": worker_id,
            "token": token,
            "lease_seconds": lease_seconds,
            "limit": limit,
        }
        if keys:  # a worker of some task queues only, or of all but some (tasks/): its own function
            return self.rows("claim_in_queues", {**params, **keys.params()})
        return self.rows("claim", params)

    def _end_attempt(self, fence: Fence, **ending: Any) -> str | None:
        status = self.rows("end_attempt", {**fence_params(fence), **ending})[0]["status"]
        return None if status is None else str(status)

    def finish(self, fence: Fence, error_type: str) -> str | None:
        return self._end_attempt(
            fence, fail=False, error_type=error_type, error_message="", max_attempts=0, retry_in=0
        )

    def fail(
        self,
        fence: Fence,
        *,
        error_type: str,
        message: str,
        max_attempts: int,
        retry_in: float | None,
    ) -> str | None:
        return self._end_attempt(
            fence,
            fail=True,
            error_type=error_type,
            error_message=message,
            max_attempts=max_attempts,
            retry_in=retry_in,
        )

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
        params = {
            **fence_params(fence),
            "error_type": error_type,
            "new_token": token,
            "lease_seconds": lease_seconds,
            "limit": limit,
        }
        if keys:  # a worker of some task queues only, or of all but some: its own function
            found = self.rows("finish_and_claim_in_queues", {**params, **keys.params()})
        else:
            found = self.rows("finish_and_claim", params)
        status = found[0]["ended_status"]
        claimed = [r for r in found if r["id"] is not None]  # LEFT JOIN: NULLs when none
        return (None if status is None else str(status)), claimed

    def finish_together(
        self,
        finishes: Sequence[tuple[Fence, str, str]],
        lease_seconds: float,
        keys: KeyFilter = EVERY_KEY,
    ) -> list[tuple[str | None, list[Row]]]:
        found = self.rows(
            "finish_together",
            {
                "worker_id": finishes[0][0].worker_id,
                "job_ids": [f.job_id for f, _, _ in finishes],
                "tokens": [f.token for f, _, _ in finishes],
                "partition_keys": [f.partition_key for f, _, _ in finishes],
                "error_types": [error_type for _, error_type, _ in finishes],
                "new_tokens": [token for _, _, token in finishes],
                "lease_seconds": lease_seconds,
                # NULL: a worker of every queue (feishu_inbox_claim, the unfiltered claim)
                "prefixes": list(keys.prefixes) or None,
                "excluding": keys.excluding,
            },
        )
        return [
            (r["ended_status"], [] if r["id"] is None else [r])
            for r in found  # one row per finish, in their order
        ]

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
        found = self.rows(
            "finish_batch",
            {
                "worker_id": worker_id,
                "job_ids": _array([f.job_id for f, _ in finishes]),
                "tokens": _array([f.token for f, _ in finishes]),
                "partition_keys": _array([f.partition_key for f, _ in finishes]),
                "error_types": _array([error_type for _, error_type in finishes]),
                "new_token": token,
                "limit": limit,
                "lease_seconds": lease_seconds,
                # NULL: a worker of every queue (feishu_inbox_claim, the unfiltered claim)
                "prefixes": list(keys.prefixes) or None,
                "excluding": keys.excluding,
            },
        )
        ended = [r["ended_status"] for r in found if r["finished_id"] is not None]
        return ended, [r for r in found if r["finished_id"] is None]

    def take_tokens(
        self, keys: Sequence[str], rates: Sequence[float], bursts: Sequence[float]
    ) -> tuple[float, int] | None:
        found = self.rows(
            "take_tokens", {"keys": list(keys), "rates": list(rates), "bursts": list(bursts)}
        )[0]
        return float(found["wait"]), int(found["found"])

    def estimate_jobs(self) -> int | None:
        return int(self.rows("estimate_jobs")[0]["n"])

    def dead_tuples(self) -> list[Row]:
        return self.rows("dead_tuples")

    def oldest_snapshot(self) -> Row | None:
        return self.rows("oldest_snapshot")[0]

    def replication(self) -> Row | None:
        return self.rows("replication")[0]
