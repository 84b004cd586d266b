"""The ledger's storage: one interface, one implementation per database.

``ledger/rules.py`` says what each operation means (its checks, fencing rules and errors) and calls
``store()`` to run it. A store runs each operation as one transaction of named queries from its
``.sql`` file (``postgres.sql``, ``sqlite.sql``: the same names, side by side); PostgreSQL's hot
operations call stored functions (``functions/``), loaded by migrations.

- here: the interface (``Store``), split by who uses it: ``HotPath``, ``Leases``, ``Waits``,
  ``Operators``, ``Schedules``, ``Insights``; and ``store()``, the store of the database;
- ``base``: what both stores share (running named queries, the operations composed of them);
  ``waits``: the waits' transactions (the signal key's lock, a chat given back and taken again,
  a card's click decided);
- ``postgres`` and ``sqlite``: one store each; ``listener``: a PostgreSQL worker's LISTEN,
  probed before it is trusted and subscribed again after a break or a failover; ``outages``:
  the errors (SQLSTATEs) that mean the database is away, not that a statement is wrong;
- ``queries``: named SQL read from the ``.sql`` files; ``schema``: table names, statuses and
  shared SQL fragments; ``migration``: the operation that loads a stored-function file.

The store is chosen once per connection vendor; nothing outside this package asks which
database it runs on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol

from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from ..errors import ConfigurationError
from .base import EVERY_KEY, Fence, KeyFilter, Row, SqlStore, Transition


class HotPath(Protocol):
    """What every job costs: stored, claimed, finished (write these first: with them and
    ``Leases``, a new store runs a worker)."""

    #: How many of one worker's write transactions may usefully run at once (PostgreSQL: two
    #: claims in flight, each waiting for its own WAL flush; SQLite has one writer).
    concurrent_writers: int
    #: Whether its connections are server sessions that a pooler in transaction mode hands
    #: from client to client (PostgreSQL): then nothing may outlive a transaction on them.
    server_sessions: bool

    def prepare_connection(self, connection: BaseDatabaseWrapper) -> None: ...
    def settings_problems(self, settings_dict: Mapping[str, Any]) -> list[str]: ...
    def enqueue(self, job: dict[str, Any]) -> Row: ...
    def claim(
        self,
        worker_id: str,
        token: str,
        lease_seconds: float,
        limit: int,
        keys: KeyFilter = EVERY_KEY,
    ) -> list[Row]: ...
    def finish(self, fence: Fence, error_type: str) -> str | None: ...
    def fail(
        self,
        fence: Fence,
        *,
        error_type: str,
        message: str,
        max_attempts: int,
        retry_in: float | None,
    ) -> str | None: ...
    def finish_and_claim(
        self,
        fence: Fence,
        error_type: str,
        *,
        token: str,
        lease_seconds: float,
        limit: int,
        keys: KeyFilter = EVERY_KEY,
    ) -> tuple[str | None, list[Row]]: ...
    def finish_together(
        self,
        finishes: Sequence[tuple[Fence, str, str]],
        lease_seconds: float,
        keys: KeyFilter = EVERY_KEY,
    ) -> list[tuple[str | None, list[Row]]]: ...
    def finish_batch(
        self,
        worker_id: str,
        finishes: Sequence[tuple[Fence, str]],
        *,
        token: str,
        lease_seconds: float,
        limit: int,
        keys: KeyFilter = EVERY_KEY,
    ) -> tuple[list[str | None], list[Row]]: ...
    def notify(self, partition_key: str) -> None: ...
    def listen(
        self,
        wake: Callable[[str], None],
        done: threading.Event,
        listening: Callable[[bool], None],
    ) -> None: ...
    def next_wakeup(self, keys: KeyFilter = EVERY_KEY) -> datetime | None: ...
    def now(self) -> datetime: ...
    def clock(self) -> datetime: ...


class Leases(Protocol):
    """The lease holder's other calls, each fenced, and the recovery of lost leases: effects,
    steps, signals, hand backs, flow control's holds and buckets, streamed cards."""

    def renew(self, fence: Fence, lease_seconds: float) -> datetime | None: ...
    def begin_effect(
        self,
        fence: Fence,
        *,
        in_flight: int | None,
        interrupt_private: bool,
        name: str | None = None,
        window: float | None = None,
        until_seconds: float | None = None,
    ) -> int | None: ...
    def end_effect(self, fence: Fence, *, in_flight: int | None, uncertain: bool) -> bool: ...
    def ended_with(self, fence: Fence) -> str | None: ...
    def claimed_with(self, worker_id: str, token: str) -> list[Row]: ...
    def hand_back(
        self, fence: Fence, *, delay: float = 0.0, error_type: str = ..., message: str = ...
    ) -> str | None: ...
    def hold_jobs(self, job_ids: list[int], until: datetime) -> int: ...
    def lock_partitions(self, keys: Iterable[str], *, skip_locked: bool = False) -> list[str]: ...
    def lease_state(self, job_id: int) -> Row | None: ...
    def expire_leases(self, *, max_attempts: int, limit: int) -> list[Row]: ...
    def job_signals(self, job_ids: list[int], *, interrupt_private: bool) -> dict[int, Row]: ...
    def job_steps(self, job_id: int) -> dict[str, Any]: ...
    def step_attempt(self, job_id: int, name: str) -> int | None: ...
    def turn_behind(
        self, job_id: int, partition_key: str, limit: int
    ) -> tuple[datetime, list[Row]]: ...
    def record_step(self, fence: Fence, *, name: str, result: str, took: float) -> bool: ...
    def take_tokens(
        self, keys: Sequence[str], rates: Sequence[float], bursts: Sequence[float]
    ) -> tuple[float, int] | None: ...
    def card_stream(self, job_id: int, name: str) -> Row | None: ...
    def save_card_stream(self, fence: Fence, name: str, state: Mapping[str, Any]) -> bool: ...


