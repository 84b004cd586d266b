"""Durable steps (SPEC §7): a retried job never pays for the same step twice.

    @feishu_inbox.handler("im.message.receive_v1")
    def reply(event):
        answer = feishu_inbox.step("think", llm, event.payload)   # paid once per job
        feishu_inbox.checkpoint()
        with feishu_inbox.effect():
            send(answer)

A step's result is written to the ledger (fenced, one statement) when its function returns;
a later attempt of the same job returns it without calling the function. The result must be
JSON data; the handler always gets back what JSON round-trips it to (a tuple comes back as a
list), on the first run as on a retry. A step's name is unique per job.

The same name works with ``async def`` functions: ``await feishu_inbox.step("think",
allm, payload)``, or as a decorator (``@feishu_inbox.step("think")``, or ``@feishu_inbox.step``
to name it after the function); the ledger's reads and writes then run off the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar, overload

from .. import telemetry, tracing
from ..errors import DuplicateStep, LedgerError
from . import context, handlers, writes

log = logging.getLogger("feishu_inbox.handlers")

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

#: Step names are stored in a column of this length.
NAME_LIMIT = 128


class StepResultError(LedgerError):
    """A step returned something that is not JSON data; nothing was recorded."""


@overload
def step(name: F, /) -> F: ...
@overload
def step(name: str, /) -> Callable[[F], F]: ...
@overload
def step(name: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T: ...
def step(name: Any, fn: Any = None, /, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` as the step ``name`` of the running job, or return the
    result an earlier attempt recorded. With an ``async def`` function it returns an awaitable.

    Without ``fn`` it is a decorator: ``@step("name")``, or ``@step`` (the function's name).
    """
    if callable(name) and fn is None and not args and not kwargs:
        return _as_step(name.__name__, name)
    _check_name(name)
    if fn is None:
        return lambda f: _as_step(name, f)
    if not callable(fn):
        raise LedgerError(
            f"step {name!r} needs a function to run, not {type(fn).__name__}.",
            fix="Pass the function and its arguments: step(name, fn, *args, **kwargs).",
        )
    if inspect.iscoroutinefunction(fn):
        return _run_async(name, fn, args, kwargs)
    return _run(name, fn, args, kwargs)


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name or len(name) > NAME_LIMIT:
        raise LedgerError(
            f"A step needs a name of 1 to {NAME_LIMIT} characters (got {name!r:.80}).",
            fix="Name each step of a handler: step('think', fn, ...).",
        )


def _as_step(name: str, fn: F) -> F:
    _check_name(name)
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            return await _run_async(name, fn, args, kwargs)

        return run_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        return _run(name, fn, args, kwargs)

    return run  # type: ignore[return-value]


def _run(name: str, fn: Callable[..., T], args: Any, kwargs: Any) -> T:
    ctx = context.current()
    found, value = memoized(ctx, name)
    if found:
        return value
    started = time.monotonic()
    ctx.step_depth += 1
    try:
        with _span(name):
            value = fn(*args, **kwargs)
    finally:
        ctx.step_depth -= 1
    return record(ctx, name, value, time.monotonic() - started)


async def _run_async(name: str, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    ctx = context.current()
    found, value = await asyncio.to_thread(handlers.in_db_thread, memoized, ctx, name)
    if found:
        return value
    started = time.monotonic()
    ctx.step_depth += 1
    try:
        with _span(name):
            value = await fn(*args, **kwargs)
    finally:
        ctx.step_depth -= 1
    took = time.monotonic() - started
    return await asyncio.to_thread(handlers.in_db_thread, record, ctx, name, value, took)


def _span(name: str) -> Any:
    """A step's span while it runs (a memoized step, which runs nothing, has none)."""
    return tracing.span(f"feishu_inbox step {name}", attributes={"feishu_inbox.step.name": name})


def memoized(ctx: context.JobContext, name: str) -> tuple[bool, Any]:
    """(True, result) when an earlier attempt recorded this step; reads the job's memo once
    per attempt, and only for a job that ever recorded a step."""
    from ..ledger import rules as ledger

    ctx.ensure_alive()
    ctx.ensure_in_time()
    if name in ctx.steps_run:
        raise DuplicateStep(
            f"Step {name!r} ran twice in attempt {ctx.event.attempt} of job {ctx.event.job_id}.",
        )
    ctx.steps_run.add(name)
    if ctx.memo is None:
        ctx.memo = (
            writes.write(ctx, "read the steps of", lambda _: ledger.job_steps(ctx.event.job_id))
            if ctx.has_steps
            else {}
        )
    if name in ctx.memo:
        telemetry.STEPS.labels("memoized").inc()
        return True, ctx.memo[name]
    return False, None


def record(ctx: context.JobContext, name: str, value: Any, took: float) -> Any:
    """Write the step's result (fenced; tried again through a database blink) and return it
    as JSON round-trips it, so the first run sees what a retry will."""
    from ..ledger import rules as ledger

    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StepResultError(
            f"Step {name!r} of job {ctx.event.job_id} returned a {type(value).__name__}, which "
            f"is not JSON data ({exc}); nothing was recorded.",
            fix="Return dicts, lists, strings, numbers, booleans or None from a step "
            "(e.g. dataclasses.asdict(result), or model.model_dump()).",
        ) from exc
    ctx.ensure_alive()
    writes.write(
        ctx,
        f"record step {name!r} of",
        lambda retrying: ledger.record_step(
            ctx.lease, name=name, result=text, took=took, retrying=retrying
        ),
    )
    telemetry.STEPS.labels("recorded").inc()
    decoded = json.loads(text)
    if ctx.memo is not None:
        ctx.memo[name] = decoded
    return decoded


def record_result(ctx: context.JobContext, name: str, value: Any) -> None:
    """A workflow job's return value, memoized as its result (SPEC §9f) once its handler
    returned: what its parent, batch or chain reads. Not JSON data: logged and not recorded
    (the job's work is done; failing it now would only run its effects again). A result an
    earlier attempt recorded stays (that attempt returned; its finish was lost)."""
    from ..errors import DuplicateStep
    from ..ledger import rules as ledger

    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        log.warning(
            "job %s returned a %s, which is not JSON data (%s): no result recorded for its "
            "workflow",
            ctx.event.job_id,
            type(value).__name__,
            exc,
        )
        return
    try:
        writes.write(
            ctx,
            "record the result of",
            lambda retrying: ledger.record_step(
                ctx.lease, name=name, result=text, took=0.0, retrying=retrying
            ),
        )
    except DuplicateStep:
        return
