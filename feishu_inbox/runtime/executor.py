"""One job on a slot: its context, its handler, its outcome.

``Executor.start`` puts a claimed job on a slot (a thread of the pool); ``run_one`` calls its
handler under the job's context (pauses looked at, concurrency slots and rate limits taken,
``async def`` handlers on the event loop) and ends its attempt: finished through the claimer
(which may hand the slot its next job at once), or failed, deferred or handed back
(``attempts``). Each ended attempt is counted, traced and logged here (``account``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from .. import telemetry, tracing
from ..errors import (
    Cancelled,
    Concluded,
    Deferred,
    InvalidState,
    LeaseLost,
    Superseded,
    Suspended,
)
from ..ledger import pauses
from ..ledger import rules as ledger
from ..ledger.kinds import RESULT_STEP, WORKFLOW_EVENT_PREFIX
from . import attempts, context, handlers, registry, steps, turns, writes
from . import limits as rate_limits
from .batching import Ended
from .claimer import Claimed, Claimer
from .pools import AsyncRunner, HandlerPool
from .state import DATABASE_AWAY, Crew, check_connection

log = logging.getLogger("feishu_inbox.worker")

#: A job's state after its attempt and the job its slot runs next (None: the slot is free).
Ran = tuple[str, context.JobContext | None]


class Executor:
    """Runs claimed jobs on the worker's slots."""

    def __init__(self, crew: Crew, claimer: Claimer, handler_map: dict[str, Any]) -> None:
        self._crew = crew
        self._claimer = claimer
        self.handlers = handler_map
        self.pool = HandlerPool()
        self.async_runner = AsyncRunner()
        self._warned_no_handler: set[str] = set()
        #: Held while buffered jobs are started on the free slots.
        self._filling = threading.Lock()
        #: Handler threads still running a job that timed out (``abandon``).
        self._abandoned = 0
        self._abandoned_lock = threading.Lock()

    # --- on a slot ------------------------------------------------------------------------

    def context_for(
        self, job: ledger.ClaimedJob, sent: float, started: float | None = None
    ) -> context.JobContext:
        """A claimed job's context. ``sent``: when its lease was asked for; ``started``: when
        it starts, if later (it waited in the batch's buffer)."""
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
            tenant=job.tenant,
        )
        timeout = registry.timeout_for(job.event_type)
        return context.JobContext(
            lease=job.lease,
            event=event,
            lease_seconds=self._crew.lease_seconds,
            renewed_at=sent,
            started=started,
            has_steps=job.has_steps,
            on_lost=self._crew.slots.free,
            deadline=None if timeout is None else started + timeout,
            trace_parent=job.trace_parent,
        )

    def start(self, job: ledger.ClaimedJob, sent: float, started: float | None = None) -> None:
        ctx = self.context_for(job, sent, started)
        self._crew.slots.take(ctx)
        if job.private_message:
            self._crew.flags.check_now.set()  # a newer message may already wait
        self.pool.submit(lambda: self._run_job(ctx))

    def place(self, claimed: list[Claimed]) -> None:
        """Start claimed jobs: on the free slots, the rest into the buffer (batches only:
        without them a claim takes no more than the free slots)."""
        batch = self._claimer.batch
        if batch is None:
            for job, sent in claimed:
                self.start(job, sent)
            return
        batch.buffer(claimed)
        self.fill_slots()

    def fill_slots(self) -> None:
        """Start buffered jobs on the slots that are free."""
        batch, crew = self._claimer.batch, self._crew
        if batch is None:
            return
        with self._filling:  # the main thread and a slot that wrote a batch both fill
            while len(crew.slots) < crew.options.concurrency and not crew.flags.stop.is_set():
                if not batch.needs_slot(len(crew.slots)):
                    return
                item = batch.next_buffered()
                if item is None:
                    return
                self.start(*item, started=time.monotonic())

    def _run_job(self, ctx: context.JobContext | None) -> None:
        """Run a job; while its slot's next claim succeeds, run that one too on this thread."""
        while ctx is not None:
            ctx = self.run_one(ctx)

    def run_one(self, ctx: context.JobContext) -> context.JobContext | None:
        """Run one job to the end of its attempt; returns the job this slot runs next."""
        crew = self._crew
        event, started = ctx.event, ctx.started
        check_connection()
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
                "feishu_inbox.worker.id": crew.worker_id,
            },
        )
        try:
            outcome, following = self._execute(ctx)
        except LeaseLost as exc:
            ctx.mark_lost(str(exc))
            outcome = "lease_lost"
        except DATABASE_AWAY as exc:  # the worker's own call, not tried again
            writes.drop_connection()
            outcome = attempts.hand_back_after_error(ctx, exc)
        finally:
            with self._abandoned_lock:
                ctx.thread_done = True
                if ctx.abandoned:  # the worker timed it out; its thread is back
                    self._abandoned -= 1
            took = time.monotonic() - started
            if outcome is PENDING:  # its finish waits for the batch; the slot goes on
                span.detach()
                running = not crew.flags.stop.is_set()
                item, ended, statuses = self._claimer.hand_over(
                    Ended(ctx, span, took), running=running
                )
                if item is not None:
                    following = self.context_for(*item, started=time.monotonic())
                    if item[0].private_message:
                        crew.flags.check_now.set()  # a newer message may already wait
                crew.slots.free(ctx, successor=following)
                if ended:
                    self.fill_slots()
                    self.settle_all(ended, statuses)
            else:
                crew.slots.free(ctx, successor=following)
                self.account(ctx, outcome, span, took)
        return following

    def _execute(self, ctx: context.JobContext) -> Ran:
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
                state = attempts.defer(ctx, wait, error_type=pauses.PAUSED, or_fail=False)
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
            spec, deadline = registry.turns_for(event.event_type)
            if spec is not None or deadline is not None:
                turns.begin(ctx, spec, deadline)  # a turn formed, or Deferred, or Concluded
            # a slot first: a job that waits for one must not spend a token each time it looks
            # (a handler that declares neither costs two dict lookups)
            specs = registry.concurrency_for(event.event_type)
            if specs:
                slots = rate_limits.take_slots(ctx, specs)
            own_limits = registry.rate_limits_for(event.event_type)
            if own_limits:
                rate_limits.acquire(own_limits)
            ctx.handler_started = True
            returned: list[Any] = []
            if handlers.is_async(fn):
                traced = tracing.captured()  # the job's span, on the loop's thread too

                async def call() -> Any:
                    context.enter(ctx)
                    try:
                        with tracing.attached(traced):
                            returned.append(await fn(ctx.event))
                            return returned[-1]
                    except (KeyboardInterrupt, SystemExit) as exc:
                        # Raised in the event loop they would stop it for every async handler.
                        raise _HandlerExit(exc) from exc

                self.async_runner.run(call, ctx)
            else:
                returned.append(fn(ctx.event))
            value = returned[0] if returned else None
            if value is not None and event.event_id.startswith(WORKFLOW_EVENT_PREFIX):
                steps.record_result(ctx, RESULT_STEP, value)
        except Deferred as wait:
            return attempts.defer(ctx, wait), None
        except Suspended as waiting:
            return self._ended(ctx, (attempts.suspend(ctx, waiting), None), None)
        except Superseded as exc:
            return self._ended(ctx, self._finish(ctx, superseded=True), exc)
        except Cancelled as exc:
            note = "Stopped" if isinstance(exc, turns.Stopped) else "Cancelled"
            return self._ended(ctx, self._finish(ctx, note=note), exc)
        except Concluded as done:  # its kind ends it here: completed, why kept (no retry)
            return self._ended(ctx, self._finish(ctx, note=done.note[:128]), done)
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
            return self._ended(ctx, (attempts.fail(ctx, error), None), error)
        finally:
            context.leave(token)
            if slots and not ctx.lost.is_set() and not ctx.timed_out.is_set():
                try:
                    rate_limits.give_back_slots(ctx, slots)
                except (LeaseLost, *DATABASE_AWAY) as exc:  # they stop counting with the lease
                    log.warning("job %s: slots not given back (%s)", ctx.event.job_id, exc)
        return self._ended(ctx, self._finish(ctx), None)

    def _finish(self, ctx: context.JobContext, *, superseded: bool = False, note: str = "") -> Ran:
        """The claimer finishes the job (and may claim this slot's next one); ``PENDING``:
        the batch writes it (``run_one`` hands it over)."""
        finished = self._claimer.finish(ctx, superseded=superseded, note=note)
        if finished is None:
            return PENDING, None
        label, following = finished
        return label, None if following is None else self.context_for(*following)

    def _ended(self, ctx: context.JobContext, result: Ran, error: BaseException | None) -> Ran:
        """Tell the job's ``on_end`` (a task's signals) how its attempt ended; what it raises
        is logged, never the worker's concern."""
        ctx.ended_by = error
        if ctx.on_end is not None and result[0] is not PENDING:  # else: once it is written
            _call_on_end(ctx, result[0], error)
        return result

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

    # --- ended attempts -------------------------------------------------------------------

    def settle_all(self, ended: Sequence[Ended], statuses: list[str | None]) -> None:
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
                outcome = status = self._claimer.finish_fenced_out(entry)
            except LeaseLost as exc:
                ctx.mark_lost(str(exc))
                outcome = "lease_lost"
            except DATABASE_AWAY as exc:  # the batch's reply came: a bug; log it
                log.exception("job %s: the ledger refused a write (%s)", ctx.event.job_id, exc)
                writes.drop_connection()
                outcome = "database_error"
        if status is not None and ctx.on_end is not None:  # told only of a written end
            _call_on_end(ctx, status, None)
        self.account(ctx, outcome, entry.span, entry.took)

    def account(
        self, ctx: context.JobContext, outcome: str, span: tracing.Span, took: float
    ) -> None:
        """Count, trace and log an attempt that ended (``took``: seconds on its slot)."""
        event = ctx.event
        self._crew.count(outcome)
        label = _outcome_label(ctx, outcome)
        telemetry.JOBS_FINISHED.labels(event.event_type, label).inc()
        span.set("feishu_inbox.outcome", label)
        span.end(ctx.ended_by if label not in _CLEAN_ENDS else None)
        telemetry.HANDLER_SECONDS.labels(event.event_type).observe(took)
        if ctx.cleanups and outcome in _ENDS:  # its turn's cleanups, now rather than at a sweep
            ledger.fire_cleanups()
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

    def abandon(self, ctx: context.JobContext) -> int:
        """The heartbeat ended ``ctx``'s attempt at its timeout: an async handler's task is
        cancelled (its thread, which only waits for it, comes back at once); a sync one's
        thread, still in the handler, is abandoned. Returns the threads abandoned so far."""
        with self._abandoned_lock:
            if ctx.cancel_async is not None:
                ctx.cancel_async()  # CancelledError at its next await
            elif not ctx.thread_done:  # its thread still runs the handler: it is stuck
                ctx.abandoned = True
                self._abandoned += 1
            return self._abandoned

    def close(self, deadline: float) -> list[threading.Thread]:
        """End the pool's threads and the event loop by ``deadline`` (monotonic); returns the
        threads still running (a handler abandoned at its timeout)."""
        stuck = self.pool.shutdown(max(0.0, deadline - time.monotonic()))
        self.async_runner.close(max(0.0, deadline - time.monotonic()))
        return stuck