class Waits(Protocol):
    """Jobs that wait for a time or a signal (SPEC §9e): ``waits.py``."""

    def begin_wait(
        self,
        fence: Fence,
        *,
        name: str,
        key: str,
        seconds: float | None,
        hold_chat: bool,
        lease_seconds: float,
        ask: str | None = None,
    ) -> Row | None: ...
    def suspend(self, fence: Fence, *, name: str, message: str) -> str | None: ...
    def resolve_wait(self, wait_id: int, *, state: str, payload: str | None) -> bool: ...
    def send_signal(self, key: str, payload: str | None, keep_seconds: float | None) -> Row: ...
    def answer_question(self, key: str, open_id: str, choice: str, payload: str) -> str: ...
    def due_waits(self, limit: int) -> list[int]: ...
    def purge_expired_signals(self) -> int: ...
    def open_wait_of_job(self, job_id: int) -> Row | None: ...
    def job_wait(self, job_id: int, name: str) -> Row | None: ...
    def waits_of_jobs(self, job_ids: list[int]) -> dict[int, Row]: ...


class Operators(Protocol):
    """What operators do (admin, ``manage.py inbox``) and the chores that keep the ledger:
    transitions by hand, replays, retention."""

    def transition(
        self,
        name: str,
        job_id: int,
        *,
        from_statuses: list[str],
        resolution: str,
        message: str = "",
        from_step: str | None = None,
    ) -> Transition: ...
    def replay(
        self,
        job_id: int,
        *,
        resolution: str,
        from_step: str | None = None,
        forget_waits: str = "",
        forget_step: str = "",
    ) -> Transition: ...
    def unknown_past_retention(self, seconds: float) -> list[int]: ...
    def purge_completed(self, seconds: float, limit: int) -> int: ...
    def purge_idle_partitions(self, limit: int) -> int: ...
    def claim_chore(self, name: str, worker_id: str, interval: float) -> bool: ...
    def record_chore(self, name: str, result: str) -> None: ...


class Schedules(Protocol):
    """The schedules' rows and the work that is not a Feishu event: a tick enqueues its
    occurrences inside ``transaction()``; a task may be deferred and ranked."""

    def transaction(self) -> AbstractContextManager[None]: ...
    def schedule_states(self, names: list[str], now: datetime) -> list[Row]: ...
    def advance_schedule(
        self, name: str, *, old: datetime, new: datetime, now: datetime
    ) -> bool: ...
    def record_schedule_job(self, name: str, job_id: int, now: datetime) -> None: ...
    def set_schedule_paused(self, name: str, paused: bool) -> bool: ...
    def defer_and_rank_new_job(
        self, job_id: int, partition_key: str, run_after: datetime | None, priority: int
    ) -> None: ...


class Insights(Protocol):
    """What the dashboard, ``inbox stats`` and the metrics read, each at a bounded cost."""

    def count_unresolved(self) -> dict[str, int]: ...
    def count_completed(self) -> int: ...
    def estimate_jobs(self) -> int | None: ...
    def due_and_delayed(self) -> tuple[int, int]: ...
    def oldest_due(self) -> datetime | None: ...
    def blocked_and_running_partitions(self) -> dict[str, int]: ...
    def dead_tuples(self) -> list[Row]: ...
    def oldest_snapshot(self) -> Row | None: ...
    def replication(self) -> Row | None: ...


class Store(HotPath, Leases, Waits, Operators, Schedules, Insights, Protocol):
    """The operations a database offers the ledger, each one transaction, grouped by who
    uses them: a new store writes ``HotPath`` and ``Leases`` first (a worker runs), then
    ``Operators``, ``Schedules`` and ``Insights``."""


_stores: dict[str, Store | None] = {}


def store_for(vendor: str) -> Store | None:
    """The store for a database vendor (made once), or None for a database we do not run on."""
    if vendor not in _stores:
        _stores[vendor] = _make(vendor)
    return _stores[vendor]


def _make(vendor: str) -> Store | None:
    if vendor == "postgresql":
        from .postgres import PostgresStore

        return PostgresStore()
    if vendor == "sqlite":
        from .sqlite import SqliteStore

        return SqliteStore()
    return None


def store() -> Store:
    """The store for the default connection's database."""
    found = store_for(connection.vendor)
    if found is None:
        raise ConfigurationError(
            f"feishu_inbox supports PostgreSQL and SQLite, not {connection.vendor}.",
            fix="Point DATABASES['default'] at PostgreSQL (production) or SQLite.",
        )
    return found


def _prepare_connection(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """Let the store of a new connection's database prepare it (SQLite: its clock)."""
    found = store_for(connection.vendor)
    if found is not None:
        found.prepare_connection(connection)


connection_created.connect(_prepare_connection, dispatch_uid="feishu_inbox.store")


def _install_sqlite_probe() -> None:
    """SQLite's JSON probe, ours before any connection is made (``sqlite.install_json_probe``)."""
    from django.conf import settings

    engines = {str(db.get("ENGINE", "")) for db in settings.DATABASES.values()}
    if any("sqlite" in engine for engine in engines):
        from .sqlite import install_json_probe

        install_json_probe()


_install_sqlite_probe()

__all__ = [
    "EVERY_KEY",
    "Fence",
    "HotPath",
    "Insights",
    "KeyFilter",
    "Leases",
    "Operators",
    "Row",
    "Schedules",
    "SqlStore",
    "Store",
    "Transition",
    "Waits",
    "store",
]
