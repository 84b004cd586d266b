"""The handler API: registering handlers, the event a handler sees, effects and checkpoints.

    import feishu_inbox

    @feishu_inbox.handler("im.message.receive_v1")
    def reply(event):
        answer = think(event.payload)          # may run again after a crash: no effects here
        feishu_inbox.checkpoint()              # stop here if a newer direct message waits
        with feishu_inbox.effect():            # persisted before the call starts
            send_reply(answer)                 # never repeated automatically after this line
        feishu_inbox.reply(event, answer)      # an idempotent effect: re-sent, same uuid

Handler modules are found by autodiscovery (a ``feishu_handlers`` module in any installed app)
and by ``FEISHU_INBOX["HANDLER_MODULES"]``.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from importlib import import_module
from types import TracebackType
from typing import Any, TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connection

from .errors import (
    Cancelled,
    ConfigurationError,
    DuplicateEffect,
    IdempotencyWindowPassed,
    LeaseLost,
    LedgerError,
    Superseded,
)
from .idempotency import Idempotent, effect_key
from .retry import RetryPolicy, site_policy

log = logging.getLogger("feishu_inbox.handlers")

Handler = Callable[["Event"], Any]
_registry: dict[str, list[Handler]] = {}
_policies: dict[str, RetryPolicy] = {}
_problems: list[str] = []


def handler(event_type: str, *, retry: RetryPolicy | None = None) -> Callable[[Handler], Handler]:
    """Register a sync or ``async def`` function for one event type, with its retry policy
    (default: the site's, from settings). Every problem with the arguments is collected and
    reported at once, by ``manage.py check`` (E003) and when a worker starts."""
    found = []
    if not isinstance(event_type, str) or not event_type or len(event_type) > 128:
        found.append(
            f"@handler needs an event type string of 1 to 128 characters, got {event_type!r}"
        )
    if retry is not None and not isinstance(retry, RetryPolicy):
        found.append(f"the retry policy for {event_type!r} is not a RetryPolicy: {retry!r}")
    elif retry is not None:
        found.extend(f"the retry policy for {event_type!r}: {p}" for p in retry.problems())
    _problems.extend(found)

    def register(fn: Handler) -> Handler:
        if not callable(fn):
            _problems.append(f"the handler for {event_type!r} is not callable: {fn!r}")
            return fn
        if fn not in _registry.setdefault(event_type, []):
            _registry[event_type].append(fn)
        if retry is not None and not found:
            _policies[event_type] = retry
        return fn

    return register


def registered() -> dict[str, Handler]:
    return {t: fns[0] for t, fns in _registry.items() if fns}


def policy_for(event_type: str) -> RetryPolicy:
    """The retry policy of the handler for ``event_type`` (or of its kind), or the site's."""
    kind = kind_of(event_type)
    return _policies.get(event_type) or (kind and kind.policy(event_type)) or site_policy()


@dataclass(frozen=True)
class JobKind:
    """Jobs that are not Feishu events, run by one function for every event type that starts
    with ``prefix`` (``task:``, the django.tasks tasks of ``tasks.py``). ``policy`` gives an
    event type's retry policy (None: the site's); ``describe_error`` what a failed attempt
    records (error type, message) instead of the exception's class name and text."""

    prefix: str
    run: Handler
    policy: Callable[[str], RetryPolicy | None]
    describe_error: Callable[[BaseException], tuple[str, str]]


_kinds: dict[str, JobKind] = {}


def register_kind(kind: JobKind) -> None:
    _kinds[kind.prefix] = kind


def kind_of(event_type: str) -> JobKind | None:
    return next((k for p, k in _kinds.items() if event_type.startswith(p)), None)


def handler_for(event_type: str, registered: dict[str, Handler]) -> Handler | None:
    """The function that runs a job of this type: its handler, else its kind's."""
    kind = kind_of(event_type)
    return registered.get(event_type) or (kind.run if kind else None)


def describe_error(event_type: str, error: BaseException) -> tuple[str, str]:
    """(error type, message) a failed attempt records: the class name and text, unless the
    job's kind says otherwise (a task records the class's dotted path and the traceback)."""
    kind = kind_of(event_type)
    return kind.describe_error(error) if kind else (type(error).__name__, str(error))


def own_attempts(event_type: str) -> int | None:
    """The attempts of the handler's own retry policy (None: it follows the site's)."""
    policy = _policies.get(event_type)
    return policy.attempts if policy else None


def problems() -> list[str]:
    """Every problem with the registered handlers, as sentences."""
    found = list(_problems)
    for event_type, fns in sorted(_registry.items()):
        if len(fns) > 1:
            names = ", ".join(f"{f.__module__}.{f.__qualname__}" for f in fns)
            found.append(f"{len(fns)} handlers for {event_type!r}: {names}")
    return found


def validate() -> None:
    """Raise one ConfigurationError listing every handler problem (at worker start-up)."""
    found = problems()
    if found:
        raise ConfigurationError(
            "Invalid handlers: " + "; ".join(found) + ".",
            fix="Register exactly one callable per event type.",
        )


def load_modules(modules: list[str]) -> None:
    for name in modules:
        try:
            import_module(name)
        except ImportError as exc:
            _problems.append(f"handler module {name!r} cannot be imported: {exc}")
        else:
            _record_loaded(name)


#: The module of each installed app that ``apps.py`` autodiscovers; nothing else is discovered.
#: A ``feishu_handlers.py`` beside ``settings.py`` (the project package, not an app) is
#: imported only when listed in ``FEISHU_INBOX["HANDLER_MODULES"]``.
AUTODISCOVERED_MODULE = "feishu_handlers"
_loaded: list[str] = []  # the listed modules imported by load_modules


def _record_loaded(name: str) -> None:
    if name not in _loaded:
        _loaded.append(name)


def loaded_modules() -> list[str]:
    """The handler modules imported: each installed app's autodiscovered one, then the listed."""
    from django.apps import apps

    found = [f"{config.name}.{AUTODISCOVERED_MODULE}" for config in apps.get_app_configs()]
    return [name for name in found if name in sys.modules and name not in _loaded] + _loaded


# --- what a running handler sees --------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    job_id: int
    event_id: str
    event_type: str
    app: str
    payload: dict[str, Any]
    partition_key: str
    attempt: int
    private_message: bool


@dataclass
class JobContext:
    """The worker's side of one running job; handlers reach it through ``effect``/``checkpoint``."""

    lease: Any  # ledger.Lease (kept untyped here: this module must not import models)
    event: Event
    #: The lease's length, and when (monotonic) the request that last set it was sent: the
    #: worker's own, conservative estimate of how long the lease lasts.
    lease_seconds: float = 60.0
    renewed_at: float = field(default_factory=time.monotonic)
    started: float = field(default_factory=time.monotonic)
    lost: threading.Event = field(default_factory=threading.Event)
    #: A newer private message waits (SPEC §4); an operator cancelled the job.
    interrupt: threading.Event = field(default_factory=threading.Event)
    cancelled: threading.Event = field(default_factory=threading.Event)
    effects_started: bool = False
    #: This attempt's effects in flight (the worker is the only writer of its job's count).
    effects_in_flight: int = 0
    #: Steps (SPEC §7): whether the job recorded any before, their results once read (None:
    #: not yet), and the names this attempt has run.
    has_steps: bool = False
    memo: dict[str, Any] | None = None
    steps_run: set[str] = field(default_factory=set)
    #: The idempotent effects this attempt began (one key per name).
    idempotent_names: set[str] = field(default_factory=set)
    on_lost: Callable[[JobContext], None] | None = None

    def lease_left(self) -> float:
        """Seconds the lease lasts by this worker's clock (it may be less by the database's)."""
        return self.renewed_at + self.lease_seconds - time.monotonic()

    def mark_lost(self, why: str) -> None:
        if not self.lost.is_set():
            self.lost.set()
            log.error("job %s lost its lease: %s", self.event.job_id, why)
            if self.on_lost:
                self.on_lost(self)

    def ensure_alive(self) -> None:
        if self.lost.is_set():
            raise LeaseLost(f"Job {self.event.job_id} lost its lease; stop working on it.")


T = TypeVar("T")

#: Database errors of the connection, not of the statement: the server was away (restarted,
#: failed over, the SQLite file locked past its busy timeout). A write may be tried again.
TRANSIENT_ERRORS = (OperationalError, InterfaceError)
#: The first wait before trying a write again, doubled up to the longest.
RETRY_FIRST_DELAY = 0.05
RETRY_LONGEST_DELAY = 1.0
#: A write is not tried again when the lease has less than this left by the worker's clock.
LEASE_MARGIN = 1.0


def write(ctx: JobContext, doing: str, op: Callable[[bool], T]) -> T:
    """Run a ledger write of this job; when the database blinks, reconnect and try again,
    while the lease lasts (SPEC §6).

    ``op(retrying)`` is called with ``retrying=True`` after the first try, whose reply may have
    been lost after it landed: every ledger write is fenced by the lease token and written so
    that a retry can never apply twice or after a takeover. Raises ``LeaseLost`` (and marks the
    job lost) when the lease runs out before the database is back.
    """
    delay, retrying = RETRY_FIRST_DELAY, False
    while True:
        try:
            return op(retrying)
        except TRANSIENT_ERRORS as exc:
            drop_connection()
            left = ctx.lease_left() - LEASE_MARGIN
            if left <= 0:
                why = f"the ledger was unreachable until its lease ran out ({exc})"
                ctx.mark_lost(why)
                raise LeaseLost(f"Cannot {doing} job {ctx.event.job_id}: {why}.") from exc
            log.warning(
                "job %s: could not %s (%s); trying again while its lease lasts (%.0fs)",
                ctx.event.job_id,
                doing,
                str(exc).strip() or type(exc).__name__,
                left,
            )
            time.sleep(min(delay, left))  # a backoff between tries, not a synchronisation
            delay, retrying = min(delay * 2, RETRY_LONGEST_DELAY), True


def drop_connection() -> None:
    """Close this thread's broken connection; the next query opens a new one."""
    try:
        connection.close()
    except DatabaseError:  # closing a dead connection can fail too; it is gone either way
        log.debug("closing a broken connection failed", exc_info=True)


_current: contextvars.ContextVar[JobContext] = contextvars.ContextVar("feishu_inbox_job")


def current() -> JobContext:
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError(
            "effect() and checkpoint() work only inside a handler run by the worker."
        ) from None


def checkpoint() -> None:
    """Stop here if an operator cancelled this job (raise ``Cancelled``) or a newer private
    message waits in its chat (raise ``Superseded``).

    Call it between completed operations, never inside an effect. The worker looks for both at
    least twice a second; between those looks a checkpoint costs nothing.
    """
    ctx = current()
    ctx.ensure_alive()
    if ctx.cancelled.is_set():
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
    window (less ``margin``, see ``idempotency.py``) retries the job, which re-issues the
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
    ) -> None:
        if idempotent_for is None and margin is not None:
            raise LedgerError("effect() was refused: a margin needs idempotent_for.")
        if name is not None and (not isinstance(name, str) or not name or len(name) > 64):
            raise LedgerError(f"effect() needs a name of 1 to 64 characters (got {name!r}).")
        self.name = name or ""
        self.idempotent = (
            None
            if idempotent_for is None
            else Idempotent.of(name, idempotent_for, margin, longest=longest)
        )

    def __enter__(self) -> str:
        return _begin_effect(current(), self)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _end_effect(current(), exc_type)

    async def __aenter__(self) -> str:
        return await asyncio.to_thread(in_db_thread, _begin_effect, current(), self)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await _in_db_thread(_end_effect, current(), exc_type)


def _begin_effect(ctx: JobContext, scope: effect) -> str:
    """Record the effect's start and return its key; refused (LeaseLost) once the lease is
    gone, and refused (Superseded, Cancelled) when a newer private message waits or an
    operator cancelled the job, (IdempotencyWindowPassed) when an idempotent effect would be
    re-issued past the job's window: then nothing started."""
    from . import ledger

    ctx.ensure_alive()
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
    from . import ledger

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


def in_db_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` on this (worker) thread's database connection, dropping a stale one
    first: what a ledger call from async code runs in ``asyncio.to_thread``."""
    from django.db import close_old_connections

    close_old_connections()
    return fn(*args)


async def _in_db_thread(fn: Callable[..., None], *args: Any) -> None:
    """Run a ledger call from async code, on a thread with its own database connection."""
    await asyncio.to_thread(in_db_thread, fn, *args)


def is_async(fn: Handler) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    )
