"""The Worker: claims jobs into N slots, runs handlers, renews leases, sleeps until work.

Threads:
- the main thread claims (up to the free slots in one call), then sleeps on an event that a
  finished job, a PostgreSQL NOTIFY, a due time or a signal sets;
- N handler threads (daemon, each with its own persistent database connection); ``async def``
  handlers run on one event loop thread instead, so sync ones never block it;
- a heartbeat thread renews leases every third of the lease and looks for a newer private
  message at least twice a second for every running private job (SPEC §4); a renewal refused
  marks the job lost and frees its slot;
- a listener thread waits for the database's wake-ups (PostgreSQL: LISTEN on its own
  connection); on SQLite it ends at once and the main thread polls;
- a maintenance thread runs the shared retention purge when it is this worker's turn;
- a schedules thread ticks the declared schedules: it sleeps until the next occurrence of any
  of them (or a pause/resume notification), then enqueues what is due (``Services.tick``).

When the database blinks, every write about a job is tried again (``writes.write``) while
its lease lasts, and claims come back after a backoff of at most a second (SPEC §6).

Signals: the first SIGTERM/SIGINT stops claiming and lets handlers finish for ``grace_seconds``,
then hands back the jobs that started no effect; a second one exits at once (leases expire).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from typing import Any, Protocol

from django.db import DatabaseError, InterfaceError, close_old_connections, connections

from .. import telemetry, tracing
from ..conf import checked_settings
from ..errors import Cancelled, Deferred, InvalidState, LeaseLost, Superseded, TimedOut
from ..ledger import limits, pauses, retention
from ..ledger import rules as ledger
from ..ledger import workers as worker_beats
from ..ledger.retry import RetryAfter, RetryAt
from ..ledger.stats import database_now, seconds_until_wakeup
from ..store import store
from ..store.schema import SCHEDULES_NOTICE, STOPPING_NOTICE
from . import context, handlers, interrupts, registry, writes
from . import limits as rate_limits
from .batching import BUFFER_PATIENCE, Batch, Ended
from .finishing import Finish, FinishGroup

log = logging.getLogger("feishu_inbox.worker")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("feishu-inbox")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown"


#: The package's version, in each worker's heartbeat row.
VERSION = _version()

#: Longest sleep on PostgreSQL while the NOTIFY listener is healthy.
LISTEN_MAX_SLEEP = 30.0
#: Shortest sleep: a due time in the past (another claimer holds it) must not make us spin.
MIN_SLEEP = 0.05
#: The heartbeat's longest sleep: how late a newer private message may be noticed (SPEC §4).
HEARTBEAT_TICK = 0.5
#: The first wait before claiming again while the database is away (doubled up to 1 s).
CLAIM_RETRY_FIRST_DELAY = 0.1
#: How long a worker that stops waits for its threads to end (seconds).
SHUTDOWN_WAIT = 5.0
#: How often, at most, a worker asks whether the shared retention purge is due (it runs once
#: per PURGE_INTERVAL across all workers).
MAINTENANCE_TICK = 30.0
#: A handler past its timeout has this long to reach a checkpoint before the worker stops it.
TIMEOUT_GRACE = 1.0
#: The schedules thread wakes this long after an occurrence, so the database's clock has
#: surely reached it (the sleep is measured on this host's clock).
SCHEDULE_WAKE_SLACK = 0.005


_checked = threading.local()
#: How often a thread hands its connection to Django's ``close_old_connections`` (which drops
#: an obsolete or broken connection; with CONN_HEALTH_CHECKS the next query then pings the
#: server). Per job, the ping would cost a round trip each time; a broken connection is also
#: dropped at once after any DatabaseError.
CONNECTION_CHECK_INTERVAL = 1.0
#: What a claim or a hand back meets when the database is away. Django's InterfaceError (a
#: connection the driver found closed) is not a DatabaseError; the handlers' writes try both
#: again (``writes.TRANSIENT_ERRORS``), and so do these.
DATABASE_AWAY = (DatabaseError, InterfaceError)


#: How long a thread that wants the GIL waits for a busy one to give it up (CPython's default
#: is 5 ms), while batches are on. A slot running fast handlers from the buffer never blocks,
#: so the main thread, woken to send the next batch while the slot runs the rest, waited for
#: its turn until the slot had run the whole buffer: the database then worked while the slot
#: waited for its claims, never beside it. At 0.5 ms, 5,000 no-op jobs at 1 x 1 ran at
#: 4,022-4,277 jobs/s against 3,164-3,977 at 5 ms, in the same minutes.
GIL_SWITCH_INTERVAL = 0.0005


def _check_connection(force: bool = False) -> None:
    now = time.monotonic()
    if force or now - getattr(_checked, "at", 0.0) >= CONNECTION_CHECK_INTERVAL:
        close_old_connections()
        _checked.at = now


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


def _scope(options: WorkerOptions) -> str:
    """What a worker runs, in words (its start-up line)."""
    if options.queues:
        return f"only tasks of queues {', '.join(options.queues)}"
    if options.excluded_queues:
        return f"every job but tasks of queues {', '.join(options.excluded_queues)}"
    return "every job (events, schedules, tasks of every queue)"


def new_worker_id() -> str:
    """hostname:pid:random, unique per worker process start."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class _Pool:
    """Daemon threads that keep their database connection between jobs.

    A job whose lease was lost keeps its thread until its handler returns, but gives up its
    slot at once; the pool grows a thread for the next job rather than wait for it.
    """

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()
        self._count = 0
        self._threads: list[threading.Thread] = []

    def submit(self, task: Callable[[], None]) -> None:
        with self._lock:
            if self._idle == 0:
                self._count += 1
                thread = threading.Thread(
                    target=self._run, name=f"feishu-handler-{self._count}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            else:
                self._idle -= 1
        self._tasks.put(task)

    def _run(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:  # shut down: this thread's connections go with it
                connections.close_all()
                return
            try:
                task()
            except BaseException:  # the thread must live on for the next job
                log.exception("unexpected error in a handler thread")
            with self._lock:
                self._idle += 1

    def shutdown(self, timeout: float) -> list[threading.Thread]:
        """End the threads (each closes its database connections) and wait for them up to
        ``timeout`` seconds; a thread still running a handler (one abandoned at its timeout)
        is left to finish it, and ends then. Returns the threads still alive.

        Every thread is told, not only the idle ones: a slot's thread frees its slot before
        it has returned to the pool (it counts and logs the job's end), so the worker may be
        closing while it is not idle yet; told only the idle ones, it would wait for a next
        task for ever (a thread left behind in a process that ran ``runworker --burst``)."""
        with self._lock:
            self._idle = 0
            threads = list(self._threads)
        for _ in threads:
            self._tasks.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t for t in self._threads if t.is_alive()]


class _AsyncRunner:
    """One event loop thread for ``async def`` handlers, started on first use."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, coro_fn: Callable[[], Any], ctx: context.JobContext | None = None) -> Any:
        """Run the coroutine on the loop and wait for it; ``ctx`` (a job's) gets the means to
        cancel it (its timeout)."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._loop.set_default_executor(  # asyncio.to_thread: the handlers' writes
                    ThreadPoolExecutor(
                        thread_name_prefix="feishu-async-db",
                        initializer=handlers.keep_connections,
                    )
                )
                self._thread = threading.Thread(
                    target=self._loop.run_forever, name="feishu-async", daemon=True
                )
                self._thread.start()
            loop = self._loop
        future = asyncio.run_coroutine_threadsafe(coro_fn(), loop)
        if ctx is not None:
            ctx.cancel_async = future.cancel
        return future.result()

    def close(self, timeout: float) -> None:
        """Stop the loop, its thread and its executor's threads (``asyncio.to_thread``)."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return

        async def stop() -> None:
            await loop.shutdown_default_executor()
            loop.stop()

        asyncio.run_coroutine_threadsafe(stop(), loop)
        thread.join(timeout)
        if not thread.is_alive():
            loop.close()
            handlers.close_executor_connections()  # its executor's threads have ended


class _Slots:
    """Which jobs hold this worker's slots, and how many jobs it has claimed.

    A slot is taken in ``take`` (a claim) and freed in ``free`` only: when its job ends (the
    slot passing to the job its finish claimed, if any), or at once when the job's lease is
    lost. A job claimed by a finish always runs, even if the finished one lost its slot
    meanwhile.
    """

    def __init__(self, wake: threading.Event) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._held: dict[int, context.JobContext] = {}
        #: Jobs claimed so far (``--max-jobs``), reservations for finishes included.
        self.claimed = 0

    def take(self, ctx: context.JobContext) -> None:
        with self._lock:
            self._held[ctx.event.job_id] = ctx

    def count(self, claimed: int) -> None:
        """Jobs claimed (by the main thread's claims and batches) or handed back (< 0)."""
        with self._lock:
            self.claimed += claimed

    def free(self, ctx: context.JobContext, successor: context.JobContext | None = None) -> None:
        with self._lock:
            if self._held.get(ctx.event.job_id) is ctx:
                del self._held[ctx.event.job_id]
            if successor is not None:
                self._held[successor.event.job_id] = successor
                return  # the slot passed on: nothing for the claimer to do
        self._wake.set()

    def reserve(self, max_jobs: int | None) -> int:
        """One more claim, for a finish that claims its slot's next job; 0 at --max-jobs."""
        with self._lock:
            if max_jobs is not None and self.claimed >= max_jobs:
                return 0
            self.claimed += 1
            return 1

    def unreserve(self, count: int) -> None:
        with self._lock:
            self.claimed -= count

    def held(self) -> list[context.JobContext]:
        with self._lock:
            return list(self._held.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)


class Worker:
    def __init__(self, options: WorkerOptions, services: Services | None = None) -> None:
        conf = checked_settings()
        registry.validate()
        if options.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.options = options
        self.services = services or Services()
        self.worker_id = options.worker_id or new_worker_id()
        self.lease_seconds = options.lease_seconds or conf.LEASE_SECONDS
        self.poll_interval = conf.POLL_INTERVAL
        self.handlers = registry.registered()
        #: The claim's filter: partitions of some task queues only, or of all but some.
        self.keys = options.keys
        self._wake = threading.Event()
        self._stop = threading.Event()  # no more claims
        self._done = threading.Event()  # threads exit
        self._check_now = threading.Event()  # a NOTIFY named a running job's chat
        self._schedules_changed = threading.Event()  # a schedule was paused or resumed
        self._warned_no_handler: set[str] = set()
        self._slots = _Slots(self._wake)
        # FINISH_TOGETHER: while one finish is written, the others wait and go together;
        # else every slot writes its own at once (a group never forms).
        self._finishes = FinishGroup(
            self.lease_seconds,
            in_flight=1 if conf.FINISH_TOGETHER else options.concurrency,
            keys=self.keys,
        )
        #: BATCH_WINDOW > 0: finishes written together and jobs claimed ahead (batching.py).
        self._batch = (
            Batch(conf.BATCH_WINDOW, conf.BATCH_SIZE, self._wake) if conf.BATCH_WINDOW else None
        )
        self._pool = _Pool()
        self._async = _AsyncRunner()
        self._listening = False
        #: Seconds to wait before the next claim while the database is away (0: it is not).
        self._db_backoff = 0.0
        self._db_away_since: float | None = None
        #: A burst run gave up on an unreachable database (``run`` returns 1).
        self.gave_up = False
        #: The tokens of claims whose reply was lost: their jobs may be ours (``claimed_with``).
        self._lost_tokens: list[str] = []
        #: Buffered jobs whose hand back failed (the database was away), each with when its
        #: claim was sent: tried again by the heartbeat (``_hand_back_stale``), never started.
        self._unreturned: list[tuple[ledger.ClaimedJob, float]] = []
        #: Held while stale jobs are handed back: the heartbeat's, then ``_drain``'s.
        self._returning = threading.Lock()
        #: The room taken by the claims in flight (the main thread's, a slot's batch).
        self._reserved = 0
        #: Held while a claim reads and reserves its room, and when it ends (``_claim``).
        self._claiming = threading.Lock()
        #: A place for each claim in flight: as many as the database runs side by side (two on
        #: PostgreSQL, one on SQLite).
        self._writers = threading.BoundedSemaphore(store().concurrent_writers)
        #: Held while buffered jobs are started on the free slots.
        self._filling = threading.Lock()

        self._signals = interrupts.SignalRelay(
            self._on_signal, b"feishu_inbox worker: second signal, exiting at once\n"
        )
        self.outcomes: dict[str, int] = {}
        #: Handler threads still running a job that timed out; at ``concurrency`` of them
        #: (2 at least) the worker stops and asks to be started again (``runworker`` re-execs).
        self._abandoned = 0
        self._abandoned_lock = threading.Lock()
        self.restart_requested = False

    # --- the main loop -----------------------------------------------------------------------

    def run(self) -> int:
        self._signals.install()
        switch = sys.getswitchinterval()
        if self._batch is not None:
            sys.setswitchinterval(min(switch, GIL_SWITCH_INTERVAL))
        try:
            return self._run()
        finally:
            # Whatever ends the run (a failed warm-up too): a worker run inside a site's own
            # process, or a test's, leaves that process's signal handlers (and its switch
            # interval) as it found them.
            sys.setswitchinterval(switch)
            self._signals.restore()

    def _run(self) -> int:
        loaded = self.services.warm_up()  # seconds of imports, before any lease runs
        if loaded:
            log.info("worker %s: %s", self.worker_id, loaded)
        services = [
            threading.Thread(target=_closing(target), name=name, daemon=True)
            for name, target in (
                ("feishu-heartbeat", self._heartbeat),
                ("feishu-listen", self._listen),
                ("feishu-maintenance", self._maintenance),
                ("feishu-schedules", self._schedules),
            )
        ]
        for thread in services:
            thread.start()
        log.info(
            "worker %s started: concurrency %s, lease %ss, handlers for %s; %s",
            self.worker_id,
            self.options.concurrency,
            self.lease_seconds,
            ", ".join(sorted(self.handlers)) or "no event type",
            _scope(self.options),
        )
        try:
            self._loop()
            self._drain()
        finally:
            self._done.set()
            self._wake.set()
            self._check_now.set()
            self._schedules_changed.set()
            self._close(services)
        log.info("worker %s stopped: %s", self.worker_id, self.outcomes or "no jobs")
        return 1 if self.gave_up else 0

    def _close(self, services: list[threading.Thread]) -> None:
        """Leave nothing running and nothing open: a worker run inside another process (a
        test's ``call_command("runworker", burst=True)``) ends its threads and closes every
        database connection they opened."""
        deadline = time.monotonic() + SHUTDOWN_WAIT
        # Our listener waits on its socket: wake it (when the database is away, its wait ends
        # within its own timeout).
        with contextlib.suppress(*DATABASE_AWAY):
            store().notify(STOPPING_NOTICE)
        for thread in services:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = self._pool.shutdown(max(0.0, deadline - time.monotonic()))
        self._async.close(max(0.0, deadline - time.monotonic()))
        left = [t.name for t in services if t.is_alive()] + [t.name for t in stuck]
        if left:
            log.warning("worker %s: threads still running at exit: %s", self.worker_id, left)
        self._beat(last=True)
        connections.close_all()

    def _loop(self) -> None:
        batch = self._batch
        while not self._stop.is_set():
            self._fill_slots()
            free = self.options.concurrency - len(self._slots)
            room = self._room(free)
            if self.options.max_jobs is not None and self.options.max_jobs <= self._slots.claimed:
                break  # what was claimed runs to its end in _drain
            ended = batch.take_ended() if batch and batch.due(slot_idle=free > 0) else []
            # A free slot claims at once, unless jobs wait in the buffer: the slots run them
            # (fast handlers leave slots free on purpose) and their half-run buffer refills it.
            if ended or (free > 0 and room > 0 and not (batch and batch.buffered())):
                with self._writers:  # (its room is read again: a slot may have claimed meanwhile)
                    free = self.options.concurrency - len(self._slots)
                    claimed, statuses = self._claim(free, ended)
                self._place(claimed)
                self._settle_all(ended, statuses)
                if claimed or (ended and not self._db_backoff):
                    continue
                if (
                    self.options.burst
                    and not self._slots
                    and not self._db_backoff
                    and not (batch and (batch.waiting() or batch.buffered()))
                ):
                    break  # nothing is due and nothing of ours runs
            # (jobs in the buffer: no claim follows the wake-up, so no look at the next due job)
            can_claim = free > 0 and not (batch and batch.buffered())
            self._sleep(can_claim, until=batch.deadline() if batch else None, room_held=room <= 0)
            self._wake.clear()

    def _room(self, free: int) -> int:
        """How many jobs a claim may take: the free slots, and with batches the buffer's free
        places; never past --max-jobs."""
        room = free - self._reserved
        if self._batch is not None:
            room += self._batch.ahead(self.options.concurrency) - self._batch.buffered()
        if self.options.max_jobs is not None:
            room = min(room, self.options.max_jobs - self._slots.claimed)
        return room

    def _place(self, claimed: list[tuple[ledger.ClaimedJob, float]]) -> None:
        """Start claimed jobs: on the free slots, the rest into the buffer (batches only:
        without them a claim takes no more than the free slots)."""
        if self._batch is None:
            for job, sent in claimed:
                self._start(job, sent)
            return
        self._batch.buffer(claimed)
        self._fill_slots()

    def _fill_slots(self) -> None:
        """Start buffered jobs on the slots that are free."""
        if self._batch is None:
            return
        with self._filling:  # the main thread and a slot that wrote a batch both fill
            while len(self._slots) < self.options.concurrency and not self._stop.is_set():
                if not self._batch.needs_slot(len(self._slots)):
                    return
                item = self._batch.next_buffered()
                if item is None:
                    return
                self._start(*item, started=time.monotonic())

    def _claim(
        self, free: int | None, ended: Sequence[Ended] = ()
    ) -> tuple[list[tuple[ledger.ClaimedJob, float]], list[str | None]]:
        """Claim what ``free`` slots and the buffer have room for (``_room``; None: nothing),
        each job with when its lease was asked for (monotonic); with ``ended``, a batch: their
        finishes first, in the same statement and commit, and each one's status (empty when
        the batch failed).

        Two claims may be in flight at once, each on its own thread's connection (the main
        thread's batch, and a slot's that ran out of buffered jobs meanwhile): the database
        works on both, and each one's commit waits for its own WAL flush beside the other's.
        Only the bookkeeping is under ``_claiming``: the room is reserved there (counted as
        claimed, for ``--max-jobs``, until the claim returns), so two claims never take more
        than the room between them.

        While the database is away, a claim fails and the next one comes after a short backoff
        (never a long sleep: claims resume within a second of its return); a batch's finishes
        wait again, as retries. A claim whose reply was lost may have taken jobs: the next
        claim first looks for them by its token.
        """
        sent = time.monotonic()
        with self._claiming:
            limit = 0 if free is None else max(self._room(free), 0)
            lost, self._lost_tokens = self._lost_tokens, []
            self._reserved += limit
            self._slots.count(limit)
        recovered: list[ledger.ClaimedJob] = []
        statuses: list[str | None] = []
        jobs: list[ledger.ClaimedJob] = []
        token = ""
        try:
            _check_connection()
            while lost:
                found = ledger.claimed_with(self.worker_id, lost[0])
                lost.pop(0)
                if found:
                    log.warning("recovered %s jobs of a claim whose reply was lost", len(found))
                    self._slots.count(len(found))
                    recovered += found
            if recovered and not ended:
                return [(job, sent) for job in recovered], []
            token = ledger.new_token()
            if ended:
                statuses, jobs = ledger.finish_batch(
                    self.worker_id,
                    [(entry.ctx.lease, "") for entry in ended],
                    limit=max(limit - len(recovered), 0),
                    token=token,
                    lease_seconds=self.lease_seconds,
                    keys=self.keys,
                )
            else:
                jobs = ledger.claim(
                    self.worker_id,
                    lease_seconds=self.lease_seconds,
                    limit=limit,
                    token=token,
                    keys=self.keys,
                )
            token = ""
        except DATABASE_AWAY as exc:
            telemetry.CLAIMS.labels("error").inc()
            self._database_away("finish and claim" if ended else "claim", exc, since=sent)
            if self._batch is not None:
                self._batch.put_back(list(ended))
            return [(job, sent) for job in recovered], []
        finally:
            with self._claiming:  # the reservation ends; a reply that never came is kept
                self._reserved -= limit
                self._slots.count(len(jobs) - limit)
                self._lost_tokens += lost + ([token] if token else [])
        self._db_backoff = 0.0
        self._db_away_since = None
        telemetry.CLAIMS.labels("jobs" if jobs else "empty").inc()
        return [(job, sent) for job in recovered + jobs], statuses

    def _settle_all(self, ended: Sequence[Ended], statuses: list[str | None]) -> None:
        """After a batch (its claimed jobs placed first): what ended, told and counted."""
        if statuses:  # else the batch failed: its finishes wait again
            for entry, status in zip(ended, statuses, strict=True):
                self._settle(entry, status)

    def _settle(self, entry: Ended, status: str | None) -> None:
        """A batch wrote a job's finish: its outcome is counted, logged and told. A finish the
        batch found fenced out learns why alone (or, retried, finds that it had landed)."""
        ctx = entry.ctx
        outcome = status
        if outcome is None:
            try:
                outcome = status = ledger.finish(ctx.lease, retrying=entry.retrying)
            except LeaseLost as exc:
                ctx.mark_lost(str(exc))
                outcome = "lease_lost"
            except DATABASE_AWAY as exc:  # the batch's reply came: a bug; log it
                log.exception("job %s: the ledger refused a write (%s)", ctx.event.job_id, exc)
                writes.drop_connection()
                outcome = "database_error"
        if status is not None and ctx.on_end is not None:  # told only of a written end
            self._call_on_end(ctx, status, None)
        self._account(ctx, outcome, entry.span, entry.took)

    def _database_away(self, doing: str, exc: Exception, *, since: float | None = None) -> None:
        """``since``: when the call that failed began (a call may wait a while to fail)."""
        self._db_backoff = min(max(self._db_backoff * 2, CLAIM_RETRY_FIRST_DELAY), 1.0)
        if self._db_away_since is None:
            self._db_away_since = time.monotonic() if since is None else since
        away = time.monotonic() - self._db_away_since
        if self.options.burst and away >= self.options.database_patience:
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
            log.error("%s failed (%s); trying again in %.2fs", doing, exc, self._db_backoff)
        writes.drop_connection()

    def _sleep(
        self, can_claim: bool, *, until: float | None = None, room_held: bool = False
    ) -> None:
        """``until``: when (monotonic) a batch's window ends, if one waits; ``room_held``:
        a claim in flight holds the room (a slot writing its own batch)."""
        if self._db_backoff:
            self._stop.wait(self._db_backoff)
            return
        longest = LISTEN_MAX_SLEEP if self._listening else self.poll_interval
        if until is not None:
            longest = min(longest, max(0.0, until - time.monotonic()))
        timeout = longest
        if can_claim and room_held:
            # No look at the next due job: the claim in flight answers that. Busy workers
            # looked here hundreds of times a run, two round trips and a walk of the status
            # index's running entries each. But a short wait, as when work is due: a job
            # whose notice woke this thread meanwhile came too late for that claim, which
            # may bring jobs (then nothing wakes this thread) while a slot stays free.
            timeout = min(longest, MIN_SLEEP)
        elif can_claim:
            try:
                due = seconds_until_wakeup(self.keys)
            except DATABASE_AWAY as exc:
                self._database_away("reading the next wake-up", exc)
                return
            if due is not None:
                timeout = min(longest, max(MIN_SLEEP, due))
        self._wake.wait(timeout)

    # --- one job -----------------------------------------------------------------------------

    def _context(
        self, job: ledger.ClaimedJob, sent: float, started: float | None = None
    ) -> context.JobContext:
        """``sent``: when its lease was asked for; ``started``: when it starts, if later (it
        waited in the batch's buffer)."""
        _count_start(job)
        started = sent if started is None else started
        event = context.Event(
            job_id=job.id,
            event_id=job.event_id,
            event_type=job.event_type,
            app=job.app,
            payload=job.payload,
            partition_key=job.lease.partition_key,
            attempt=job.lease.attempt,
            private_message=job.private_message,
            received_at=job.received_at,
        )
        timeout = registry.timeout_for(job.event_type)
        return context.JobContext(
            lease=job.lease,
            event=event,
            lease_seconds=self.lease_seconds,
            renewed_at=sent,
            started=started,
            has_steps=job.has_steps,
            on_lost=self._slots.free,
            deadline=None if timeout is None else started + timeout,
            trace_parent=job.trace_parent,
        )

    def _start(self, job: ledger.ClaimedJob, sent: float, started: float | None = None) -> None:
        ctx = self._context(job, sent, started)
        self._slots.take(ctx)
        if job.private_message:
            self._check_now.set()  # a newer message may already wait
        self._pool.submit(lambda: self._run_job(ctx))

    def _run_job(self, ctx: context.JobContext | None) -> None:
        """Run a job; while its slot's next claim succeeds, run that one too on this thread."""
        while ctx is not None:
            ctx = self._run_one(ctx)

    def _run_one(self, ctx: context.JobContext) -> context.JobContext | None:
        event, started = ctx.event, ctx.started
        _check_connection()
        outcome = "error"
        following: context.JobContext | None = None
        span = tracing.start(
            f"feishu_inbox job {event.event_type}",
            kind="consumer",
            parent=ctx.trace_parent,
            link_parent=True,
            attributes={
                "feishu_inbox.job.id": event.job_id,
                "feishu_inbox.event.id": event.event_id,
                "feishu_inbox.event.type": event.event_type,
                "feishu_inbox.app": event.app,
                "feishu_inbox.attempt": event.attempt,
                "feishu_inbox.worker.id": self.worker_id,
            },
        )
        try:
            outcome, following = self._execute(ctx)
        except LeaseLost as exc:
            ctx.mark_lost(str(exc))
            outcome = "lease_lost"
        except DATABASE_AWAY as exc:  # the worker's own call, not tried again
            writes.drop_connection()
            outcome = self._after_a_database_error(ctx, exc)
        finally:
            with self._abandoned_lock:
                ctx.thread_done = True
                if ctx.abandoned:  # the worker timed it out; its thread is back
                    self._abandoned -= 1
            took = time.monotonic() - started
            if outcome is _PENDING:  # its finish waits for the batch; the slot goes on
                assert self._batch is not None
                span.detach()
                batch = self._batch
                running = not self._stop.is_set()
                item = batch.ended(Ended(ctx, span, took), take_next=running)
                ended: list[Ended] = []
                statuses: list[str | None] = []
                alone = len(self._slots) == 1  # no other slot runs: none will add to it
                if item is None and running and alone and self._writers.acquire(blocking=False):
                    # Nothing buffered, no other slot running: this one writes the batch
                    # itself (beside the main thread's, if one is in flight), and runs the job
                    # its claim brings (a busy chat's next one: one commit a job, no hand-over
                    # between threads).
                    claimed: list[tuple[ledger.ClaimedJob, float]] = []
                    try:
                        ended = batch.take_ended()
                        free = self.options.concurrency - len(self._slots) + 1  # this one
                        claimed, statuses = self._claim(free, ended)
                    except Exception:  # not the database's (those _claim handles): a bug
                        log.exception("writing a batch failed; its finishes wait again")
                        batch.put_back(ended)
                        ended = []
                    finally:
                        self._writers.release()
                    if claimed and self._stop.is_set():  # stopped meanwhile: nothing starts
                        self._give_back(claimed, _STOPPED)
                    elif claimed:
                        item = claimed[0]
                        batch.buffer(claimed[1:])
                if item is not None:
                    following = self._context(*item, started=time.monotonic())
                    if item[0].private_message:
                        self._check_now.set()  # a newer message may already wait
                self._slots.free(ctx, successor=following)
                if ended:
                    self._fill_slots()
                    self._settle_all(ended, statuses)
            else:
                self._slots.free(ctx, successor=following)
                self._account(ctx, outcome, span, took)
        return following

    def _after_a_database_error(self, ctx: context.JobContext, exc: Exception) -> str:
        """A job's own call raised a database error that nothing tried again. When it is the
        database being away before the handler was called, it goes back to the queue (tried
        again while its lease lasts) rather than waiting out its lease."""
        if not isinstance(exc, writes.TRANSIENT_ERRORS):  # not a blink: a bug
            log.error(
                "job %s: the ledger refused a write (%s)", ctx.event.job_id, exc, exc_info=exc
            )
            return "database_error"
        log.warning("job %s: the database was away (%s)", ctx.event.job_id, exc)
        if ctx.handler_started or ctx.ending or ctx.effects_started or ctx.lost.is_set():
            return "database_error"
        ctx.ending = True
        why = f"The database was away ({type(exc).__name__}); it runs again."
        try:
            state = writes.write(
                ctx,
                "hand back",
                lambda retrying: ledger.hand_back(ctx.lease, retrying=retrying, message=why),
            )
        except (LeaseLost, InvalidState) as lost:
            log.warning("job %s not handed back: %s", ctx.event.job_id, lost)
            return "database_error"
        ctx.mark_lost("handed back after a database error")
        log.info("job %s handed back after a database error (%s)", ctx.event.job_id, state)
        return state

    def _account(
        self, ctx: context.JobContext, outcome: str, span: tracing.Span, took: float
    ) -> None:
        """Count, trace and log an attempt that ended (``took``: seconds on its slot)."""
        event = ctx.event
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        label = _outcome_label(ctx, outcome)
        telemetry.JOBS_FINISHED.labels(event.event_type, label).inc()
        span.set("feishu_inbox.outcome", label)
        span.end(ctx.ended_by if label not in _CLEAN_ENDS else None)
        telemetry.HANDLER_SECONDS.labels(event.event_type).observe(took)
        log.info(
            "job %s event %s type %s partition %s attempt %s: %s in %.1f ms",
            event.job_id,
            event.event_id,
            event.event_type,
            event.partition_key,
            event.attempt,
            outcome,
            took * 1000,
        )

    def _finish(
        self, ctx: context.JobContext, *, superseded: bool = False, note: str = ""
    ) -> tuple[str, context.JobContext | None]:
        """Finish the job and, on the same round trip, claim this slot's next one; with the
        finishes of other slots that end meanwhile (``finishing``)."""
        ctx.ensure_alive()
        ctx.ending = True
        if self._batch is not None and not superseded and not note:
            return _PENDING, None  # the batch writes it (_run_one hands it over)
        reserved = 0 if self._stop.is_set() else self._slots.reserve(self.options.max_jobs)
        token = ledger.new_token()  # the same for every try: a lost reply's jobs are found
        sent = time.monotonic()

        def alone(retrying: bool) -> tuple[str, list[ledger.ClaimedJob]]:
            return writes.write(
                ctx,
                "finish",
                lambda again: ledger.finish_and_claim(
                    ctx.lease,
                    limit=reserved,
                    lease_seconds=self.lease_seconds,
                    superseded=superseded,
                    note=note,
                    token=token,
                    retrying=retrying or again,
                    keys=self.keys,
                ),
            )

        error_type = "Superseded" if superseded else note  # as ledger.finish writes it
        try:
            status, jobs = self._finishes.finish(
                Finish(ctx.lease, error_type, token if reserved else "", alone)
            )
        except BaseException:
            self._slots.unreserve(reserved)
            if reserved:  # it may have landed, its reply lost: its next job is found later
                with self._claiming:
                    self._lost_tokens.append(token)
            raise
        self._slots.unreserve(reserved - len(jobs))
        label = status + (" (Superseded)" if superseded else f" ({note})" if note else "")
        return label, self._context(jobs[0], sent) if jobs else None

    def _fail(self, ctx: context.JobContext, error: BaseException) -> str:
        """End the attempt as failed: retried after the handler's policy's backoff, or at the
        time a ``RetryAt`` asked for (the attempts still bound it); not retried when the error
        says running again cannot help (its ``final`` is True: Feishu refused the request)."""
        ctx.ensure_alive()
        ctx.ending = True
        final = getattr(error, "final", False) is True
        retry_in: float | None = None
        if final:
            pass
        elif isinstance(error, RetryAt):
            retry_in = (
                writes.write(
                    ctx, "read the clock for", lambda _: error.seconds_from(database_now())
                )
                if error.needs_clock
                else error.seconds
            )
        else:
            retry_in = registry.policy_for(ctx.event.event_type).delay_before(ctx.event.attempt)
        error_type, message = registry.describe_error(ctx.event.event_type, error)
        return writes.write(
            ctx,
            "fail",
            lambda retrying: ledger.fail(
                ctx.lease,
                error_type=error_type,
                message=message,
                retry_in=retry_in,
                retrying=retrying,
                final=final,
            ),
        )

    def _defer(
        self,
        ctx: context.JobContext,
        wait: Deferred,
        error_type: str = limits.WAITING,
        *,
        or_fail: bool = True,
    ) -> str:
        """Hand the job back, due in ``wait.seconds``, without spending an attempt; a job
        that cannot go back (an effect of it is open) is retried then instead."""
        ctx.ensure_alive()
        ctx.ending = True
        try:
            return writes.write(
                ctx,
                "hand back",
                lambda retrying: ledger.hand_back(
                    ctx.lease,
                    retrying=retrying,
                    delay=wait.seconds,
                    error_type=error_type,
                    message=wait.reason,
                ),
            )
        except InvalidState:
            ctx.ending = False
            if not or_fail:
                raise
            return self._fail(ctx, RetryAfter(wait.seconds, wait.reason))

    def _execute(self, ctx: context.JobContext) -> tuple[str, context.JobContext | None]:
        fn = registry.handler_for(ctx.event.event_type, self.handlers)
        if fn is None:
            self._warn_no_handler(ctx.event.event_type)
            return self._finish(ctx, note="NoHandler")
        event = ctx.event
        # A read, tried again through a blink as the job's writes are: raised out of here, a
        # dropped connection would leave the job to wait out its lease.
        held = writes.write(
            ctx,
            "look for the pauses of",
            lambda _: pauses.holding(
                app=event.app, event_type=event.event_type, partition_key=event.partition_key
            ),
        )
        if held is not None:  # paused after this worker last looked: back, held, no attempt
            wait = Deferred(
                pauses.seconds_until_held(),
                f"Paused ({held.kind} {held.value}) by {held.by or 'an operator'}.",
            )
            try:
                state = self._defer(ctx, wait, error_type=pauses.PAUSED, or_fail=False)
            except InvalidState:  # it cannot go back (its effects' window): it runs
                ctx.ending = False
            else:
                keys = {"app": event.app, "event_type": event.event_type}
                writes.write(
                    ctx,
                    "look again at the pauses of",
                    lambda _: pauses.release_if_unheld(
                        event.job_id, **keys, partition_key=event.partition_key
                    ),
                )
                return state, None
        if ctx.timed_out.is_set():  # while the pause check waited out a blink: the heartbeat
            raise LeaseLost(f"Job {event.job_id} timed out before its handler started.")
        ctx.ensure_alive()
        token = context.enter(ctx)
        slots: list[str] = []
        try:
            # a slot first: a job that waits for one must not spend a token each time it looks
            # (a handler that declares neither costs two dict lookups)
            specs = registry.concurrency_for(event.event_type)
            if specs:
                slots = rate_limits.take_slots(ctx, specs)
            own_limits = registry.rate_limits_for(event.event_type)
            if own_limits:
                rate_limits.acquire(own_limits)
            ctx.handler_started = True
            if handlers.is_async(fn):
                traced = tracing.captured()  # the job's span, on the loop's thread too

                async def call() -> Any:
                    context.enter(ctx)
                    try:
                        with tracing.attached(traced):
                            return await fn(ctx.event)
                    except (KeyboardInterrupt, SystemExit) as exc:
                        # Raised in the event loop they would stop it for every async handler.
                        raise _HandlerExit(exc) from exc

                self._async.run(call, ctx)
            else:
                fn(ctx.event)
        except Deferred as wait:
            return self._defer(ctx, wait), None
        except Superseded as exc:
            return self._ended(ctx, self._finish(ctx, superseded=True), exc)
        except Cancelled as exc:
            return self._ended(ctx, self._finish(ctx, note="Cancelled"), exc)
        except LeaseLost:
            raise
        except BaseException as exc:  # SystemExit too: the job ends now, its cause recorded
            error = exc.original if isinstance(exc, _HandlerExit) else exc
            log.warning(
                "job %s handler raised %s: %s",
                ctx.event.job_id,
                type(error).__name__,
                error,
                exc_info=True,
            )
            return self._ended(ctx, (self._fail(ctx, error), None), error)
        finally:
            context.leave(token)
            if slots and not ctx.lost.is_set() and not ctx.timed_out.is_set():
                try:
                    rate_limits.give_back_slots(ctx, slots)
                except (LeaseLost, *DATABASE_AWAY) as exc:  # they stop counting with the lease
                    log.warning("job %s: slots not given back (%s)", ctx.event.job_id, exc)
        return self._ended(ctx, self._finish(ctx), None)

    def _ended(
        self,
        ctx: context.JobContext,
        result: tuple[str, context.JobContext | None],
        error: BaseException | None,
    ) -> tuple[str, context.JobContext | None]:
        """Tell the job's ``on_end`` (a task's signals) how its attempt ended; what it raises
        is logged, never the worker's concern."""
        ctx.ended_by = error
        if ctx.on_end is not None and result[0] is not _PENDING:  # else: once it is written
            self._call_on_end(ctx, result[0], error)
        return result

    @staticmethod
    def _call_on_end(ctx: context.JobContext, state: str, error: BaseException | None) -> None:
        assert ctx.on_end is not None
        try:
            ctx.on_end(state, error)
        except Exception:
            log.exception("job %s: its end's callback raised", ctx.event.job_id)

    # --- heartbeat: renewals and supersede checks ------------------------------------------

    def _heartbeat(self) -> None:
        """Renew every lease a third of the way through it, and look for newer private
        messages at least once a second for every running private job (SPEC §4), whatever
        else runs; a NOTIFY naming such a job's chat looks at once."""
        renew_every = self.lease_seconds / 3
        tick = min(renew_every, HEARTBEAT_TICK)
        while not self._done.is_set():
            for ctx in self._slots.held():
                if ctx.lost.is_set() or ctx.ending:
                    continue
                if ctx.deadline is not None and time.monotonic() >= ctx.deadline + TIMEOUT_GRACE:
                    self._time_out(ctx)
                elif time.monotonic() - ctx.renewed_at >= renew_every:
                    self._renew(ctx)
            self._hand_back_stale()
            self._check_now.clear()
            self._look_for_signals()
            self._check_now.wait(tick)
        connections.close_all()

    def _hand_back_stale(self) -> None:
        """Hand back the buffered jobs that waited too long for a slot (every slot is in a
        slow job), and try again those whose hand back failed (``_give_back``). Once the
        worker stops, ``_drain`` does both."""
        if self._batch is None:
            return
        # Within a third of the lease too: a buffered job is never renewed.
        patience = min(BUFFER_PATIENCE, self.lease_seconds / 3)
        with self._returning:
            if self._stop.is_set():
                return
            self._give_back(self._batch.stale(now=time.monotonic(), patience=patience), _WAITED)

    def _give_back(self, jobs: Sequence[tuple[ledger.ClaimedJob, float]], why: str) -> bool:
        """Hand back claimed jobs that never started (each with when its claim was sent), and
        those whose hand back failed before. One whose hand back fails (the database is away)
        is no slot's to run any more (the hand back may have landed, its reply lost: the job
        may be queued again, or another worker's): it is kept to be tried again, as a retry,
        while its lease lasts; never left to wait out its lease and run on a second attempt.
        True: none is left to try again."""
        with self._claiming:
            retries, self._unreturned = self._unreturned, []
        failed = [
            (job, sent)
            for job, sent in retries
            if not self._hand_back_buffered(job, why, retrying=True)
        ] + [(job, sent) for job, sent in jobs if not self._hand_back_buffered(job, why)]
        kept = []
        for job, sent in failed:
            if time.monotonic() - sent < self.lease_seconds:
                kept.append((job, sent))
            else:
                log.warning("job %s not handed back before its lease ran out", job.id)
        with self._claiming:
            self._unreturned += kept
        return not kept

    def _look_for_signals(self) -> None:
        """Tell running handlers, at their next checkpoint, that an operator cancelled their
        job or a newer private message supersedes it: one statement for all of them."""
        running = {ctx.lease.job_id: ctx for ctx in self._slots.held() if not ctx.lost.is_set()}
        if not running:
            return
        try:
            _check_connection()
            found = ledger.signals(ctx.lease for ctx in running.values())
        except DATABASE_AWAY:
            writes.drop_connection()  # the database is away: look again next tick
            return
        for job_id, signal_ in found.items():
            if signal_.cancelled:
                running[job_id].cancelled.set()
            if signal_.superseded:
                running[job_id].interrupt.set()

    def _warn_no_handler(self, event_type: str) -> None:
        if event_type not in self._warned_no_handler:
            self._warned_no_handler.add(event_type)
            log.warning(
                "no handler for event type %s: its jobs complete as NoHandler. Register one "
                "with @feishu_inbox.handler(%r) in a feishu_handlers.py module of an installed "
                "app (or a module in FEISHU_INBOX['HANDLER_MODULES']); then `manage.py inbox "
                "replay --error NoHandler --event-type %s` runs the ones that arrived meanwhile",
                event_type,
                event_type,
                event_type,
            )

    def _time_out(self, ctx: context.JobContext) -> None:
        """A handler ran past its timeout and reached no checkpoint: end its attempt here.
        The attempt's end is fenced by its lease, so nothing its thread does afterwards (a
        finish, a step, an effect's start) lands; the slot is freed at once. An effect in
        flight makes it ``unknown``, as any failure does; else it is retried by its policy."""
        ctx.timed_out.set()  # its next checkpoint, step or effect raises TimedOut
        error = TimedOut(
            f"Job {ctx.event.job_id} ran past its handler's timeout of "
            f"{ctx.timeout_seconds:g}s and was stopped by the worker."
        )
        try:
            state = self._fail(ctx, error)
        except LeaseLost as exc:  # its own end landed first, or the lease was gone
            log.debug("job %s: not timed out (%s)", ctx.event.job_id, exc)
            return
        except DATABASE_AWAY as exc:
            log.error("job %s: its timeout could not be written (%s)", ctx.event.job_id, exc)
            writes.drop_connection()
            ctx.ending = False  # try again at the next tick
            return
        self.outcomes["timed_out"] = self.outcomes.get("timed_out", 0) + 1
        log.error(
            "job %s event %s type %s: %s; the attempt ended %s, its %s",
            ctx.event.job_id,
            ctx.event.event_id,
            ctx.event.event_type,
            error,
            state,
            "coroutine is cancelled" if ctx.cancel_async is not None else "thread is abandoned",
        )
        with self._abandoned_lock:
            if ctx.cancel_async is not None:
                # An async handler: its task is cancelled (CancelledError at its next await)
                # and its thread, which only waited for it, comes back at once: not stuck.
                ctx.cancel_async()
            elif not ctx.thread_done:  # its thread still runs the handler: it is stuck
                ctx.abandoned = True
                self._abandoned += 1
            abandoned = self._abandoned
        ctx.mark_lost("timed out")
        if abandoned >= max(2, self.options.concurrency) and not self._stop.is_set():
            log.error(
                "worker %s: %d handler threads are stuck past their timeout; restarting "
                "(the running jobs finish first, within the grace period)",
                self.worker_id,
                abandoned,
            )
            self.restart_requested = True
            self._stop.set()
            self._wake.set()

    def _renew(self, ctx: context.JobContext) -> None:
        sent = time.monotonic()
        try:
            _check_connection()
            ledger.renew(ctx.lease, lease_seconds=self.lease_seconds)
            ctx.renewed_at = sent
            telemetry.RENEWALS.labels("renewed").inc()
        except LeaseLost as exc:
            if ctx.ending:  # the job's own end landed first; a real loss, the end reports
                log.debug("job %s: not renewed, it is ending (%s)", ctx.event.job_id, exc)
                return
            telemetry.RENEWALS.labels("lost").inc()
            ctx.mark_lost(str(exc))
        except DATABASE_AWAY as exc:
            telemetry.RENEWALS.labels("error").inc()
            writes.drop_connection()
            # Tried again next tick; past our own estimate of the deadline, the lease is gone.
            if ctx.lease_left() <= 0:
                ctx.mark_lost(f"could not renew for a whole lease ({exc})")

    # --- wake-ups and chores -----------------------------------------------------------------

    def _listen(self) -> None:
        """Wake-ups pushed by the database (PostgreSQL's NOTIFY); SQLite has none: we poll."""
        store().listen(self._notified, self._done, self._set_listening)

    def _notified(self, partition_key: str) -> None:
        """A NOTIFY: a head became claimable, or a job of one of our chats was cancelled or
        may be superseded (an operator's action and a private message also notify), or a
        schedule was paused, resumed or edited."""
        if partition_key == STOPPING_NOTICE:
            return  # a worker stopping: only its own listener cared (it is done)
        if partition_key == SCHEDULES_NOTICE:
            self._schedules_changed.set()
            return
        self._wake.set()
        if any(ctx.event.partition_key.startswith(partition_key) for ctx in self._slots.held()):
            self._check_now.set()

    def _set_listening(self, listening: bool) -> None:
        self._listening = listening

    def _maintenance(self) -> None:
        """This worker's heartbeat row, and the shared chores: the retention purge, when it
        is this worker's turn. (Not in the heartbeat thread: a write that waits out a
        database blink must never delay the leases' renewals.)"""
        conf = checked_settings()
        interval = conf.PURGE_INTERVAL  # None: purged from cron (manage.py inbox purge)
        purge_every = MAINTENANCE_TICK if interval is None else min(MAINTENANCE_TICK, interval)
        next_purge = time.monotonic() + purge_every
        self._beat(first=True)
        while not self._done.wait(min(conf.WORKER_BEAT_SECONDS, purge_every)):
            self._beat()
            if interval is None or time.monotonic() < next_purge:
                continue
            next_purge = time.monotonic() + purge_every
            try:
                _check_connection()
                retention.purge_if_due(self.worker_id)
            except DATABASE_AWAY as exc:
                log.warning("retention purge failed (%s); trying again later", exc)
                writes.drop_connection()
        connections.close_all()

    def _beat(self, *, first: bool = False, last: bool = False) -> None:
        """Write this worker's heartbeat row (``ledger/workers.py``); a database that is away
        only delays it."""
        try:
            _check_connection()
            if first:
                worker_beats.started(
                    self.worker_id,
                    concurrency=self.options.concurrency,
                    queues=self.options.queues,
                    excluded_queues=self.options.excluded_queues,
                    version=VERSION,
                )
            elif last:
                worker_beats.stopped(self.worker_id)
            else:
                worker_beats.beat(self.worker_id, busy=len(self._slots))
        except DATABASE_AWAY as exc:
            log.warning("worker %s: heartbeat row not written (%s)", self.worker_id, exc)
            writes.drop_connection()

    def _schedules(self) -> None:
        """Tick the schedules at each occurrence. Every worker does (no leader): the
        watermark's compare-and-set lets exactly one of them enqueue an occurrence."""
        if self.services.tick is None:
            return
        while not (self._stop.is_set() or self._done.is_set()):
            timeout = self._tick_schedules()
            self._schedules_changed.wait(timeout)
            self._schedules_changed.clear()
        connections.close_all()

    def _tick_schedules(self) -> float:
        """One tick; returns how long to sleep: until the next occurrence, or until it is time
        to look at the schedules' paused state again (as long as the main loop sleeps)."""
        longest = LISTEN_MAX_SLEEP if self._listening else self.poll_interval
        assert self.services.tick is not None  # the schedules thread runs only with one
        try:
            _check_connection()
            ticked = self.services.tick(self.worker_id)
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
            self._wake.set()  # claim them now (SQLite has no NOTIFY)
        until = ticked.seconds_until_next()
        if until is None:
            return longest
        # Due now (run-all catching up, or another worker moved first): tick again at once.
        return min(longest, max(0.0, until) + SCHEDULE_WAKE_SLACK)

    # --- shutdown ----------------------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        """SIGTERM or SIGINT, on the relay's thread (``interrupts``): never in the handler."""
        log.info(
            "worker %s: %s received, finishing running jobs",
            self.worker_id,
            signal.Signals(signum).name,
        )
        self.stop()

    def health(self) -> tuple[bool, str]:
        """Whether this worker is ready (its claims reach the database), in words: what
        ``/healthz`` answers (503 when not)."""
        busy = f"{len(self._slots)} of {self.options.concurrency} slots busy"
        if self._done.is_set():
            return False, f"worker {self.worker_id} has stopped"
        if self._stop.is_set():
            return False, f"worker {self.worker_id} is stopping; {busy}"
        if self._db_away_since is not None:
            away = time.monotonic() - self._db_away_since
            return False, f"worker {self.worker_id}: the database unreachable for {away:.0f}s"
        return True, f"ok: worker {self.worker_id}, {busy}"

    def stop(self) -> None:
        """Stop claiming (and ticking schedules); ``run`` then drains and returns."""
        self._stop.set()
        self._wake.set()
        self._schedules_changed.set()

    def _drain(self) -> None:
        # A natural end (--burst, --max-jobs) waits for running handlers however long they
        # take, and runs what its buffer holds; only a stop request (a signal) limits them to
        # the grace period, and hands the buffer back at once.
        batch = self._batch
        if not self._stop.is_set():
            while not self._stop.is_set() and (
                self._slots or (batch and (batch.buffered() or batch.waiting()))
            ):
                self._fill_slots()
                self._write_ended()
                pause = self._db_backoff or (batch.window if batch and batch.waiting() else 1.0)
                self._wake.wait(pause)
                self._wake.clear()
        if batch is not None:
            self._give_back(batch.take_buffered(), _STOPPED)
        deadline = time.monotonic() + self.options.grace_seconds
        while self._slots and time.monotonic() < deadline:
            self._write_ended()
            self._wake.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            self._wake.clear()
        self._write_ended(patiently=True)
        for ctx in self._slots.held():
            if ctx.effects_started:
                log.warning(
                    "job %s is inside an effect past the grace period; its lease will "
                    "expire and it will become unknown",
                    ctx.event.job_id,
                )
                continue
            try:
                _check_connection(force=True)
                ctx.ending = True
                state = writes.write(ctx, "hand back", partial(_hand_back, ctx.lease))
                ctx.mark_lost("handed back at shutdown")
                log.info("job %s handed back (%s)", ctx.event.job_id, state)
            except (LeaseLost, InvalidState) as exc:
                log.warning("job %s not handed back: %s", ctx.event.job_id, exc)
        self._write_ended(patiently=True)  # the handlers that returned meanwhile
        if self._batch is not None:  # what a slot's last batch claimed, or a lost reply's
            self._give_back(self._batch.take_buffered(), _STOPPED)
        with self._returning:  # the heartbeat hands back nothing more
            self._give_back_the_rest()

    def _give_back_the_rest(self) -> None:
        """As the worker stops: the jobs of claims whose reply was lost (no later claim will
        look for them), and those whose hand back failed, go back; while the database is
        away, tried again until their leases are about to end (as ``_write_ended`` does)."""
        delay = writes.RETRY_FIRST_DELAY
        until = time.monotonic() + self.lease_seconds - writes.LEASE_MARGIN
        while True:
            with self._claiming:
                lost, self._lost_tokens = self._lost_tokens, []
            found: list[tuple[ledger.ClaimedJob, float]] = []
            for n, token in enumerate(lost):
                try:
                    _check_connection()
                    jobs = ledger.claimed_with(self.worker_id, token)
                    found += [(job, time.monotonic()) for job in jobs]
                except DATABASE_AWAY as exc:
                    log.warning("a lost claim's jobs not looked for yet (%s)", exc)
                    writes.drop_connection()
                    with self._claiming:
                        self._lost_tokens += lost[n:]
                    break
            done = self._give_back(found, _STOPPED) and not self._lost_tokens
            left = until - time.monotonic()
            if done or left <= 0 or self.gave_up:  # a --burst run gave up waiting already
                if not done:
                    log.error("jobs left to their leases: the database stayed away")
                return
            time.sleep(min(delay, left))  # a backoff between tries, not a synchronisation
            delay = min(delay * 2, writes.RETRY_LONGEST_DELAY)

    def _write_ended(self, *, patiently: bool = False) -> None:
        """Write the batch's waiting finishes now, claiming nothing (the worker is ending).
        Jobs a lost reply had claimed, found again, are handed back. ``patiently``: while the
        database is away, try again until the oldest of their leases is about to end (as
        ``writes.write`` does for one finish); else once."""
        batch = self._batch
        if batch is None:
            return
        delay = writes.RETRY_FIRST_DELAY
        while batch.waiting():
            with self._writers:
                ended = batch.take_ended()
                found, statuses = self._claim(None, ended)
            self._settle_all(ended, statuses)
            self._give_back(found, _STOPPED)
            if statuses or not patiently:
                return
            left = min(entry.ctx.lease_left() for entry in ended) - writes.LEASE_MARGIN
            if left <= 0:
                log.error("%s finishes not written before their leases ran out", len(ended))
                return
            time.sleep(min(delay, left))  # a backoff between tries, not a synchronisation
            delay = min(delay * 2, writes.RETRY_LONGEST_DELAY)

    def _hand_back_buffered(
        self, job: ledger.ClaimedJob, why: str, *, retrying: bool = False
    ) -> bool:
        """Give back a claimed job that never started, without spending an attempt. False:
        the database is away (the hand back may have landed: a caller that tries again passes
        ``retrying``, and must not start the job meanwhile)."""
        try:
            _check_connection()
            state = ledger.hand_back(job.lease, message=why, retrying=retrying)
        except (LeaseLost, InvalidState) as exc:
            log.warning("job %s not handed back: %s", job.id, exc)
            return True
        except DATABASE_AWAY as exc:
            writes.drop_connection()
            log.warning("job %s not handed back (the database is away): %s", job.id, exc)
            return False
        self._slots.count(-1)
        log.info("job %s handed back before it started (%s): %s", job.id, state, why)
        return True


#: Why a buffered job went back: no slot was free for it in time.
_WAITED = "It waited too long for a free slot."
#: Why a claimed job that never started went back: the worker stopped.
_STOPPED = "The worker shut down."


def _hand_back(lease: ledger.Lease, retrying: bool) -> str:
    return ledger.hand_back(lease, retrying=retrying)


def _count_start(job: ledger.ClaimedJob) -> None:
    """A claimed job starts: counted, and how long it waited since it was due (by this
    host's clock against the database's due time: the same host, or NTP-close ones)."""
    telemetry.CLAIMED_JOBS.inc()
    if job.due_at is not None:
        waited = (datetime.now(timezone.utc) - job.due_at).total_seconds()
        telemetry.WAIT_SECONDS.labels(job.event_type).observe(max(0.0, waited))


#: What ``_finish`` returns for a finish the batch writes (``_run_one`` hands it over).
_PENDING = "pending"

#: The worker's outcomes (the ledger's state after the attempt) as the metrics name them.
_OUTCOMES = {"retry_wait": "retried", "queued": "deferred", "running": "deferred"}


#: Outcomes whose span ends without an error status (what ended them was the ledger's word).
_CLEAN_ENDS = frozenset({"completed", "superseded", "cancelled", "deferred"})


def _outcome_label(ctx: context.JobContext, outcome: str) -> str:
    if ctx.timed_out.is_set():
        return "timed_out"
    if outcome == "completed" and isinstance(ctx.ended_by, Superseded):
        return "superseded"
    if outcome == "completed" and isinstance(ctx.ended_by, Cancelled):
        return "cancelled"
    return _OUTCOMES.get(outcome, outcome)


def _closing(target: Callable[[], None]) -> Callable[[], None]:
    """A service thread's body that closes the thread's database connections when it ends."""

    def run() -> None:
        try:
            target()
        finally:
            connections.close_all()

    return run


class _HandlerExit(Exception):
    """A handler's SystemExit or KeyboardInterrupt, carried out of the event loop."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original
