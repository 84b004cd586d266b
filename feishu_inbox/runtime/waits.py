"""Durable waits inside a handler (SPEC §9e): sleep, sleep until a time, wait for a signal.

    @feishu_inbox.handler("im.message.receive_v1")
    def remind(event):
        plan = feishu_inbox.step("plan", llm_plan, event.payload)      # paid once
        feishu_inbox.sleep(timedelta(hours=2))                           # no slot, no thread
        try:
            paid = feishu_inbox.wait_for(f"payment:{plan['order']}", timeout=timedelta(days=1))
        except feishu_inbox.WaitTimedOut:
            paid = None
        feishu_inbox.reply(event, "paid" if paid else "expired")

    # anywhere in the site, inside its own transaction:
    feishu_inbox.signal(f"payment:{order.id}", {"amount": 42})

A wait that has not resolved stops the handler (``Suspended``, which no ``except Exception``
catches) and the worker sets the job ``waiting``: no lease, no slot, no thread; by default its
chat's later jobs run meanwhile (``hold_chat=True`` keeps them behind it). When the signal
commits, or the time comes, the job is due again at its place in its chat's receipt order
(after the chat's running job, if one runs) and its handler runs again from the start: its
steps return their memo, and each wait its outcome, so what ran before the wait does not run
again. Waits are named by their order in the handler (``wait:1``, ``wait:2``…) unless given a
``name``; a run that waits in another order is refused (``WaitRefused``).

In an ``async def`` handler each of these returns an awaitable: ``await feishu_inbox.sleep(5)``.
A wait is refused (``WaitRefused``) after an effect of the attempt that ran outside a step (a
resumed run would repeat it), and in a django.tasks task.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .. import telemetry
from ..errors import LedgerError, Suspended, WaitRefused, WaitTimedOut
from ..ledger.kinds import describe_key, kind_of
from . import context, handlers, writes

if TYPE_CHECKING:
    from ..ledger.waits import Sent

#: Wait states, and the longest name (``ledger/waits.py``, which this module imports
#: only when a wait runs: ``feishu_inbox`` loads before Django's models).
OPEN, DELIVERED, TIMED_OUT = "open", "delivered", "timed_out"
NAME_LIMIT = 128


def signal(key: str, payload: Any = None, *, keep: bool | float | timedelta = True) -> Sent:
    """Deliver ``payload`` to the job that waits for ``key`` (the oldest, if several do),
    inside the caller's transaction: the job resumes once it commits, never if it rolls back.

    With no job waiting: ``keep=True`` keeps the signal for the first job that will wait for
    the key, for ``SIGNAL_KEEP`` (default one day), or for ``keep`` seconds / a timedelta;
    ``keep=False`` refuses it (``NoWaiter``) and changes nothing. Returns ``Sent`` (the job it
    resumed, or that it was kept).
    """
    from ..ledger import waits as ledger_waits

    return ledger_waits.signal(key, payload, keep=keep)


def sleep(duration: timedelta | float, *, name: str | None = None, hold_chat: bool = False) -> Any:
    """Sleep ``duration`` (a timedelta or seconds) durably: the job waits without a slot and
    resumes after it, once, even across restarts."""
    seconds = as_seconds(duration, "sleep")
    return in_handler(lambda: _wait(key="", seconds=seconds, name=name, hold_chat=hold_chat))


def sleep_until(when: datetime, *, name: str | None = None, hold_chat: bool = False) -> Any:
    """Sleep until ``when`` (an aware datetime) durably; at once if it has passed."""
    if not isinstance(when, datetime) or when.tzinfo is None:
        raise LedgerError(
            f"sleep_until needs an aware datetime (got {when!r:.80}).",
            fix="Pass e.g. django.utils.timezone.now() + timedelta(days=1).",
        )

    def run() -> Any:
        from ..ledger.stats import database_now

        seconds = (when - database_now()).total_seconds()
        return _wait(key="", seconds=seconds, name=name, hold_chat=hold_chat)

    return in_handler(run)


def wait_for(
    key: str,
    *,
    timeout: timedelta | float | None,
    name: str | None = None,
    hold_chat: bool = False,
) -> Any:
    """Wait for the signal ``key`` (``feishu_inbox.signal``) and return its payload; raise
    ``WaitTimedOut`` once ``timeout`` (a timedelta or seconds; None: never) passes first. A
    signal sent before the wait began and kept for it is returned at once."""
    from ..ledger.waits import check_key

    check_key(key)
    seconds = None if timeout is None else as_seconds(timeout, "timeout")
    return in_handler(lambda: _wait(key=key, seconds=seconds, name=name, hold_chat=hold_chat))


def as_seconds(value: timedelta | float, what: str) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds != seconds:
        raise LedgerError(
            f"A {what} must be a timedelta or a number of seconds (got {value!r:.80}).",
            fix="e.g. timedelta(hours=1), or 3600.",
        )
    return float(seconds)


def in_handler(run: Any) -> Any:
    """Run ``run`` now (a sync handler), or return an awaitable that runs it off the event
    loop (an async handler: the ledger's calls block)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    ctx = context.current()

    async def waited() -> Any:
        token = context.enter(ctx)
        try:
            return await asyncio.to_thread(handlers.in_db_thread, _in_context, ctx, run)
        finally:
            context.leave(token)

    return waited()


def _in_context(ctx: context.JobContext, run: Any) -> Any:
    token = context.enter(ctx)
    try:
        return run()
    finally:
        context.leave(token)


def _wait(*, key: str, seconds: float | None, name: str | None, hold_chat: bool) -> Any:
    name, memo = open_wait(key=key, seconds=seconds, name=name, hold_chat=hold_chat)
    return outcome(name, memo)


def open_wait(
    *,
    key: str,
    seconds: float | None,
    name: str | None,
    hold_chat: bool,
    ask: dict[str, Any] | None = None,
) -> tuple[str, Any]:
    """The running job's wait: checked, then recorded (open, or the memo of an earlier run),
    without suspending yet: ``outcome`` does. Returns its name and its ``WaitMemo``. ``ask``
    (what ``feishu_inbox.ask`` opens before its card leaves): the question's rule."""
    ctx = context.current()
    ctx.ensure_alive()
    ctx.ensure_in_time()
    event = ctx.event
    if not kind_of(event.event_type).can_wait:
        raise WaitRefused(
            f"Job {event.job_id} ({event.event_type}) is a django.tasks task, which cannot "
            "wait: its result has no waiting state.",
            fix="Wait in a Feishu handler or a schedule; a task can signal one "
            "(feishu_inbox.signal).",
        )
    name = name or f"wait:{len(ctx.waits_run) + 1}"
    if not isinstance(name, str) or len(name) > NAME_LIMIT:
        raise LedgerError(f"A wait's name is a string of at most 128 characters ({name!r:.80}).")
    if name in ctx.waits_run:
        raise WaitRefused(f"Job {event.job_id} waited twice under the name {name!r}.")
    ctx.waits_run.append(name)
    if ctx.unstepped_effect:
        raise WaitRefused(
            f"Job {event.job_id} cannot wait after an effect that ran outside a step: its "
            "resumed run would repeat that effect.",
        )
    memo = _record(ctx, name, key, seconds, hold_chat, ask)
    if memo.key != key:
        raise WaitRefused(
            f"Job {event.job_id}'s wait {name!r} waited for {memo.key or 'a time'!r} before, "
            f"not {key or 'a time'!r}: its waits ran in another order.",
        )
    return name, memo


def reopen_wait(name: str) -> tuple[str, Any]:
    """The running job's wait ``name`` read again (it was resolved since ``open_wait``)."""
    from ..ledger import waits as ledger_waits

    ctx = context.current()
    memo = writes.write(
        ctx, "read the wait of", lambda _: ledger_waits.memo_of(ctx.event.job_id, name)
    )
    return name, memo


def _record(
    ctx: context.JobContext,
    name: str,
    key: str,
    seconds: float | None,
    hold_chat: bool,
    ask: dict[str, Any] | None,
) -> Any:
    from ..ledger import waits as ledger_waits

    return writes.write(
        ctx,
        "wait in",
        lambda _: ledger_waits.begin_wait(
            ctx.lease,
            name=name,
            key=key,
            seconds=seconds,
            hold_chat=hold_chat,
            lease_seconds=ctx.lease_seconds,  # the worker's own lease length, not the site's
            ask=ask,
        ),
    )


def outcome(name: str, memo: Any) -> Any:
    """What the wait ``memo`` gives the handler: its payload (a signal), None (a sleep), or
    ``WaitTimedOut``; an open wait suspends the job (``Suspended``)."""
    ctx = context.current()
    event = ctx.event
    key = memo.key
    what = describe_key(key)
    if memo.state == OPEN:
        raise Suspended(name, what)
    if memo.waited is not None:
        telemetry.WAITED_SECONDS.labels(memo.state).observe(max(0.0, memo.waited))
    if memo.state == DELIVERED or not key:
        return memo.payload if key else None
    if memo.state == TIMED_OUT:
        raise WaitTimedOut(f"Job {event.job_id} waited for {what} until its timeout.")
    raise WaitRefused(f"Job {event.job_id}'s wait {name!r} was cancelled.")
