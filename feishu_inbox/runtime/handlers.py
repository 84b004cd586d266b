"""The handler API: effects and checkpoints (registering a handler: ``registry``; the event a
handler sees: ``context``).

    import feishu_inbox

    @feishu_inbox.handler("im.message.receive_v1")
    def reply(event):
        answer = think(event.payload)          # may run again after a crash: no effects here
        feishu_inbox.checkpoint()              # stop here if a newer direct message waits
        with feishu_inbox.effect():            # persisted before the call starts
            send_reply(answer)                 # never repeated automatically after this line
        feishu_inbox.reply(event, answer)      # an idempotent effect: re-sent, same uuid
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, TypeVar

from .. import telemetry, tracing
from ..errors import (
    Cancelled,
    DuplicateEffect,
    IdempotencyWindowPassed,
    LeaseLost,
    LedgerError,
    Superseded,
)
from ..ledger.idempotency import Idempotent, effect_key
from ..ledger.limits import RateLimit
from . import turns
from .context import JobContext, current
from .limits import acquire
from .registry import Handler
from .writes import write

T = TypeVar("T")


def checkpoint() -> None:
    """Stop here if an operator cancelled this job (raise ``Cancelled``) or a newer private
    message waits in its chat (raise ``Superseded``).

    Call it between completed operations, never inside an effect. The worker looks for both at
    least twice a second; between those looks a checkpoint costs nothing.
    """
    ctx = current()
    ctx.ensure_alive()
    ctx.ensure_in_time()
    _stop_if_asked(ctx)
    if ctx.merge_waiting:  # a turn that merges: the messages behind it join it here
        turns.merge(ctx)


def safe_point() -> None:
    """A checkpoint that takes nothing in: stop here if asked to (a cancel, a stop command, a
    newer message), as a streamed card's write does. Messages a turn merges join it only at
    the handler's own ``checkpoint()``, where it looks at ``event.turn`` again."""
    ctx = current()
    ctx.ensure_alive()
    ctx.ensure_in_time()
    _stop_if_asked(ctx)


def _stop_if_asked(ctx: JobContext) -> None:
    """Raise what an operator's cancel, a stop command or a newer message asked for."""
    if ctx.cancelled.is_set():
        if ctx.stop_requested:
            raise turns.stop_error(ctx)
        raise Cancelled(f"Job {ctx.event.job_id} was cancelled by an operator.")
    if ctx.interrupt.is_set():
        raise Superseded(f"Job {ctx.event.job_id} was superseded by a newer message.")


class effect:
    """Wrap one external action (HTTP call, email, payment): SPEC §3 Effects.

    Entering persists "an effect is in flight" before the action starts, and raises the
    lease-lost error instead if the job's lease is gone. Leaving normally records it done;
    leaving by an exception records it uncertain, and the job ends ``unknown``.

    ``effect(name, idempotent_for=window)``: the remote side deduplicates by the key it yields
    (``with effect("reply", idempotent_for=timedelta(hours=1)) as key:``), stable for this
    job and name across attempts and workers. Then a failure, crash or lost lease within the
    window (less ``margin``, see ``ledger/idempotency.py``) retries the job, which re-issues the
    effect with the same key; past it the job ends ``unknown``. Every effect yields its key;
    only one declared idempotent is trusted to be repeated.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        idempotent_for: timedelta | None = None,
        margin: timedelta | None = None,
        longest: timedelta | None = None,
        rate_limit: RateLimit | Sequence[RateLimit] = (),
    ) -> None:
        self.rate_limits = [rate_limit] if isinstance(rate_limit, RateLimit) else list(rate_limit)
        if idempotent_for is None and margin is not None:
            raise LedgerError("effect() was refused: a margin needs idempotent_for.")
        if name is not None and (not isinstance(name, str) or not name or len(name) > 64):
            raise LedgerError(f"effect() needs a name of 1 to 64 characters (got {name!r}).")
        self.name = name or ""
        self._span = tracing.NOTHING
        self.idempotent = (
            None
            if idempotent_for is None
            else Idempotent.of(name, idempotent_for, margin, longest=longest)
        )

    def __enter__(self) -> str:
        key = _begin_effect(current(), self)
        self._traced()
        return key

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            _end_effect(current(), exc_type)
        finally:
            self._untraced(exc)

    async def __aenter__(self) -> str:
        key = await asyncio.to_thread(in_db_thread, _begin_effect, current(), self)
        self._traced()
        return key

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await _in_db_thread(_end_effect, current(), exc_type)
        finally:
            self._untraced(exc)

    def _traced(self) -> None:
        """The effect's span, from its recorded start (``tracing.py``)."""
        self._span = tracing.start(
            f"feishu_inbox effect {self.name or '(unnamed)'}",
            attributes={
                "feishu_inbox.effect.name": self.name,
                "feishu_inbox.effect.idempotent": self.idempotent is not None,
            },
        )

    def _untraced(self, error: BaseException | None) -> None:
        span, self._span = self._span, tracing.NOTHING
        span.set("feishu_inbox.outcome", "done" if error is None else "uncertain")
        span.end(error)


