"""The Worker: claims jobs into N slots, runs them, and stops cleanly; its rooms do the rest.

- the main thread claims (up to the free slots in one call, ``claimer.py``), places what it
  claimed on the slots (``executor.py``), then sleeps on an event that a finished job, a
  PostgreSQL NOTIFY, a due time or a signal sets;
- N handler threads run one job each at a time (``executor.py`` over ``pools.py``);
  ``async def`` handlers run on one event loop thread instead, so sync ones never block it;
- side threads, started together and watched: the heartbeat (``heartbeat.py``: leases,
  timeouts, cancel and supersede signals), the NOTIFY listener, the worker's heartbeat row and
  the retention purge, and the schedule ticker (``chores.py``). A side thread that dies stops
  the worker loudly: its traceback logged, its claimed jobs handed back, a non-zero exit;
  never a worker that claims on without renewing its leases.

When the database blinks, every write about a job is tried again (``writes.write``) while
its lease lasts, and claims come back after a backoff of at most a second (SPEC §6).

Signals: the first SIGTERM/SIGINT stops claiming and lets handlers finish for ``grace_seconds``,
then hands back the jobs that started no effect; a second one exits at once (leases expire).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable

from django.db import connections

from ..conf import checked_settings
from ..ledger.stats import seconds_until_wakeup
from . import attempts, interrupts, registry, writes
from .chores import Listener, Maintenance, ScheduleTicker
from .claimer import Claimer
from .executor import Executor
from .heartbeat import Heartbeat
from .options import Services, Ticked, WorkerOptions, new_worker_id
from .pools import Slots
from .state import DATABASE_AWAY, Crew, Database, Flags

__all__ = ["Services", "Ticked", "Worker", "WorkerOptions", "new_worker_id"]

log = logging.getLogger("feishu_inbox.worker")

#: Shortest sleep: a due time in the past (another claimer holds it) must not make us spin.
MIN_SLEEP = 0.05
#: How long a worker that stops waits for its threads to end (seconds).
SHUTDOWN_WAIT = 5.0
#: How long a thread that wants the GIL waits for a busy one to give it up (CPython's default
#: is 5 ms), while batches are on. A slot running fast handlers from the buffer never blocks,
#: so the main thread, woken to send the next batch while the slot runs the rest, waited for
#: its turn until the slot had run the whole buffer: the database then worked while the slot
#: waited for its claims, never beside it. At 0.5 ms, 5,000 no-op jobs at 1 x 1 ran at
#: 4,022-4,277 jobs/s against 3,164-3,977 at 5 ms, in the same minutes.
GIL_SWITCH_INTERVAL = 0.0005


class SideThreads:
    """The worker's side threads, started together and watched: one that raises calls
    ``on_death(name, exc)`` (after logging its traceback); each closes its connections."""

    def __init__(self, on_death: Callable[[str, BaseException], None]) -> None:
        self._on_death = on_death
        self.threads: list[threading.Thread] = []

    def start(self, bodies: dict[str, Callable[[], None]]) -> None:
        self.threads = [
            threading.Thread(target=self._watched(name, body), name=name, daemon=True)
            for name, body in bodies.items()
        ]
        for thread in self.threads:
            thread.start()

    def _watched(self, name: str, body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except BaseException as exc:
                log.critical("the worker's %s thread died", name, exc_info=True)
                self._on_death(name, exc)
            finally:
                connections.close_all()

        return run

    def join(self, deadline: float) -> list[str]:
        """Wait for them until ``deadline`` (monotonic); the names of those still running."""
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]


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
        self.handlers = registry.registered()
        self.flags = Flags()
        self.crew = Crew(
            options=options,
            worker_id=self.worker_id,
            lease_seconds=self.lease_seconds,
            flags=self.flags,
            slots=Slots(self.flags.wake),
            database=Database(options, self.flags.stop),
        )
        self.claimer = Claimer(
            self.crew,
            batch_window=conf.BATCH_WINDOW,
            batch_size=conf.BATCH_SIZE,
            together=conf.FINISH_TOGETHER,
        )
        self.executor = Executor(self.crew, self.claimer, self.handlers)
        self.heartbeat = Heartbeat(self.crew, self.claimer, self.executor)
        self.listener = Listener(self.crew, conf.POLL_INTERVAL)
        self.maintenance = Maintenance(self.crew)
        self.schedules = ScheduleTicker(self.crew, self.services, self.listener)
        self.side_threads = SideThreads(self._side_thread_died)
        self.signals = interrupts.SignalRelay(
            self._on_signal, b"feishu_inbox worker: second signal, exiting at once\n"
        )
        #: Why the worker stopped on its own (a side thread died); None: it did not.
        self.failure: str | None = None

    @property
    def outcomes(self) -> dict[str, int]:
        """Attempts ended so far, by outcome."""
        return self.crew.outcomes

    @property
    def gave_up(self) -> bool:
        """A --burst run gave up on an unreachable database (``run`` returns 1)."""
        return self.crew.database.gave_up

    @property
    def restart_requested(self) -> bool:
        """Handler threads are stuck past their timeout: ``runworker`` starts again."""
        return self.heartbeat.restart_requested

    # --- the main loop -----------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped (or, with --burst, until nothing is due): 0; 1 when a --burst run
        gave up on the database or a side thread died."""
        self.signals.install()
        switch = sys.getswitchinterval()
        if self.claimer.batch is not None:
            sys.setswitchinterval(min(switch, GIL_SWITCH_INTERVAL))
        try:
            return self._run()
        finally:
            # Whatever ends the run (a failed warm-up too): a worker run inside a site's own
            # process, or a test's, leaves that process's signal handlers (and its switch
            # interval) as it found them.
            sys.setswitchinterval(switch)
            self.signals.restore()

    def _run(self) -> int:
        loaded = self.services.warm_up()  # seconds of imports, before any lease runs
        if loaded:
            log.info("worker %s: %s", self.worker_id, loaded)
        self.side_threads.start(
            {
                "feishu-heartbeat": self.heartbeat.run,
                "feishu-listen": self.listener.run,
                "feishu-maintenance": self.maintenance.run,
                "feishu-schedules": self.schedules.run,
            }
        )
        log.info(
            "worker %s started: concurrency %s, lease %ss, handlers for %s; %s",
            self.worker_id,
            self.options.concurrency,
            self.lease_seconds,
            ", ".join(sorted(self.handlers)) or "no event type",
            self.options.scope(),
        )
        try:
            self._loop()
            self.drain()
        finally:
            self.flags.end()
            self._close()
        if self.failure is not None:
            log.error("worker %s stopped: %s", self.worker_id, self.failure)
            return 1
        log.info("worker %s stopped: %s", self.worker_id, self.outcomes or "no jobs")
        return 1 if self.gave_up else 0

    def _side_thread_died(self, name: str, exc: BaseException) -> None:
        """A side thread raised: the worker stops claiming and hands its jobs back, within
        their leases (nothing renews them now, if the heartbeat died)."""
        self.failure = f"its {name} thread died ({type(exc).__name__}: {exc})"
        self.flags.stop_claiming()

    def _close(self) -> None:
        """Leave nothing running and nothing open: a worker run inside another process (a
        test's ``call_command("runworker", burst=True)``) ends its threads and closes every
        database connection they opened."""
        deadline = time.monotonic() + SHUTDOWN_WAIT
        self.listener.wake_own()
        left = self.side_threads.join(deadline)
        left += [t.name for t in self.executor.close(deadline)]
        if left:
            log.warning("worker %s: threads still running at exit: %s", self.worker_id, left)
        self.maintenance.beat(last=True)
        connections.close_all()

    def _loop(self) -> None:
        batch, slots, options = self.claimer.batch, self.crew.slots, self.options
        while not self.flags.stop.is_set():
            self.executor.fill_slots()
            free = options.concurrency - len(slots)
            room = self.claimer.room(free)
            if options.max_jobs is not None and options.max_jobs <= slots.claimed:
                break  # what was claimed runs to its end in drain
            ended = batch.take_ended() if batch and batch.due(slot_idle=free > 0) else []
            # A free slot claims at once, unless jobs wait in the buffer: the slots run them
            # (fast handlers leave slots free on purpose) and their half-run buffer refills it.
            if ended or (free > 0 and room > 0 and not (batch and batch.buffered())):
                with self.claimer.writers:  # (its room is read again: a slot may have claimed)
                    free = options.concurrency - len(slots)
                    claimed, statuses = self.claimer.claim(free, ended)
                self.executor.place(claimed)
                self.executor.settle_all(ended, statuses)
                if claimed or (ended and not self.crew.database.backoff):
                    continue
                if (
                    options.burst
                    and not slots
                    and not self.crew.database.backoff
                    and not (batch and (batch.waiting() or batch.buffered()))
                ):
                    break  # nothing is due and nothing of ours runs
            # (jobs in the buffer: no claim follows the wake-up, so no look at the next due job)
            can_claim = free > 0 and not (batch and batch.buffered())
            self.sleep(can_claim, until=batch.deadline() if batch else None, room_held=room <= 0)
            self.flags.wake.clear()

    def sleep(
        self, can_claim: bool, *, until: float | None = None, room_held: bool = False
    ) -> None:
        """Sleep until woken, or until the next due job (when this worker can claim it).
        ``until``: when (monotonic) a batch's window ends, if one waits; ``room_held``: a
        claim in flight holds the room (a slot writing its own batch)."""
        backoff = self.crew.database.backoff
        if backoff:
            self.flags.stop.wait(backoff)
            return
        longest = self.listener.longest_sleep()
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
                due = seconds_until_wakeup(self.options.keys)
            except DATABASE_AWAY as exc:
                self.crew.database.away("reading the next wake-up", exc)
                return
            if due is not None:
                timeout = min(longest, max(MIN_SLEEP, due))
        self.flags.wake.wait(timeout)

    # --- stop and drain ----------------------------------------------------------------------

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
        busy = f"{len(self.crew.slots)} of {self.options.concurrency} slots busy"
        if self.flags.done.is_set():
            return False, f"worker {self.worker_id} has stopped"
        if self.failure is not None:
            return False, f"worker {self.worker_id} is stopping: {self.failure}; {busy}"
        if self.flags.stop.is_set():
            return False, f"worker {self.worker_id} is stopping; {busy}"
        away_since = self.crew.database.away_since
        if away_since is not None:
            away = time.monotonic() - away_since
            return False, f"worker {self.worker_id}: the database unreachable for {away:.0f}s"
        return True, f"ok: worker {self.worker_id}, {busy}"

    def stop(self) -> None:
        """Stop claiming (and ticking schedules); ``run`` then drains and returns."""
        self.flags.stop_claiming()

    def drain(self) -> None:
        """After the main loop: run or hand back what this worker holds.

        A natural end (--burst, --max-jobs) waits for running handlers however long they
        take, and runs what its buffer holds; only a stop request (a signal) limits them to
        the grace period, and hands the buffer back at once. A side thread that died limits
        them to their leases too: nothing renews them any more."""
        batch, slots, flags = self.claimer.batch, self.crew.slots, self.flags
        if not flags.stop.is_set():
            while not flags.stop.is_set() and (
                slots or (batch and (batch.buffered() or batch.waiting()))
            ):
                self.executor.fill_slots()
                self.write_ended()
                backoff = self.crew.database.backoff
                pause = backoff or (batch.window if batch and batch.waiting() else 1.0)
                flags.wake.wait(pause)
                flags.wake.clear()
        if batch is not None:
            self.claimer.give_back(batch.take_buffered(), attempts.STOPPED)
        deadline = time.monotonic() + self.options.grace_seconds
        if self.failure is not None:
            leases_end = [c.renewed_at + c.lease_seconds for c in slots.held()]
            deadline = min([deadline, *(end - 2 * writes.LEASE_MARGIN for end in leases_end)])
        while slots and time.monotonic() < deadline:
            self.write_ended()
            flags.wake.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            flags.wake.clear()
        self.write_ended(patiently=True)
        for ctx in slots.held():
            attempts.hand_back_running(ctx)
        self.write_ended(patiently=True)  # the handlers that returned meanwhile
        if batch is not None:  # what a slot's last batch claimed, or a lost reply's
            self.claimer.give_back(batch.take_buffered(), attempts.STOPPED)
        with self.claimer.returning:  # the heartbeat hands back nothing more
            self.claimer.give_back_the_rest()

    def write_ended(self, *, patiently: bool = False) -> None:
        """Write the batch's waiting finishes now, claiming nothing (the worker is ending).
        Jobs a lost reply had claimed, found again, are handed back. ``patiently``: while the
        database is away, try again until the oldest of their leases is about to end (as
        ``writes.write`` does for one finish); else once."""
        batch = self.claimer.batch
        if batch is None:
            return
        delay = writes.RETRY_FIRST_DELAY
        while batch.waiting():
            ended, found, statuses = self.claimer.write_ended()
            self.executor.settle_all(ended, statuses)
            self.claimer.give_back(found, attempts.STOPPED)
            if statuses or not patiently:
                return
            left = min(entry.ctx.lease_left() for entry in ended) - writes.LEASE_MARGIN
            if left <= 0:
                log.error("%s finishes not written before their leases ran out", len(ended))
                return
            time.sleep(min(delay, left))  # a backoff between tries, not a synchronisation
            delay = min(delay * 2, writes.RETRY_LONGEST_DELAY)
