"""What both stores share: running named queries, and the operations composed of them.

Each operation here is one transaction of queries that both ``.sql`` files define under the same
names; where the databases differ, the difference is in the SQL, not here. The PostgreSQL store
replaces the hot operations (enqueue, claim, end of attempt) with one stored-function call each.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from django.db import connection, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from .queries import Query, load
from .schema import COMPLETED, SCHEDULES_NOTICE
from .waits import WaitStore, fence_params

#: A row read by a named query: column name → value.
Row = dict[str, Any]


class Fence(Protocol):
    """What a lease holder proves on every call (``ledger.Lease``)."""

    @property
    def job_id(self) -> int: ...
    @property
    def worker_id(self) -> str: ...
    @property
    def token(self) -> str: ...
    @property
    def partition_key(self) -> str: ...


@dataclass(frozen=True)
class KeyFilter:
    """The partitions a worker's claims take, by the start of their key: every one (no
    prefixes), only those that start with one of ``prefixes`` (``runworker --queue``), or,
    ``excluding``, every one but those (``runworker --exclude-queues``)."""

    prefixes: tuple[str, ...] = ()
    excluding: bool = False

    def __bool__(self) -> bool:
        return bool(self.prefixes)

    def params(self) -> dict[str, Any]:
        """The filtered queries' parameters (``*_in_queues``)."""
        return {"prefixes": list(self.prefixes), "excluding": self.excluding}


#: The claims of a worker of every job.
EVERY_KEY = KeyFilter()


@dataclass(frozen=True)
class Transition:
    """What an operator transition found: no such job, a job in another state, or done."""

    found: bool
    changed: bool = False
    #: The job's status after the transition, or when it was refused.
    status: str = ""
    #: Another live job of the same event stood in the way (replay).
    duplicate: bool = False
    #: The job's id after the transition (a replay may move it to the end of its partition).
    job_id: int = 0
    #: The step to run again from is not one of the job's (nothing changed).
    unknown_step: bool = False


def _json(value: Any) -> Any:
    """A JSON column read by raw SQL: text on SQLite (and with Django's psycopg loaders)."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def aware(value: Any) -> Any:
    """A timestamp read by raw SQL as an aware datetime (SQLite gives text or naive UTC)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime) and value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value


