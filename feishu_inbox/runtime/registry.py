"""The handlers a site registered: which function runs a job, with what retry policy, timeout
and limits, and what a failed attempt records (a job kind's say, ``ledger/kinds.py``, where
the job has no handler of its own).

Handler modules are found by autodiscovery (a ``feishu_handlers`` module in any installed app)
and by ``FEISHU_INBOX["HANDLER_MODULES"]``. A leaf: it imports no model, so ``@handler`` can be
used in any module at import time. Each handler's own retry policy is handed down to the
ledger (``ledger.retry.register_policy``), which gives a job its attempts when it is stored.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from importlib import import_module
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from ..ledger.kinds import kind_of
from ..ledger.limits import RateLimit
from ..ledger.retry import RetryPolicy, own_policy, register_policy, site_policy
from .turns import DEFAULT_NOTICE, Coalesce, StartDeadline

if TYPE_CHECKING:
    from .context import Event

Handler = Callable[["Event"], Any]
_registry: dict[str, list[Handler]] = {}
_problems: list[str] = []
_timeouts: dict[str, float] = {}
_rate_limits: dict[str, list[RateLimit]] = {}
_concurrency: dict[str, list[tuple[str, int]]] = {}
_turns: dict[str, Coalesce] = {}
_deadlines: dict[str, StartDeadline] = {}


def handler(
    event_type: str,
    *,
    retry: RetryPolicy | None = None,
    timeout: timedelta | float | None = None,
    rate_limit: RateLimit | Sequence[RateLimit] = (),
    concurrency: tuple[str, int] | Sequence[tuple[str, int]] = (),
    coalesce: Coalesce | None = None,
    stale_after: timedelta | float | None = None,
    on_stale: str = "skip",
    stale_notice: str = DEFAULT_NOTICE,
) -> Callable[[Handler], Handler]:
    """Register a sync or ``async def`` function for one event type, with its retry policy
    (default: the site's, from settings) and its ``timeout`` (a ``timedelta`` or seconds;
    default: none): an attempt still running then is stopped and retried by its policy;
    its ``rate_limit`` (one ``RateLimit`` or several): a token of each is taken before each
    attempt starts, and a job that finds none waits (``runtime/limits.py``); its
    ``concurrency`` (``("tenant:{tenant_key}", 2)``, or several): at most N of its jobs with
    the same key run at once, across all workers; its ``coalesce`` (a ``Coalesce``): a
    chat's burst of messages runs as one turn (``runtime/turns.py``); ``stale_after`` (a
    ``timedelta`` or seconds): a message first claimed later than this after it was sent is
    skipped, answered with ``stale_notice``, or run anyway (``on_stale``: "skip", "notice",
    "run").
    Every problem with the arguments is collected and reported at once, by ``manage.py
    check`` (E003) and when a worker starts."""
    found = []
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0
    ):
        found.append(
            f"the timeout for {event_type!r} must be a positive timedelta or number of "
            f"seconds, got {timeout!r}"
        )
        seconds = None
    limits = [rate_limit] if isinstance(rate_limit, RateLimit) else list(rate_limit)
    found.extend(
        f"the rate limit of {event_type!r} is not a RateLimit: {limit!r}"
        for limit in limits
        if not isinstance(limit, RateLimit)
    )
    slots: list[Any] = [concurrency] if _is_slot(concurrency) else list(concurrency)
    found.extend(
        f"the concurrency of {event_type!r} must be (a key template, a number >= 1), got {spec!r}"
        for spec in slots
        if not _is_slot(spec)
    )
    if not isinstance(event_type, str) or not event_type or len(event_type) > 128:
        found.append(
            f"@handler needs an event type string of 1 to 128 characters, got {event_type!r}"
        )
    if retry is not None and not isinstance(retry, RetryPolicy):
        found.append(f"the retry policy for {event_type!r} is not a RetryPolicy: {retry!r}")
    elif retry is not None:
        found.extend(f"the retry policy for {event_type!r}: {p}" for p in retry.problems())
    if coalesce is not None and not isinstance(coalesce, Coalesce):
        found.append(f"the coalesce of {event_type!r} is not a Coalesce: {coalesce!r}")
        coalesce = None
    elif coalesce is not None:
        found.extend(coalesce.problems(event_type))
    deadline = None
    if stale_after is None and (on_stale != "skip" or stale_notice != DEFAULT_NOTICE):
        found.append(f"on_stale and stale_notice of {event_type!r} need a stale_after")
    if stale_after is not None:
        if isinstance(stale_after, bool) or not isinstance(stale_after, timedelta | int | float):
            found.append(f"stale_after of {event_type!r} must be a timedelta or seconds")
        else:
            deadline = StartDeadline.of(stale_after, on_stale, stale_notice)
            found.extend(deadline.problems(event_type))
    _problems.extend(found)

    def register(fn: Handler) -> Handler:
        if not callable(fn):
            _problems.append(f"the handler for {event_type!r} is not callable: {fn!r}")
            return fn
        if fn not in _registry.setdefault(event_type, []):
            _registry[event_type].append(fn)
        if retry is not None and not found:
            register_policy(event_type, retry)
        if seconds is not None:
            _timeouts[event_type] = float(seconds)
        if limits:
            _rate_limits[event_type] = limits
        if slots and all(_is_slot(s) for s in slots):
            _concurrency[event_type] = [(str(s[0]), int(s[1])) for s in slots]
        if coalesce is not None and not found:
            _turns[event_type] = coalesce
        if deadline is not None and not found:
            _deadlines[event_type] = deadline
        return fn

    return register


def _is_slot(spec: object) -> bool:
    return (
        isinstance(spec, tuple)
        and len(spec) == 2
        and isinstance(spec[0], str)
        and 0 < len(spec[0]) <= 200
        and isinstance(spec[1], int)
        and not isinstance(spec[1], bool)
        and spec[1] >= 1
    )


def concurrency_for(event_type: str) -> list[tuple[str, int]]:
    """The (key template, N) pairs a job of this event type takes a slot of before it runs."""
    return _concurrency.get(event_type, [])


def turns_for(event_type: str) -> tuple[Coalesce | None, StartDeadline | None]:
    """The handler's turns and start deadline (None, None: neither)."""
    return _turns.get(event_type), _deadlines.get(event_type)


def rate_limits_for(event_type: str) -> list[RateLimit]:
    """The limits a job of this event type takes a token of before it starts."""
    return _rate_limits.get(event_type, [])


def timeout_for(event_type: str) -> float | None:
    """Seconds an attempt of this event type may run (None: no timeout): its handler's, or
    its kind's (a django.tasks task's ``@timeout``)."""
    if event_type in _timeouts:
        return _timeouts[event_type]
    return kind_of(event_type).timeout(event_type)


def registered() -> dict[str, Handler]:
    return {t: fns[0] for t, fns in _registry.items() if fns}


def policy_for(event_type: str) -> RetryPolicy:
    """The retry policy of the handler for ``event_type`` (or of its kind), or the site's."""
    return own_policy(event_type) or kind_of(event_type).policy(event_type) or site_policy()


def handler_for(event_type: str, registered: dict[str, Handler]) -> Handler | None:
    """The function that runs a job of this type: its handler, else its kind's."""
    return registered.get(event_type) or kind_of(event_type).run


def describe_error(event_type: str, error: BaseException) -> tuple[str, str]:
    """(error type, message) a failed attempt records: the class name and text, unless the
    job's kind says otherwise (a task records the class's dotted path and the traceback)."""
    return kind_of(event_type).describe_error(error)


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
