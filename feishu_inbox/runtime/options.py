"""What a worker is asked to do (``WorkerOptions``) and what the layers above hand it
(``Services``); the ``runworker`` command builds both."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from ..ledger import rules as ledger


@dataclass(frozen=True)
class WorkerOptions:
    concurrency: int = 1
    lease_seconds: float | None = None
    worker_id: str | None = None
    burst: bool = False
    max_jobs: int | None = None
    grace_seconds: float = 30.0
    #: Run only django.tasks tasks of these queues (``runworker --queue``); empty: every job.
    queues: tuple[str, ...] = ()
    #: Run every job but the tasks of these queues (``runworker --exclude-queues``).
    excluded_queues: tuple[str, ...] = ()
    #: The claims' filter for those queues (the start of their partitions' keys).
    keys: ledger.KeyFilter = ledger.EVERY_KEY
    #: A ``burst`` run gives up when the database has been unreachable this long (seconds);
    #: a long-running worker keeps trying.
    database_patience: float = 30.0

    def scope(self) -> str:
        """What a worker runs, in words (its start-up line)."""
        if self.queues:
            return f"only tasks of queues {', '.join(self.queues)}"
        if self.excluded_queues:
            return f"every job but tasks of queues {', '.join(self.excluded_queues)}"
        return "every job (events, schedules, tasks of every queue)"


class Ticked(Protocol):
    """What one tick of the schedules reports (``schedules.scheduler.TickResult``)."""

    @property
    def now(self) -> datetime: ...
    @property
    def fired(self) -> Sequence[Any]: ...
    @property
    def lost(self) -> Sequence[str]: ...
    @property
    def next_at(self) -> datetime | None: ...
    def seconds_until_next(self) -> float | None: ...


@dataclass(frozen=True)
class Services:
    """What the layers above the runtime hand a worker; the ``runworker`` command builds it.

    ``warm_up`` loads, before the first claim, what handlers will need (the Feishu SDK: seconds
    of imports, better spent before a lease runs) and says what it loaded ("": nothing);
    ``tick`` enqueues the declared schedules' due occurrences (``schedules.scheduler.tick``),
    None when no schedule is declared.
    """

    warm_up: Callable[[], str] = str
    tick: Callable[[str], Ticked] | None = None


def new_worker_id() -> str:
    """hostname:pid:random, unique per worker process start."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