class SqlStore(WaitStore):
    """Runs the named queries of one ``.sql`` file; composes the operations both share."""

    #: The database's own queries, beside ``common.sql``.
    query_file = ""
    #: How this database reads a list parameter: ``{job_ids}`` and ``{keys}`` in the queries.
    list_parameters: dict[str, str] = {}

    def __init__(self) -> None:
        self.queries: dict[str, Query] = load(
            self.query_file, tuple(sorted(self.list_parameters.items()))
        )

    # --- how statements run (each store says how its database takes them) --------------------

    def transaction(self) -> AbstractContextManager[None]:
        """One ledger transaction."""
        return transaction.atomic()

    def write(self) -> AbstractContextManager[None]:
        """A single writing statement outside a transaction (autocommit)."""
        return _nothing()

    def adapt(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """Parameters as the database driver takes them."""
        return params

    def rows(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        with connection.cursor() as cursor:
            cursor.execute(self.queries[name].sql, self.adapt(params or {}))
            if cursor.description is None:
                return []
            columns = [c[0] for c in cursor.description]
            return [dict(zip(columns, values, strict=True)) for values in cursor.fetchall()]

    def row(self, name: str, params: Mapping[str, Any] | None = None) -> Row | None:
        found = self.rows(name, params)
        return found[0] if found else None

    def execute(self, name: str, params: Mapping[str, Any] | None = None) -> int:
        with connection.cursor() as cursor:
            cursor.execute(self.queries[name].sql, self.adapt(params or {}))
            return int(cursor.rowcount)

    def prepare_connection(self, connection: BaseDatabaseWrapper) -> None:
        """Called for each new connection to this database."""

    def notify(self, partition_key: str) -> None:
        """Wake idle workers when the transaction commits (PostgreSQL); SQLite workers poll."""

    def listen(
        self,
        wake: Callable[[str], None],
        done: threading.Event,
        listening: Callable[[bool], None],
    ) -> None:
        """Call ``wake(partition key)`` on every notification until ``done``; returns at once
        where the database sends none.

        ``listening(True)`` says wake-ups arrive (a worker may then sleep long),
        ``listening(False)`` that they stopped (it polls again).
        """

    def settings_problems(self, settings_dict: Mapping[str, Any]) -> list[str]:
        """What the database's Django settings lack for a web process and workers at once."""
        return []

    # --- steps shared by several operations (call inside a transaction) -----------------------

    def lock_partitions(self, keys: Iterable[str], *, skip_locked: bool = False) -> list[str]:
        keys = sorted(set(keys))
        if not keys:
            return []
        query = "lock_free_partitions" if skip_locked else "lock_partitions"
        return [r["key"] for r in self.rows(query, {"keys": keys})]

    def resync_heads(self, keys: Iterable[str]) -> None:
        for key in sorted(set(keys)):
            self.execute("resync_head", {"partition_key": key})

    def record_attempts(
        self, job_ids: list[int], *, number_offset: int = 0, token: str = ""
    ) -> None:
        if job_ids:
            self.execute(
                "record_attempts",
                {"job_ids": job_ids, "number_offset": number_offset, "token": token},
            )

    # --- the lease holder ------------------------------------------------------------------

    def renew(self, fence: Fence, lease_seconds: float) -> datetime | None:
        with self.write():
            found = self.row("renew", {**fence_params(fence), "lease_seconds": lease_seconds})
        return None if found is None else aware(found["lease_until"])

    def begin_effect(
        self,
        fence: Fence,
        *,
        in_flight: int | None,
        interrupt_private: bool,
        name: str | None = None,
        window: float | None = None,
        until_seconds: float | None = None,
    ) -> int | None:
        """The job's replay generation once the effect is recorded as begun; None when
        refused. ``name``, ``window`` and ``until_seconds`` (window less margin, seconds)
        describe an idempotent effect; None for one without a key."""
        params = {
            "in_flight": in_flight,
            "interrupt_private": interrupt_private,
            "name": name,
            "window": window,
            "until_seconds": until_seconds,
        }
        with self.write():
            found = self.row("begin_effect", {**fence_params(fence), **params})
        return None if found is None else int(found["replays"])

    def end_effect(self, fence: Fence, *, in_flight: int | None, uncertain: bool) -> bool:
        params = {"in_flight": in_flight, "uncertain": uncertain}
        with self.write():
            return self.row("end_effect", {**fence_params(fence), **params}) is not None

    def ended_with(self, fence: Fence) -> str | None:
        found = self.row("ended_with", fence_params(fence))
        return None if found is None else str(found["status"])

    def claimed_with(self, worker_id: str, token: str) -> list[Row]:
        return self.rows("claimed_with", {"worker_id": worker_id, "token": token})

    def hand_back(
        self,
        fence: Fence,
        *,
        delay: float = 0.0,
        error_type: str = "HandedBack",
        message: str = "The worker shut down.",
    ) -> str | None:
        params = {**fence_params(fence), "delay": delay, "error_type": error_type}
        with self.transaction():
            self.lock_partitions([fence.partition_key])
            found = self.row("hand_back", {**params, "message": message})
            if found is None:
                return None
            self.record_attempts([fence.job_id], number_offset=1, token=fence.token)
            self.resync_heads([fence.partition_key])
            self.notify(fence.partition_key)
        return str(found["status"])

    def hold_jobs(self, job_ids: list[int], until: datetime) -> int:
        """Make these queued or waiting jobs due at ``until`` (an operator's pause, far away;
        its resume, now), their partitions' heads following; how many moved."""
        if not job_ids:
            return 0
        with self.transaction():
            keys = [
                r["partition_key"] for r in self.rows("partitions_of_jobs", {"job_ids": job_ids})
            ]
            self.lock_partitions(keys)
            moved = self.rows("hold_jobs", {"job_ids": job_ids, "until": until})
            self.resync_heads(keys)
            for key in keys:
                self.notify(key)
        return len(moved)

    def lease_state(self, job_id: int) -> Row | None:
        return self.row("lease_state", {"job_id": job_id})

    # --- recovery, operators, retention ----------------------------------------------------

    def expire_leases(self, *, max_attempts: int, limit: int) -> list[Row]:
        # The usual case: nothing expired. One read of the running jobs (as many as the workers'
        # slots), through the status index, without locking anything.
        if not self.rows("expired_leases", {"limit": 1}):
            return []
        with self.transaction():
            candidates = self.rows("expired_leases", {"limit": limit})
            # Partitions another transaction holds are left for the next sweep.
            locked = set(
                self.lock_partitions((r["partition_key"] for r in candidates), skip_locked=True)
            )
            job_ids = [r["id"] for r in candidates if r["partition_key"] in locked]
            if not job_ids:
                return []
            expired = self.rows(
                "expire_lease_jobs", {"job_ids": job_ids, "max_attempts": max_attempts}
            )
            self.record_attempts([r["id"] for r in expired])
            self.resync_heads(r["partition_key"] for r in expired)
        return expired

    def transition(
        self,
        name: str,
        job_id: int,
        *,
        from_statuses: list[str],
        resolution: str,
        message: str = "",
        from_step: str | None = None,
    ) -> Transition:
        """Apply operator transition ``name`` if the job is in one of ``from_statuses``; one
        transaction, the partition row locked first. ``from_step``: that step and every step
        that started after it are forgotten with it."""
        with self.transaction():
            key = self._lock_partition_of(job_id)
            if key is None:
                return Transition(found=False)
            if not self._has_step(job_id, from_step):
                return Transition(found=True, unknown_step=True, job_id=job_id)
            params = {
                "job_id": job_id,
                "statuses": from_statuses,
                "resolution": resolution,
                "message": message,
            }
            changed = self.row(name, params)
            if changed is None:
                return Transition(found=True, status=self._status(job_id), job_id=job_id)
            self._forget_steps(job_id, from_step)
            if changed["status"] == COMPLETED:  # a waiting job cancelled: its waits close
                self.close_waits(job_id)
            self.resync_heads([key])
            self.notify(key)
        return Transition(found=True, changed=True, status=changed["status"], job_id=job_id)

    def replay(
        self,
        job_id: int,
        *,
        resolution: str,
        from_step: str | None = None,
        forget_waits: str = "",
        forget_step: str = "",
    ) -> Transition:
        """completed → queued, at its place in its partition if no later job has run, else
        as its newest job (a new id); refused while another live job has the same event.
        ``forget_waits``: the key prefix of waits its new run makes afresh; ``forget_step``:
        a step its new run records again."""
        with self.transaction():
            key = self._lock_partition_of(job_id)
            if key is None:
                return Transition(found=False)
            status = self._status(job_id)
            if status != COMPLETED:
                return Transition(found=True, status=status, job_id=job_id)
            if not self._has_step(job_id, from_step):
                return Transition(found=True, unknown_step=True, job_id=job_id)
            if self.row("replay_duplicate", {"job_id": job_id}) is not None:
                return Transition(found=True, status=status, duplicate=True, job_id=job_id)
            if self.row("replay_later_ran", {"job_id": job_id, "partition_key": key}):
                new_id = int(self.rows("next_job_id")[0]["id"])
                moved = {"job_id": job_id, "new_id": new_id}
                self.execute("move_job", moved)
                self.execute("move_attempts", moved)
                self.execute("move_steps", moved)
                self.execute("move_waits", moved)
                self.execute("move_card_streams", moved)
                self.execute("move_children", moved)
                job_id = new_id
            self._forget_steps(job_id, from_step)
            if forget_waits:
                self.execute(
                    "forget_waits_of_key", {"job_id": job_id, "prefix": f"{forget_waits}%"}
                )
            if forget_step:
                self.execute("forget_step", {"job_id": job_id, "name": forget_step})
            replayed = self.row("replay", {"job_id": job_id, "resolution": resolution})
            assert replayed is not None  # completed, and the partition row is locked
            self.resync_heads([key])
            self.notify(key)
        return Transition(found=True, changed=True, status=replayed["status"], job_id=job_id)

    def _lock_partition_of(self, job_id: int) -> str | None:
        found = self.row("job_partition", {"job_id": job_id})
        if found is None:
            return None
        self.lock_partitions([found["partition_key"]])
        return str(found["partition_key"])

    def _has_step(self, job_id: int, name: str | None) -> bool:
        """No step named, or the job has one of that name."""
        return name is None or self.step_attempt(job_id, name) is not None

    def _forget_steps(self, job_id: int, from_step: str | None) -> None:
        if from_step is not None:
            self.execute("forget_waits", {"job_id": job_id, "from_step": from_step})
            self.execute("forget_steps", {"job_id": job_id, "from_step": from_step})

    def _status(self, job_id: int) -> str:
        found = self.row("job_status", {"job_id": job_id})
        return str(found["status"]) if found else ""

    def job_signals(self, job_ids: list[int], *, interrupt_private: bool) -> dict[int, Row]:
        """For each running job: ``cancel_requested`` and ``superseded``."""
        if not job_ids:
            return {}
        params = {"job_ids": job_ids, "interrupt_private": interrupt_private}
        return {r["id"]: r for r in self.rows("job_signals", params)}

    def unknown_past_retention(self, seconds: float) -> list[int]:
        return [r["id"] for r in self.rows("unknown_past_retention", {"seconds": seconds})]

    def purge_completed(self, seconds: float, limit: int) -> int:
        with self.transaction():
            job_ids = [
                r["id"]
                for r in self.rows("completed_past_retention", {"seconds": seconds, "limit": limit})
            ]
            if job_ids:
                self.execute("delete_attempts", {"job_ids": job_ids})
                self.execute("delete_steps", {"job_ids": job_ids})
                self.execute("delete_waits", {"job_ids": job_ids})
                self.execute("delete_card_streams", {"job_ids": job_ids})
                self.execute("delete_jobs", {"job_ids": job_ids})
        return len(job_ids)

    def purge_idle_partitions(self, limit: int) -> int:
        with self.transaction():
            keys = [r["key"] for r in self.rows("idle_partitions", {"limit": limit})]
            if keys:
                self.execute("delete_idle_partitions", {"keys": keys})
        return len(keys)

    # --- steps (SPEC §7) ----------------------------------------------------------------------

    def job_steps(self, job_id: int) -> dict[str, Any]:
        """The job's memoized step results, by step name."""
        return {r["name"]: _json(r["result"]) for r in self.rows("job_steps", {"job_id": job_id})}

    def step_attempt(self, job_id: int, name: str) -> int | None:
        found = self.row("step_attempt", {"job_id": job_id, "name": name})
        return None if found is None else int(found["attempt"])

    def record_step(self, fence: Fence, *, name: str, result: str, took: float) -> bool:
        """Write a step's result, fenced; False when the lease is lost or it is recorded."""
        params = {**fence_params(fence), "name": name, "result": result, "took": took}
        with self.write():
            return self.row("record_step", params) is not None

    def card_stream(self, job_id: int, name: str) -> Row | None:
        """The job's streamed reply ``name`` (of its current replay generation), or None."""
        return self.row("card_stream", {"job_id": job_id, "name": name})

    def save_card_stream(self, fence: Fence, name: str, state: Mapping[str, Any]) -> bool:
        """Write a streamed reply's state, fenced; False when the lease is lost."""
        with self.write():
            params = {**fence_params(fence), "name": name, **state}
            return self.row("save_card_stream", params) is not None

    def claim_chore(self, name: str, worker_id: str, interval: float) -> bool:
        """Take a shared chore if it is due (one worker wins); False when not due."""
        with self.write():
            self.execute("ensure_chore", {"name": name})
            params = {"name": name, "worker_id": worker_id, "interval": interval}
            return self.row("claim_chore", params) is not None

    def record_chore(self, name: str, result: str) -> None:
        with self.write():
            self.execute("record_chore", {"name": name, "result": result})

    # --- reads -------------------------------------------------------------------------------

    def now(self) -> datetime:
        return aware(self.rows("now")[0]["now"])

    def turn_behind(
        self, job_id: int, partition_key: str, limit: int
    ) -> tuple[datetime, list[Row]]:
        """The clock, and the unresolved jobs behind ``job_id`` in its partition (id,
        event_type, payload, received_at, status), oldest first: one statement."""
        found = self.rows(
            "turn_behind", {"job_id": job_id, "partition_key": partition_key, "limit": limit}
        )
        rows = [
            {**r, "payload": _json(r["payload"]), "received_at": aware(r["received_at"])}
            for r in found
            if r["id"] is not None
        ]
        return aware(found[0]["now"]), rows

    def clock(self) -> datetime:
        """The database's clock as it runs, inside a transaction too (``now`` is its start)."""
        return aware(self.rows("clock")[0]["now"])

    def next_wakeup(self, keys: KeyFilter = EVERY_KEY) -> datetime | None:
        """The earliest time a claim may find work (``keys``: a claim of only some
        partitions, as ``claim`` takes)."""
        if keys:
            found = self.rows("next_wakeup_in_queues", keys.params())
            return aware(found[0]["wakeup"])
        return aware(self.rows("next_wakeup")[0]["wakeup"])

    # --- django.tasks tasks (tasks/) ----------------------------------------------------------

    def defer_and_rank_new_job(
        self, job_id: int, partition_key: str, run_after: datetime | None, priority: int
    ) -> None:
        """A task enqueued with ``run_after`` or a priority: the job just stored (inside the
        enqueue's transaction) and, when it is its partition's head, the partition wait until
        then (None: due now) and carry the priority."""
        params = {
            "job_id": job_id,
            "partition_key": partition_key,
            "run_after": run_after,
            "priority": priority,
        }
        self.execute("defer_and_rank_job", params)
        self.execute("defer_and_rank_head", params)

    def count_unresolved(self) -> dict[str, int]:
        return {r["status"]: int(r["n"]) for r in self.rows("count_unresolved")}

    def count_completed(self) -> int:
        return int(self.rows("count_completed")[0]["n"])

    def estimate_jobs(self) -> int | None:
        """The planner's row estimate of the job table, where the database keeps one."""
        return None

    def dead_tuples(self) -> list[Row]:
        """Each ledger table's dead and live row versions (``table_name``, ``dead``, ``live``,
        ``vacuumed_at``), where the database keeps row versions to vacuum."""
        return []

    def oldest_snapshot(self) -> Row | None:
        """The age of what holds vacuum back (``seconds``, ``xids``), where there is one."""
        return None

    def replication(self) -> Row | None:
        """The standbys a commit now would reach (the ``replication`` query), where the
        database streams to any."""
        return None

    def take_tokens(
        self, keys: Sequence[str], rates: Sequence[float], bursts: Sequence[float]
    ) -> tuple[float, int] | None:
        """One token from each bucket, all or none, in one statement: (the wait, the rows
        found), or None where the database runs the steps one by one (``ledger/buckets.py``:
        SQLite, whose transactions are local)."""
        return None

    def due_and_delayed(self) -> tuple[int, int]:
        found = self.rows("due_and_delayed")[0]
        return int(found["due"]), int(found["delayed"])

    def oldest_due(self) -> datetime | None:
        return aware(self.rows("oldest_due")[0]["due_at"])

    def blocked_and_running_partitions(self) -> dict[str, int]:
        return {r["head_state"]: int(r["n"]) for r in self.rows("blocked_and_running_partitions")}

    # --- schedules (SPEC §8; their rules are in schedules/scheduler.py) ----------------------

    def schedule_states(self, names: list[str], now: datetime) -> list[Row]:
        """The rows of these schedules; one missing is created first, its watermark ``now``."""
        found = self.rows("schedule_states", {"keys": names})
        missing = sorted(set(names) - {r["name"] for r in found})
        if missing:
            with self.write():
                for name in missing:
                    self.execute("ensure_schedule", {"name": name, "now": now})
            found = self.rows("schedule_states", {"keys": names})
        return [
            {
                **r,
                "watermark": aware(r["watermark"]),
                "last_fired_at": aware(r["last_fired_at"]),
                "paused": bool(r["paused"]),
            }
            for r in found
        ]

    def advance_schedule(self, name: str, *, old: datetime, new: datetime, now: datetime) -> bool:
        """Move the watermark from ``old`` to ``new`` (compare-and-set); call it inside
        ``transaction()``, before enqueueing the occurrences up to ``new``."""
        params = {"name": name, "old": old, "new": new, "now": now}
        return self.row("advance_schedule", params) is not None

    def record_schedule_job(self, name: str, job_id: int, now: datetime) -> None:
        self.execute("record_schedule_job", {"name": name, "job_id": job_id, "now": now})

    def set_schedule_paused(self, name: str, paused: bool) -> bool:
        """Pause or resume; False when it already was. Wakes the workers' schedule ticks."""
        with self.write():
            changed = self.row("set_schedule_paused", {"name": name, "paused": paused})
            if changed is not None:
                self.notify(SCHEDULES_NOTICE)
        return changed is not None


@contextmanager
def _nothing() -> Iterator[None]:
    yield