def _begin_effect(ctx: JobContext, scope: effect) -> str:
    """Record the effect's start and return its key; refused (LeaseLost) once the lease is
    gone, and refused (Superseded, Cancelled) when a newer private message waits or an
    operator cancelled the job, (IdempotencyWindowPassed) when an idempotent effect would be
    re-issued past the job's window: then nothing started."""
    from ..ledger import rules as ledger

    ctx.ensure_alive()
    ctx.ensure_in_time()
    _stop_if_asked(ctx)  # noticed by this worker (a turn's stop, a newer message): not begun
    if scope.rate_limits:
        acquire(scope.rate_limits)  # a token of each, before anything starts (or Deferred)
        ctx.ensure_in_time()  # the wait may have reached the timeout
    idempotent = scope.idempotent
    if idempotent is not None and idempotent.name in ctx.idempotent_names:
        raise DuplicateEffect(
            f"Job {ctx.event.job_id} already began an idempotent effect named "
            f"{idempotent.name!r} in this attempt; a second would share its key."
        )
    in_flight = ctx.effects_in_flight + 1
    retried = False

    def begin(retrying: bool) -> int:
        nonlocal retried
        retried = retried or retrying
        return ledger.begin_effect(ctx.lease, in_flight=in_flight, idempotent=idempotent)

    try:
        generation = write(ctx, "start an effect of", begin)
    except LeaseLost as lost:
        ctx.mark_lost(str(lost))
        raise
    except (Superseded, Cancelled, IdempotencyWindowPassed) as stop:
        if not isinstance(stop, IdempotencyWindowPassed):
            (ctx.cancelled if isinstance(stop, Cancelled) else ctx.interrupt).set()
        if retried:  # a first try may have landed before its reply was lost: nothing ran
            write(
                ctx,
                "settle an effect that never started in",
                lambda _: ledger.end_effect(ctx.lease, ok=True, in_flight=ctx.effects_in_flight),
            )
        raise
    ctx.effects_in_flight = in_flight
    ctx.effects_started = True
    if ctx.step_depth == 0:
        ctx.unstepped_effect = True
    telemetry.EFFECTS.labels("started").inc()
    if idempotent is not None:
        ctx.idempotent_names.add(idempotent.name)
    event = ctx.event
    return effect_key(
        job_id=event.job_id,
        app=event.app,
        event_id=event.event_id,
        generation=generation,
        name=scope.name,
    )


def _end_effect(ctx: JobContext, exc_type: type[BaseException] | None) -> None:
    """Record the effect's end (tried again through a database blink). If it cannot be
    written, the lease is gone: the job becomes ``unknown`` by lease expiry (an effect
    started). The handler's own exception, if any, is the one that propagates."""
    from ..ledger import rules as ledger

    in_flight = ctx.effects_in_flight - 1
    try:
        write(
            ctx,
            "end an effect of",
            lambda _: ledger.end_effect(ctx.lease, ok=exc_type is None, in_flight=in_flight),
        )
    except LeaseLost as lost:
        ctx.mark_lost(str(lost))
        if exc_type is None:
            raise
    else:
        ctx.effects_in_flight = in_flight
        telemetry.EFFECTS.labels("done" if exc_type is None else "uncertain").inc()


#: The database connections ``in_db_thread`` used on the threads of the worker's event loop's
#: executor (``asyncio.to_thread``), which keep them from call to call and end without
#: closing them: the worker closes them when it stops (``close_executor_connections``).
_executor_connections: set[Any] = set()
_executor_connections_lock = threading.Lock()
_kept = threading.local()


def keep_connections() -> None:
    """Mark this thread as one of the worker loop's executor's (its initializer)."""
    _kept.on = True


def in_db_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` on this (worker) thread's database connection, dropping a stale one
    first: what a ledger call from async code runs in ``asyncio.to_thread``. On another
    executor's thread (the loop ``async_to_sync`` makes for an async django.tasks task, whose
    threads end with it) the connection is closed after the call: else each call would leave
    one open."""
    from django.db import close_old_connections, connections

    close_old_connections()
    try:
        return fn(*args)
    finally:
        if getattr(_kept, "on", False):
            with _executor_connections_lock:
                _executor_connections.update(connections.all(initialized_only=True))
        else:
            connections.close_all()


def close_executor_connections() -> None:
    """Close the connections ``in_db_thread`` left, once no job runs on their threads."""
    with _executor_connections_lock:
        found = list(_executor_connections)
        _executor_connections.clear()
    for wrapper in found:
        wrapper.inc_thread_sharing()  # closed from this thread, not the one that opened it
        try:
            wrapper.close()
        finally:
            wrapper.dec_thread_sharing()


async def _in_db_thread(fn: Callable[..., None], *args: Any) -> None:
    """Run a ledger call from async code, on a thread with its own database connection."""
    await asyncio.to_thread(in_db_thread, fn, *args)


#: ``is_async``'s answers by the handler's id, each with the handler (an id is reused only
#: once its object is gone: the entry's own object is compared). A worker asks once a job.
_async_by_id: dict[int, tuple[Handler, bool]] = {}


def is_async(fn: Handler) -> bool:
    known = _async_by_id.get(id(fn))
    if known is not None and known[0] is fn:
        return known[1]
    answer = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    )
    if len(_async_by_id) >= 1000:  # handlers are few; bound, not evicted one by one
        _async_by_id.clear()
    _async_by_id[id(fn)] = (fn, answer)
    return answer
