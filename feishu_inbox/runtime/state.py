"""What the worker's rooms share: its flags, its slots, whether the database answers, and the
outcomes counted so far (``Crew``, one per worker, handed to each room)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from django.db import DatabaseError, InterfaceError, close_old_connections

from ..ledger.rules import KeyFilter
from . import writes
from .options import WorkerOptions
from .pools import Slots

log = logging.getLogger("feishu_inbox.worker")

#: What a claim or a hand back meets when the database is away. Django's InterfaceError (a
#: connection the driver found closed) is not a DatabaseError; the handlers' writes try both
#: again (``writes.TRANSIENT_ERRORS``), and so do these.
DATABASE_AWAY = (DatabaseError, InterfaceError)
#: The first wait before claiming again while the database is away (doubled up to 1 s).
CLAIM_RETRY_FIRST_DELAY = 0.1
#: How often a thread hands its connection to Django's ``close_old_connections`` (which drops
#: an obsolete or broken connection; with CONN_HEALTH_CHECKS the next query then pings the
#: server). Per job, the ping would cost a round trip each time; a broken connection is also
#: dropped at once after any DatabaseError.
CONNECTION_CHECK_INTERVAL = 1.0

_checked = threading.local()


def check_connection(force: bool = False) -> None:
    """This thread's connection, checked at most once per CONNECTION_CHECK_INTERVAL."""
    now = time.monotonic()
    if force or now - getattr(_checked, "at", 0.0) >= CONNECTION_CHECK_INTERVAL:
        close_old_connections()
        _checked.at = now


@dataclass(eq=False)
class Flags:
    """The worker's events: who sets each, and who waits on it."""

    #: Something to claim or to write: a slot freed, a NOTIFY, a batch due (the main loop).
    wake: threading.Event = field(default_factory=threading.Event)
    #: No more claims (a signal, ``stop``, a side thread that died, a --burst that gave up).
    stop: threading.Event = field(default_factory=threading.Event)
    #: The side threads end.
    done: threading.Event = field(default_factory=threading.Event)
    #: A NOTIFY named a running job's chat: the heartbeat looks for signals now.
    check_now: threading.Event = field(default_factory=threading.Event)
    #: A schedule was paused, resumed or edited: the schedule ticker looks again.
    schedules_changed: threading.Event = field(default_factory=threading.Event)

    def stop_claiming(self) -> None:
        self.stop.set()
        self.wake.set()
        self.schedules_changed.set()

    def end(self) -> None:
        """Every side thread's wait ends: they exit."""
        self.done.set()
        self.wake.set()
        self.check_now.set()
        self.schedules_changed.set()


class Database:
    """Whether the database answers the worker's claims, and how long to wait before the next
    one while it does not (SPEC §6)."""

    def __init__(self, options: WorkerOptions, stop: threading.Event) -> None:
        self._options = options
        self._stop = stop
        #: Seconds to wait before the next claim while the database is away (0: it is not).
        self.backoff = 0.0
        self.away_since: float | None = None
        #: A burst run gave up on an unreachable database (``Worker.run`` returns 1).
        self.gave_up = False

    def away(self, doing: str, exc: Exception, *, since: float | None = None) -> None:
        """``doing`` failed with ``exc``; ``since``: when the call that failed began (a call
        may wait a while to fail). A --burst run gives up past its patience."""
        self.backoff = min(max(self.backoff * 2, CLAIM_RETRY_FIRST_DELAY), 1.0)
        if self.away_since is None:
            self.away_since = time.monotonic() if since is None else since
        away = time.monotonic() - self.away_since
        if self._options.burst and away >= self._options.database_patience:
            self.gave_up = True
            log.error(
                "%s failed (%s); the database has been unreachable for %.0fs: a --burst run "
                "gives up (its jobs wait for the next run)",
                doing,
                exc,
                away,
            )
            self._stop.set()
        else:
            log.error("%s failed (%s); trying again in %.2fs", doing, exc, self.backoff)
        writes.drop_connection()

    def back(self) -> None:
        """A claim reached the database."""
        self.backoff = 0.0
        self.away_since = None


@dataclass(eq=False)
class Crew:
    """One worker's shared state, handed to each of its rooms."""

    options: WorkerOptions
    worker_id: str
    lease_seconds: float
    flags: Flags
    slots: Slots
    database: Database
    #: Attempts ended so far, by outcome (the worker's last log line).
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def keys(self) -> KeyFilter:
        """The claims' filter (``WorkerOptions.keys``)."""
        return self.options.keys

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