def _call_on_end(ctx: context.JobContext, state: str, error: BaseException | None) -> None:
    assert ctx.on_end is not None
    try:
        ctx.on_end(state, error)
    except Exception:
        log.exception("job %s: its end's callback raised", ctx.event.job_id)


def _count_start(job: ledger.ClaimedJob) -> None:
    """A claimed job starts: counted, and how long it waited since it was due (by this
    host's clock against the database's due time: the same host, or NTP-close ones)."""
    telemetry.CLAIMED_JOBS.inc()
    if job.due_at is not None:
        waited = (datetime.now(timezone.utc) - job.due_at).total_seconds()
        telemetry.WAIT_SECONDS.labels(job.event_type).observe(max(0.0, waited))


#: What ``_finish`` returns for a finish the batch writes (``run_one`` hands it over).
PENDING = "pending"

#: The worker's outcomes (the ledger's state after the attempt) as the metrics name them.
_OUTCOMES = {"retry_wait": "retried", "queued": "deferred", "running": "deferred"}

#: The outcomes after which a job's cleanups are due (SPEC §9g).
_ENDS = frozenset({"completed", "failed", "unknown"})

#: Outcomes whose span ends without an error status (what ended them was the ledger's word).
_CLEAN_ENDS = frozenset({"completed", "superseded", "cancelled", "stopped", "deferred", "waiting"})


def _outcome_label(ctx: context.JobContext, outcome: str) -> str:
    if ctx.timed_out.is_set():
        return "timed_out"
    if outcome == "completed" and isinstance(ctx.ended_by, Superseded):
        return "superseded"
    if outcome == "completed" and isinstance(ctx.ended_by, turns.Stopped):
        return "stopped"
    if outcome == "completed" and isinstance(ctx.ended_by, Cancelled):
        return "cancelled"
    return _OUTCOMES.get(outcome, outcome)


class _HandlerExit(Exception):
    """A handler's SystemExit or KeyboardInterrupt, carried out of the event loop."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original
