"""The heartbeat: a worker's leases renewed, its handlers' timeouts kept, and the signals an
operator or a newer message sends a running job (cancel, supersede) passed on.

It renews every lease a third of the way through it, and looks for newer private messages at
least twice a second for every running private job (SPEC §4), whatever else runs; a NOTIFY
naming such a job's chat looks at once. A handler past its timeout (and its grace) is stopped
here: its attempt is ended, fenced, so nothing its thread does later lands. A renewal refused
marks the job lost and frees its slot. Buffered jobs that waited too long for a slot go back
from here too (``Claimer.hand_back_stale``).
"""

from __future__ import annotations

import logging
import time

from django.db import DatabaseError, connections

from .. import telemetry
from ..errors import LeaseLost, TimedOut
from ..ledger import rules as ledger
from . import attempts, registry, turns, writes
from .claimer import Claimer
from .context import JobContext
from .executor import Executor
from .state import DATABASE_AWAY, Crew, check_connection

log = logging.getLogger("feishu_inbox.worker")

#: The heartbeat's longest sleep: how late a newer private message may be noticed (SPEC §4).
HEARTBEAT_TICK = 0.5
#: A handler past its timeout has this long to reach a checkpoint before the worker stops it.
TIMEOUT_GRACE = 1.0


class Heartbeat:
    """The body of a worker's ``feishu-heartbeat`` thread (``run``)."""

    def __init__(self, crew: Crew, claimer: Claimer, executor: Executor) -> None:
        self._crew = crew
        self._claimer = claimer
        self._executor = executor
        #: Handler threads stuck past their timeout: the worker asks to be started again.
        self.restart_requested = False

    def run(self) -> None:
        crew = self._crew
        renew_every = crew.lease_seconds / 3
        tick = min(renew_every, HEARTBEAT_TICK)
        while not crew.flags.done.is_set():
            self.beat(renew_every)
            crew.flags.check_now.clear()
            self.look_for_signals()
            crew.flags.check_now.wait(tick)
        connections.close_all()

    def beat(self, renew_every: float) -> None:
        """One round: the timeouts kept, the leases due renewed, the stale buffer handed back."""
        for ctx in self._crew.slots.held():
            if ctx.lost.is_set() or ctx.ending:
                continue
            if ctx.deadline is not None and time.monotonic() >= ctx.deadline + TIMEOUT_GRACE:
                self.time_out(ctx)
            elif time.monotonic() - ctx.renewed_at >= renew_every:
                self.renew(ctx)
        self._claimer.hand_back_stale()

    def renew(self, ctx: JobContext) -> None:
        """Renew one job's lease; a lease refused is lost (its slot is freed at once)."""
        sent = time.monotonic()
        try:
            check_connection()
            ledger.renew(ctx.lease, lease_seconds=self._crew.lease_seconds)
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

    def look_for_signals(self) -> None:
        """Tell running handlers, at their next checkpoint, that an operator cancelled their
        job or a newer private message supersedes it: one statement for all of them."""
        running = {
            ctx.lease.job_id: ctx for ctx in self._crew.slots.held() if not ctx.lost.is_set()
        }
        if not running:
            return
        try:
            check_connection()
            found = ledger.signals(ctx.lease for ctx in running.values())
        except DATABASE_AWAY:
            writes.drop_connection()  # the database is away: look again next tick
            return
        for job_id, signal_ in found.items():
            if signal_.cancelled:
                running[job_id].cancelled.set()
            if signal_.superseded and not self._turns(running[job_id]):
                running[job_id].interrupt.set()
        in_turns = [ctx for ctx in running.values() if ctx.turn_spec is not None]
        if in_turns:  # a stop command, a recall, a new message behind a turn (SPEC §9g)
            try:
                turns.look_behind(in_turns)
            except DATABASE_AWAY:
                writes.drop_connection()
            except DatabaseError as exc:  # a statement refused: logged, looked at next tick
                log.warning("looking behind the running turns failed (%s)", exc)

    @staticmethod
    def _turns(ctx: JobContext) -> bool:
        """Whether the job's handler coalesces: then its ``during`` decides what a newer
        message does, not the private-message rule (``turns.look_behind``)."""
        return registry.turns_for(ctx.event.event_type)[0] is not None

    def time_out(self, ctx: JobContext) -> None:
        """A handler ran past its timeout and reached no checkpoint: end its attempt here.
        The attempt's end is fenced by its lease, so nothing its thread does afterwards (a
        finish, a step, an effect's start) lands; the slot is freed at once. An effect in
        flight makes it ``unknown``, as any failure does; else it is retried by its policy."""
        crew = self._crew
        ctx.timed_out.set()  # its next checkpoint, step or effect raises TimedOut
        error = TimedOut(
            f"Job {ctx.event.job_id} ran past its handler's timeout of "
            f"{ctx.timeout_seconds:g}s and was stopped by the worker."
        )
        try:
            state = attempts.fail(ctx, error)
        except LeaseLost as exc:  # its own end landed first, or the lease was gone
            log.debug("job %s: not timed out (%s)", ctx.event.job_id, exc)
            return
        except DATABASE_AWAY as exc:
            log.error("job %s: its timeout could not be written (%s)", ctx.event.job_id, exc)
            writes.drop_connection()
            ctx.ending = False  # try again at the next tick
            return
        crew.count("timed_out")
        log.error(
            "job %s event %s type %s: %s; the attempt ended %s, its %s",
            ctx.event.job_id,
            ctx.event.event_id,
            ctx.event.event_type,
            error,
            state,
            "coroutine is cancelled" if ctx.cancel_async is not None else "thread is abandoned",
        )
        abandoned = self._executor.abandon(ctx)
        ctx.mark_lost("timed out")
        if abandoned >= max(2, crew.options.concurrency) and not crew.flags.stop.is_set():
            log.error(
                "worker %s: %d handler threads are stuck past their timeout; restarting "
                "(the running jobs finish first, within the grace period)",
                crew.worker_id,
                abandoned,
            )
            self.restart_requested = True
            crew.flags.stop.set()
            crew.flags.wake.set()
