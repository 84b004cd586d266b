"""The PostgreSQL store: row locks with SKIP LOCKED, the server's clock, NOTIFY on commit.

Enqueue, claim and the end of an attempt are one stored-function call each (one round trip,
plans cached in the session); a worker's finish and its next claim share one statement.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection

from .base import Fence, Row, SqlStore, fence_params
from .schema import NOTIFY_CHANNEL

log = logging.getLogger("feishu_inbox.worker")

#: Connection parameters of Django's that psycopg.connect does not take.
_NOT_FOR_LISTEN = ("cursor_factory", "context", "prepare_threshold", "client_encoding")


class PostgresStore(SqlStore):
    query_file = "postgres.sql"
    list_parameters = {
        "job_ids": "(SELECT unnest(%(job_ids)s::bigint[]))",
        "keys": "(SELECT unnest(%(keys)s::text[]))",
        "statuses": "(SELECT unnest(%(statuses)s::text[]))",
        "prefixes": "(SELECT unnest(%(prefixes)s::text[]) AS prefix)",
    }

    def listen(
        self,
        wake: Callable[[str], None],
        done: threading.Event,
        listening: Callable[[bool], None],
    ) -> None:
        """LISTEN on its own connection; reconnects after a second when it breaks."""
        import psycopg

        params = {
            k: v for k, v in connection.get_connection_params().items() if k not in _NOT_FOR_LISTEN
        }
        while not done.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    listening(True)
                    wake("")  # anything enqueued before we listened
                    while not done.is_set():
                        for note in conn.notifies(timeout=5.0, stop_after=1):
                            wake(note.payload)
            except psycopg.Error as exc:
                listening(False)
                log.warning("LISTEN connection failed (%s); polling until it is back", exc)
                done.wait(1.0)
        listening(False)

    def notify(self, partition_key: str) -> None:
        self.execute("notify", {"partition_key": partition_key})

    def enqueue(self, job: dict[str, Any]) -> Row:
        return self.rows("enqueue", job)[0]

    def claim(
        self,
        worker_id: str,
        token: str,
        lease_seconds: float,
        limit: int,
        key_prefixes: Sequence[str] = (),
    ) -> list[Row]:
        params = {
            "worker_id": worker_id,
            "token": token,
            "lease_seconds": lease_seconds,
            "limit": limit,
        }
        if key_prefixes:  # a worker of some task queues only (tasks.py): its own function
            return self.rows("claim_in_queues", {**params, "prefixes": list(key_prefixes)})
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
        key_prefixes: Sequence[str] = (),
    ) -> tuple[str | None, list[Row]]:
        params = {
            **fence_params(fence),
            "error_type": error_type,
            "new_token": token,
            "lease_seconds": lease_seconds,
            "limit": limit,
        }
        if key_prefixes:  # a worker of some task queues only (tasks.py): its own function
            found = self.rows(
                "finish_and_claim_in_queues", {**params, "prefixes": list(key_prefixes)}
            )
        else:
            found = self.rows("finish_and_claim", params)
        status = found[0]["ended_status"]
        claimed = [r for r in found if r["id"] is not None]  # LEFT JOIN: NULLs when none
        return (None if status is None else str(status)), claimed

    def estimate_jobs(self) -> int | None:
        return int(self.rows("estimate_jobs")[0]["n"])
