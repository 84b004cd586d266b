"""An attempt that ends other than by finishing: it fails (retried by its policy, or at the time
a ``RetryAt`` asked for), it is deferred (back without spending an attempt: a limit, a pause),
or it is handed back (the database was away before its handler ran, the worker stops, a claimed
job never started). Finishes are the claimer's (``claimer.py``).

Every write here is fenced by the job's lease; those of a running job go through
``writes.write``, tried again through a database blink while the lease lasts (SPEC §6).
"""

from __future__ import annotations

import logging

from ..errors import Deferred, InvalidState, LeaseLost, Suspended, WaitRefused
from ..ledger import limits, waits
from ..ledger import rules as ledger
from ..ledger.retry import RetryAfter, RetryAt
from ..ledger.stats import database_now
from . import registry, writes
from .context import JobContext
from .state import DATABASE_AWAY, check_connection

log = logging.getLogger("feishu_inbox.worker")

#: Why a buffered job went back: no slot was free for it in time.
WAITED = "It waited too long for a free slot."
#: Why a claimed job that never started went back: the worker stopped.
STOPPED = "The worker shut down."


def fail(ctx: JobContext, error: BaseException) -> str:
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
            writes.write(ctx, "read the clock for", lambda _: error.seconds_from(database_now()))
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


def defer(
    ctx: JobContext, wait: Deferred, error_type: str = limits.WAITING, *, or_fail: bool = True
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
        return fail(ctx, RetryAfter(wait.seconds, wait.reason))


def suspend(ctx: JobContext, waiting: Suspended) -> str:
    """The handler stopped at an open wait (SPEC §9e): the job waits, giving its slot (and by
    default its chat) back, without spending an attempt; ``queued`` when its wait was
    resolved meanwhile. A job that cannot wait (an effect of it is open) fails instead."""
    ctx.ensure_alive()
    ctx.ending = True
    try:
        return writes.write(
            ctx,
            "suspend",
            lambda retrying: waits.suspend(
                ctx.lease, name=waiting.name, what=waiting.what, retrying=retrying
            ),
        )
    except InvalidState as refused:
        ctx.ending = False
        return fail(ctx, WaitRefused(refused.message, fix=refused.fix))


def hand_back_after_error(ctx: JobContext, exc: Exception) -> str:
    """A job's own call raised a database error that nothing tried again. When it is the
    database being away before the handler was called, it goes back to the queue (tried
    again while its lease lasts) rather than waiting out its lease."""
    if not writes.transient(exc):  # not a blink: a bug
        log.error("job %s: the ledger refused a write (%s)", ctx.event.job_id, exc, exc_info=exc)
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


def hand_back_running(ctx: JobContext) -> None:
    """The worker stops and the job's handler is still running past the grace period: back
    to the queue without spending an attempt, unless an effect of it started (its lease then
    expires and it becomes ``unknown``: an effect is never repeated)."""
    if ctx.effects_started:
        log.warning(
            "job %s is inside an effect past the grace period; its lease will "
            "expire and it will become unknown",
            ctx.event.job_id,
        )
        return
    try:
        check_connection(force=True)
        ctx.ending = True
        state = writes.write(
            ctx, "hand back", lambda retrying: ledger.hand_back(ctx.lease, retrying=retrying)
        )
        ctx.mark_lost("handed back at shutdown")
        log.info("job %s handed back (%s)", ctx.event.job_id, state)
    except (LeaseLost, InvalidState) as exc:
        log.warning("job %s not handed back: %s", ctx.event.job_id, exc)


def hand_back_unstarted(job: ledger.ClaimedJob, why: str, *, retrying: bool = False) -> str:
    """Give back a claimed job that never started, without spending an attempt. Returns
    ``HANDED_BACK``; ``REFUSED`` (it was not ours any more: nothing to try again); or ``AWAY``:
    the database is away (the hand back may have landed: a caller that tries again passes
    ``retrying``, and must not start the job meanwhile)."""
    try:
        check_connection()
        state = ledger.hand_back(job.lease, message=why, retrying=retrying)
    except (LeaseLost, InvalidState) as exc:
        log.warning("job %s not handed back: %s", job.id, exc)
        return REFUSED
    except DATABASE_AWAY as exc:
        writes.drop_connection()
        log.warning("job %s not handed back (the database is away): %s", job.id, exc)
        return AWAY
    log.info("job %s handed back before it started (%s): %s", job.id, state, why)
    return HANDED_BACK


#: What ``hand_back_unstarted`` returns.
HANDED_BACK, REFUSED, AWAY = "handed_back", "refused", "away"
