"""The waits' operations (SPEC §9e), each one transaction, on both stores.

Lock order, as every operation of the ledger keeps it, with the signal's key in front: the key
(a transaction-scoped advisory lock on PostgreSQL; SQLite's one writer needs none), then the
partition row, then the job's and the wait's rows. A wait that finds no kept signal and a
signal that finds no open wait take the key's lock in turn, so they never miss each other.

A job that gives its chat back while it waits is moved to a partition of its own (its
``parked_key``: no partition row, so no claim ever sees it) and moved back when it resumes;
its receipt sequence (its id) never changes, so it goes back to its place in its chat.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import Fence

Row = dict[str, Any]


def fence_params(fence: Fence) -> dict[str, Any]:
    return {
        "job_id": fence.job_id,
        "worker_id": fence.worker_id,
        "token": fence.token,
        "partition_key": fence.partition_key,
    }


#: The partition a job that gave its chat back waits in (one of its own: nothing claims it).
PARKED_PREFIX = "\x1fwaiting:"


def parked_key(job_id: int) -> str:
    return f"{PARKED_PREFIX}{job_id}"


class WaitStore:
    """``SqlStore``'s waits (it runs the queries these name)."""

    if TYPE_CHECKING:

        def transaction(self) -> AbstractContextManager[None]: ...
        def rows(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]: ...
        def row(self, name: str, params: Mapping[str, Any] | None = None) -> Row | None: ...
        def execute(self, name: str, params: Mapping[str, Any] | None = None) -> int: ...
        def lock_partitions(
            self, keys: Iterable[str], *, skip_locked: bool = False
        ) -> list[str]: ...
        def resync_heads(self, keys: Iterable[str]) -> None: ...
        def record_attempts(
            self, job_ids: list[int], *, number_offset: int = 0, token: str = ""
        ) -> None: ...
        def notify(self, partition_key: str) -> None: ...

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
    ) -> Row | None:
        """The wait ``name`` of a running job (fenced: None once the lease is lost): its memo
        if it waited so before; else delivered at once by a kept signal of ``key``; else
        recorded open (the job then suspends: ``suspend``). Returns the wait's row."""
        with self.transaction():
            if key:
                self.row("lock_signal_key", {"key": key})
            if self.row("renew", {**fence_params(fence), "lease_seconds": lease_seconds}) is None:
                return None
            memo = self.row("job_wait", {"job_id": fence.job_id, "name": name})
            if memo is not None:
                return memo
            kept = self.row("take_kept_signal", {"key": key}) if key else None
            state = "open"
            if kept is not None:
                state = "delivered"
            elif seconds is not None and seconds <= 0:
                state = "timed_out"  # a sleep whose time has come: memoized, not waited
            self.row(
                "insert_wait",
                {
                    "job_id": fence.job_id,
                    "name": name,
                    "key": key,
                    "seconds": seconds,
                    "state": state,
                    "hold_chat": hold_chat,
                    "payload": None if kept is None else _json_text(kept["payload"]),
                    "partition_key": fence.partition_key,
                    "ask": ask,
                },
            )
            return self.row("job_wait", {"job_id": fence.job_id, "name": name})

    def suspend(self, fence: Fence, *, name: str, message: str) -> str | None:
        """The running job whose handler stopped at the open wait ``name`` starts to wait
        (fenced); when a signal or its time resolved the wait meanwhile, it is due again at
        once. Its chat's head follows; a chat given back is told to its workers. Returns the
        job's status after it, or None (lease lost, or an open effect: nothing changed)."""
        wait = self.row("job_wait", {"job_id": fence.job_id, "name": name})
        if wait is None:
            return None
        with self.transaction():
            if wait["key"]:
                self.row("lock_signal_key", {"key": wait["key"]})
            self.lock_partitions([fence.partition_key])
            parked = None if wait["hold_chat"] else parked_key(fence.job_id)
            params = {**fence_params(fence), "parked_key": parked, "message": message}
            if self.row("enter_wait", params) is None:
                return None
            self.record_attempts([fence.job_id], number_offset=1, token=fence.token)
            self.resync_heads([fence.partition_key])
            if parked is not None:
                self.notify(fence.partition_key)  # the chat's next job may run now
            again = self.row("job_wait", {"job_id": fence.job_id, "name": name})
            if again is not None and again["state"] != "open":  # resolved meanwhile
                self._resume(fence.job_id, fence.partition_key)
                return "queued"
        return "waiting"

    def resolve_wait(self, wait_id: int, *, state: str, payload: str | None) -> bool:
        """Resolve an open wait (``delivered`` with ``payload``, JSON text, or ``timed_out``)
        and resume its job if it waits; False when it was resolved already (or is gone)."""
        wait = self.row("wait_by_id", {"wait_id": wait_id})
        if wait is None:
            return False
        with self.transaction():
            if wait["key"]:
                self.row("lock_signal_key", {"key": wait["key"]})
            return self._resolve(wait, state=state, payload=payload)

    def send_signal(self, key: str, payload: str | None, keep_seconds: float | None) -> Row:
        """Deliver a signal to the oldest open wait of ``key``; with none, keep it for
        ``keep_seconds`` (None: refuse). Returns {"job_id": …} for a delivery, {"kept": True}
        for a kept signal, {} for a refusal (nothing changed)."""
        with self.transaction():
            self.row("lock_signal_key", {"key": key})
            wait = self.row("waiter_of_key", {"key": key})
            if wait is not None:
                self._resolve(wait, state="delivered", payload=payload)
                return {"job_id": wait["job_id"]}
            if keep_seconds is None:
                return {}
            self.execute("keep_signal", {"key": key, "payload": payload, "seconds": keep_seconds})
            return {"kept": True}

    def answer_question(self, key: str, open_id: str, choice: str, payload: str) -> str:
        """A click on a card question's button (``feishu_inbox.ask``), decided in one
        transaction under the key's lock: ``decided`` (the wait delivered ``payload``, its job
        resumes), else nothing changed and why: ``expired`` (no such question, or it timed
        out or was cancelled), ``not_yours`` (its ``who`` does not name ``open_id``),
        ``not_a_choice`` (a value its buttons never carried), ``already_decided``."""
        with self.transaction():
            self.row("lock_signal_key", {"key": key})
            wait = self.row("question_of_key", {"key": key})
            if wait is None:
                return "expired"
            rule = wait["ask"]
            if isinstance(rule, str | bytes):
                rule = json.loads(rule)
            rule = rule if isinstance(rule, dict) else {}
            who = rule.get("who")
            if isinstance(who, list) and open_id not in who:
                return "not_yours"
            choices = rule.get("choices")
            if isinstance(choices, list) and choice not in choices:
                return "not_a_choice"
            if wait["state"] == "delivered":
                return "already_decided"
            if wait["state"] != "open":
                return "expired"
            if not self._resolve(wait, state="delivered", payload=payload):
                return "already_decided"  # (not under the key's lock: never, in practice)
            return "decided"

    def _resolve(self, wait: Row, *, state: str, payload: str | None) -> bool:
        """In the caller's transaction (the key locked): the exactly-once gate, then the
        job's resume if it is waiting (a job still running toward its suspend finds the wait
        resolved there)."""
        chat = wait["partition_key"]
        self.execute("ensure_partition", {"partition_key": chat})
        self.lock_partitions([chat])
        params = {"wait_id": wait["id"], "state": state, "payload": payload}
        if self.row("resolve_wait", params) is None:
            return False
        self._resume(wait["job_id"], chat)
        return True

    def _resume(self, job_id: int, chat: str) -> None:
        """The waiting job back to its chat, due now (the chat's row locked by the caller)."""
        if self.row("resume_job", {"job_id": job_id, "partition_key": chat}) is not None:
            self.execute("resync_head_unless_running", {"partition_key": chat})
            self.notify(chat)

    def due_waits(self, limit: int) -> list[int]:
        return [int(r["id"]) for r in self.rows("due_waits", {"limit": limit})]

    def purge_expired_signals(self) -> int:
        with self.transaction():
            return self.execute("purge_expired_signals")

    def open_wait_of_job(self, job_id: int) -> Row | None:
        return self.row("open_wait_of_job", {"job_id": job_id})

    def job_wait(self, job_id: int, name: str) -> Row | None:
        return self.row("job_wait", {"job_id": job_id, "name": name})

    def waits_of_jobs(self, job_ids: list[int]) -> dict[int, Row]:
        if not job_ids:
            return {}
        return {int(r["job_id"]): r for r in self.rows("waits_of_jobs", {"job_ids": job_ids})}

    def close_waits(self, job_id: int) -> None:
        """In an operator's transaction that ended a waiting job: its open waits close, and a
        job that had given its chat back returns to it."""
        for closed in self.rows("cancel_waits", {"job_id": job_id}):
            self.execute(
                "restore_partition", {"job_id": job_id, "partition_key": closed["partition_key"]}
            )


def _json_text(value: Any) -> str | None:
    """A JSON column's value, read back, as the JSON text the insert takes."""
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
