"""A worker's chores, each the body of a side thread: the wake-ups the database pushes
(``Listener``), the worker's heartbeat row and the shared retention purge (``Maintenance``),
and the declared schedules' ticks (``ScheduleTicker``)."""

from __future__ import annotations

import contextlib
import logging
import time

from django.db import connections

from ..conf import checked_settings
from ..ledger import retention, wakeups
from ..ledger import workers as worker_beats
from . import writes
from .options import Services
from .state import DATABASE_AWAY, Crew, check_connection

log = logging.getLogger("feishu_inbox.worker")

#: Longest sleep on PostgreSQL while the NOTIFY listener is healthy.
LISTEN_MAX_SLEEP = 30.0
#: How often, at most, a worker asks whether the shared retention purge is due (it runs once
#: per PURGE_INTERVAL across all workers).
MAINTENANCE_TICK = 30.0
#: The schedules thread wakes this long after an occurrence, so the database's clock has
#: surely reached it (the sleep is measured on this host's clock).
SCHEDULE_WAKE_SLACK = 0.005


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("feishu-inbox")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown"


#: The package's version, in each worker's heartbeat row.
VERSION = _version()


class Listener:
    """Wake-ups pushed by the database (PostgreSQL's NOTIFY); SQLite has none: we poll."""

    def __init__(self, crew: Crew, poll_interval: float) -> None:
        self._crew = crew
        self._poll_interval = poll_interval
        #: Notices arrive: the worker may sleep long (``longest_sleep``).
        self.listening = False

    def run(self) -> None:
        wakeups.listen(self.notified, self._crew.flags.done, self._set_listening)

    def longest_sleep(self) -> float:
        """How long a sleeper may wait for a notice: long while they arrive, else the poll."""
        return LISTEN_MAX_SLEEP if self.listening else self._poll_interval

    def notified(self, partition_key: str) -> None:
        """A NOTIFY: a head became claimable, or a job of one of our chats was cancelled or
        may be superseded (an operator's action and a private message also notify), or a
        schedule was paused, resumed or edited."""
        flags = self._crew.flags
        if partition_key == wakeups.STOPPING_NOTICE:
            return  # a worker stopping: only its own listener cared (it is done)
        if partition_key == wakeups.SCHEDULES_NOTICE:
            flags.schedules_changed.set()
            return
        if partition_key == wakeups.BATCHES_NOTICE:
            # A member ended: the next claim folds (SPEC §9f). A burst of ends wakes the main
            # loop once, until a fold takes the flag down.
            if not wakeups.batches_due.is_set():
                wakeups.batches_due.set()
                flags.wake.set()
            return
        flags.wake.set()
        held = self._crew.slots.held()
        if any(ctx.event.partition_key.startswith(partition_key) for ctx in held):
            flags.check_now.set()

    def _set_listening(self, listening: bool) -> None:
        self.listening = listening

    @staticmethod
    def wake_own() -> None:
        """Our listener waits on its socket: wake it, so it sees that the worker is done
        (when the database is away, its wait ends within its own timeout)."""
        with contextlib.suppress(*DATABASE_AWAY):
            wakeups.notify_stopping()


class Maintenance:
    """This worker's heartbeat row, and the shared chores: the retention purge, when it is
    this worker's turn. (Not in the heartbeat thread: a write that waits out a database blink
    must never delay the leases' renewals.)"""

    def __init__(self, crew: Crew) -> None:
        self._crew = crew

    def run(self) -> None:
        conf = checked_settings()
        done = self._crew.flags.done
        interval = conf.PURGE_INTERVAL  # None: purged from cron (manage.py inbox purge)
        purge_every = MAINTENANCE_TICK if interval is None else min(MAINTENANCE_TICK, interval)
        next_purge = time.monotonic() + purge_every
        self.beat(first=True)
        while not done.wait(min(conf.WORKER_BEAT_SECONDS, purge_every)):
            self.beat()
            if interval is None or time.monotonic() < next_purge:
                continue
            next_purge = time.monotonic() + purge_every
            try:
                check_connection()
                retention.purge_if_due(self._crew.worker_id)
            except DATABASE_AWAY as exc:
                log.warning("retention purge failed (%s); trying again later", exc)
                writes.drop_connection()
        connections.close_all()

    def beat(self, *, first: bool = False, last: bool = False) -> None:
        """Write this worker's heartbeat row (``ledger/workers.py``); a database that is away
        only delays it."""
        crew = self._crew
        try:
            check_connection()
            if first:
                worker_beats.started(
                    crew.worker_id,
                    concurrency=crew.options.concurrency,
                    queues=crew.options.queues,
                    excluded_queues=crew.options.excluded_queues,
                    version=VERSION,
                )
            elif last:
                worker_beats.stopped(crew.worker_id)
            else:
                worker_beats.beat(crew.worker_id, busy=len(crew.slots))
        except DATABASE_AWAY as exc:
            log.warning("worker %s: heartbeat row not written (%s)", crew.worker_id, exc)
            writes.drop_connection()


class ScheduleTicker:
    """Tick the schedules at each occurrence. Every worker does (no leader): the
    watermark's compare-and-set lets exactly one of them enqueue an occurrence."""

    def __init__(self, crew: Crew, services: Services, listener: Listener) -> None:
        self._crew = crew
        self._services = services
        self._listener = listener

    def run(self) -> None:
        flags = self._crew.flags
        if self._services.tick is None:
            return
        while not (flags.stop.is_set() or flags.done.is_set()):
            timeout = self.tick()
            flags.schedules_changed.wait(timeout)
            flags.schedules_changed.clear()
        connections.close_all()

    def tick(self) -> float:
        """One tick; returns how long to sleep: until the next occurrence, or until it is time
        to look at the schedules' paused state again (as long as the main loop sleeps)."""
        longest = self._listener.longest_sleep()
        tick = self._services.tick
        assert tick is not None  # the schedules thread runs only with one
        try:
            check_connection()
            ticked = tick(self._crew.worker_id)
        except DATABASE_AWAY as exc:
            log.warning("schedule tick failed (%s); trying again in a second", exc)
            writes.drop_connection()
            return min(longest, 1.0)
        except Exception:  # a bug must not end the thread: log it, try again later
            log.exception("schedule tick failed")
            return longest
        log.debug(
            "schedules ticked at %s: enqueued %s, enqueued first by another worker %s, next %s",
            ticked.now.isoformat(),
            [f.name for f in ticked.fired] or "none",
            ticked.lost or "none",
            ticked.next_at.isoformat() if ticked.next_at else "none",
        )
        if ticked.fired:
            self._crew.flags.wake.set()  # claim them now (SQLite has no NOTIFY)
        until = ticked.seconds_until_next()
        if until is None:
            return longest
        # Due now (run-all catching up, or another worker moved first): tick again at once.
        return min(longest, max(0.0, until) + SCHEDULE_WAKE_SLACK)
