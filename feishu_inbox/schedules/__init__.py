"""Schedules (SPEC §8): declaring them, checking them, and the cron arithmetic of a tick.

    import feishu_inbox

    @feishu_inbox.schedule("0 9 * * 1-5", tz="Asia/Shanghai", catch_up="skip")
    def digest(event):                      # runs like a handler: leases, effects, checkpoints
        send_digest(event.payload["occurrence"])

or, for a callable named by its dotted path, in settings::

    FEISHU_INBOX["SCHEDULES"] = {
        "digest": {"cron": "0 9 * * 1-5", "tz": "Asia/Shanghai", "handler": "bot.jobs.digest"},
    }

Each schedule's function is registered as the handler of event type ``schedule.<name>``; each
occurrence becomes one job of that type (``scheduler`` enqueues it). Cron expressions are
evaluated by cronsim (5 fields, or 6 with seconds first) in the schedule's time zone, with
Debian cron's rules at DST transitions.

This module only declares and computes: it imports no model, so ``feishu_inbox.schedule`` can
be used in any module at import time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from ..errors import ConfigurationError, ScheduleConfigurationError
from ..ledger.kinds import SCHEDULE_PREFIX
from ..ledger.retry import RetryPolicy
from ..runtime import registry

SKIP = "skip"
RUN_ONCE = "run-once"
RUN_ALL = "run-all"
#: What a tick does when more than one occurrence is due (the workers were down, or the
#: schedule was paused): see ``plan``.
CATCH_UP_POLICIES = (SKIP, RUN_ONCE, RUN_ALL)
#: The prefix of a schedule's event type: ``schedule.<name>``.
EVENT_TYPE_PREFIX = SCHEDULE_PREFIX
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: The keys of a settings-declared schedule.
SETTINGS_KEYS = ("cron", "handler", "tz", "catch_up", "max_catch_up", "partition", "tenant")

F = TypeVar("F", bound=Callable[..., Any])


class Cron:
    """A cron expression in a time zone: the occurrences, as UTC instants.

    ``evaluations`` counts the lookups (``after``): catch-up after a gap costs O(log gap) of
    them, never one per missed occurrence.
    """

    def __init__(self, expression: str, zone: ZoneInfo) -> None:
        self.expression = expression
        self.zone = zone
        self.evaluations = 0
        CronSim(expression, datetime.now(zone))  # CronSimError when malformed

    def after(self, moment: datetime) -> datetime | None:
        """The first occurrence strictly after ``moment`` (UTC), or None in the next 50 years.

        cronsim follows Debian cron at DST transitions: a job due in the skipped hour runs at
        its end; one at a fixed time in the repeated hour runs once, in its first pass. Such a
        job's iteration runs in wall-clock time, so from the second pass of a repeated hour it
        offers the first pass's time again: ``strictly after`` is enforced here, in UTC.
        """
        self.evaluations += 1
        for found in CronSim(self.expression, moment.astimezone(self.zone)):
            instant = found.astimezone(timezone.utc)
            if instant > moment:
                return instant
        return None

    def local(self, instant: datetime) -> datetime:
        return instant.astimezone(self.zone)

    def describe(self) -> str:
        """The expression in words ("At 09:00 on Monday through Friday")."""
        try:
            return CronSim(self.expression, datetime.now(self.zone)).explain()
        except Exception:  # explain() is prose for operators; never let it break a page
            return self.expression


@dataclass(frozen=True)
class ScheduleSpec:
    """One declared schedule, checked."""

    name: str
    cron: Cron
    tz: str
    catch_up: str
    max_catch_up: int
    partition: str
    target: Callable[..., Any]
    #: Where it was declared (``module.function``, or the settings).
    origin: str
    #: Whose its occurrences are (SPEC §9j); "" (the default): no tenant's, site-wide work.
    tenant: str = ""

    @property
    def event_type(self) -> str:
        return f"{EVENT_TYPE_PREFIX}{self.name}"

    @property
    def expression(self) -> str:
        return self.cron.expression


# --- the catch-up rules ---------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What one tick of one schedule does: enqueue ``occurrences`` (in order) and move the
    watermark to ``watermark``, in one transaction."""

    occurrences: list[datetime]
    watermark: datetime
    #: The first occurrence after the new watermark (None: none in the next 50 years). When
    #: it is not in the future, the next tick is due at once (``run-all`` catching up).
    next_at: datetime | None
    #: How the occurrences came due: ``schedule`` (on time), or ``catch-up`` after a gap.
    trigger: Literal["schedule", "catch-up"] = "schedule"
    #: For a catch-up: the latest missed occurrence (the gap is ``(old watermark, this]``).
    missed_until: datetime | None = None


def plan(spec: ScheduleSpec, watermark: datetime, now: datetime) -> Plan:
    """The occurrences due at ``now`` after ``watermark``, as the catch-up policy decides.

    One due occurrence is the usual tick (the worker woke for it). More than one means the
    workers were down or the schedule paused; then:

    - ``skip``: only the latest missed occurrence, found by bisection over the gap;
    - ``run-once``: one job, the first missed occurrence, standing for all of them (its
      payload names the latest, ``missed_until``); the cadence resumes after the latest;
    - ``run-all``: each missed occurrence in order, at most ``max_catch_up`` per tick; the
      next tick is then due at once and takes the next ones.
    """
    cron = spec.cron
    first = cron.after(watermark)
    if first is None or first > now:
        return Plan([], watermark, first)
    second = cron.after(first)
    if second is None or second > now:
        return Plan([first], first, second)
    if spec.catch_up == RUN_ALL:
        due = [first, second]
        following = cron.after(second)
        while following is not None and following <= now and len(due) < spec.max_catch_up:
            due.append(following)
            following = cron.after(following)
        due = due[: spec.max_catch_up]
        next_at = following if len(due) > 1 else second
        return Plan(due, due[-1], next_at, "catch-up", due[-1])
    latest = latest_due(cron, first, second, now)
    after = cron.after(latest)
    if spec.catch_up == RUN_ONCE:
        return Plan([first], latest, after, "catch-up", latest)
    return Plan([latest], latest, after, "catch-up", latest)


def latest_due(cron: Cron, low: datetime, after_low: datetime, now: datetime) -> datetime:
    """The latest occurrence at or before ``now``, by bisection: O(log₂ of the gap in
    seconds) lookups, however many occurrences the gap holds.

    ``after_low`` is ``cron.after(low)`` and is at or before ``now``. The invariant is
    ``after(low) <= now < after(high)``; occurrences fall on whole seconds, so once ``high``
    is within a second of ``low``, ``after(low)`` is the latest one.
    """
    high = now
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        found = cron.after(middle)
        if found is not None and found <= now:
            low, after_low = middle, found
        else:
            high = middle
    return after_low


def bisection_bound(gap: timedelta) -> int:
    """The most lookups ``plan`` makes for a ``skip`` or ``run-once`` catch-up over ``gap``:
    the first two occurrences, the bisection, and the occurrence after the latest."""
    return 3 + math.ceil(math.log2(max(gap.total_seconds(), 2)))


# --- declaring -------------------------------------------------------------------------------

_declared: dict[str, list[ScheduleSpec]] = {}
_problems: list[str] = []


def schedule(
    cron: str,
    *,
    tz: str | None = None,
    catch_up: str = SKIP,
    max_catch_up: int = 10,
    partition: str | None = None,
    name: str | None = None,
    retry: RetryPolicy | None = None,
    timeout: timedelta | float | None = None,
    tenant: str = "",
) -> Callable[[F], F]:
    """Run the decorated function at each occurrence of ``cron`` in time zone ``tz``.

    The function runs like a handler (it receives the ``Event``, may use ``effect()`` and
    ``checkpoint()``); the event's payload names the schedule and the occurrence. ``name``
    defaults to the function's name; ``tz`` to ``settings.TIME_ZONE``; ``partition`` (the
    occurrences of one partition run one at a time, in order) to ``schedule:<name>``;
    ``retry`` (a ``RetryPolicy``) to the site's policy, and ``timeout`` to none, as for
    ``@handler``; ``tenant`` (whose occurrences are, SPEC §9j) to "" (none: site-wide work).
    """

    def register(fn: F) -> F:
        origin = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)!s}"
        declare(
            name or str(getattr(fn, "__name__", "")),
            cron,
            fn,
            tz=tz,
            catch_up=catch_up,
            max_catch_up=max_catch_up,
            partition=partition,
            origin=origin,
            retry=retry,
            timeout=timeout,
            tenant=tenant,
        )
        return fn

    return register


def declare(
    name: str,
    cron: str,
    target: Callable[..., Any],
    *,
    tz: str | None = None,
    catch_up: str = SKIP,
    max_catch_up: int = 10,
    partition: str | None = None,
    origin: str = "",
    retry: RetryPolicy | None = None,
    timeout: timedelta | float | None = None,
    tenant: str = "",
) -> ScheduleSpec | None:
    """Check one declaration; register it (and its handler) or record every problem with it."""
    spec, problems = check(
        name,
        cron,
        target,
        tz=tz,
        catch_up=catch_up,
        max_catch_up=max_catch_up,
        partition=partition,
        origin=origin,
        tenant=tenant,
    )
    _problems.extend(problems)
    if spec is None:
        return None
    if not _declared.get(spec.name):  # a second one is reported by problems(), not run
        registry.handler(spec.event_type, retry=retry, timeout=timeout)(target)
    _declared.setdefault(spec.name, []).append(spec)
    return spec


def check(
    name: str,
    cron: str,
    target: Callable[..., Any],
    *,
    tz: str | None = None,
    catch_up: str = SKIP,
    max_catch_up: int = 10,
    partition: str | None = None,
    origin: str = "",
    tenant: str = "",
) -> tuple[ScheduleSpec | None, list[str]]:
    """A checked schedule, or None and every problem with the declaration (as sentences)."""
    label = f"schedule {name!r}" + (f" ({origin})" if origin else "")
    problems = []
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        problems.append(
            f"{label}: the name must be 1 to 64 letters, digits, '_', '.' or '-' "
            "(it is part of the event type and the dedupe key)"
        )
    zone = None
    tz_name = tz if tz is not None else _default_tz()
    try:
        zone = ZoneInfo(tz_name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        problems.append(f"{label}: unknown time zone {tz_name!r} (an IANA name: 'Asia/Shanghai')")
    parsed = None
    if not isinstance(cron, str):
        problems.append(f"{label}: the cron expression must be a string (got {cron!r})")
    else:
        try:
            parsed = Cron(cron, zone or ZoneInfo("UTC"))
        except CronSimError as exc:
            problems.append(f"{label}: bad cron expression {cron!r} ({exc})")
        else:
            if parsed.after(datetime.now(timezone.utc)) is None:
                problems.append(f"{label}: cron expression {cron!r} never fires")
            parsed.evaluations = 0
    if catch_up not in CATCH_UP_POLICIES:
        problems.append(
            f"{label}: unknown catch_up policy {catch_up!r} (one of {', '.join(CATCH_UP_POLICIES)})"
        )
    if isinstance(max_catch_up, bool) or not isinstance(max_catch_up, int) or max_catch_up < 1:
        problems.append(f"{label}: max_catch_up must be an integer >= 1 (got {max_catch_up!r})")
    key = partition if partition is not None else f"schedule:{name}"
    if not isinstance(key, str) or not key or len(key) > 255:
        problems.append(f"{label}: partition must be a string of 1 to 255 characters")
    if not isinstance(tenant, str) or len(tenant) > 64:
        problems.append(f"{label}: tenant must be a string of at most 64 characters")
    if not callable(target):
        problems.append(f"{label}: what it runs is not callable: {target!r}")
    if problems or parsed is None or zone is None:
        return None, problems
    spec = ScheduleSpec(
        name=name,
        cron=parsed,
        tz=tz_name,
        catch_up=catch_up,
        max_catch_up=max_catch_up,
        partition=key,
        target=target,
        origin=origin,
        tenant=tenant,
    )
    return spec, []


def _default_tz() -> str:
    from django.conf import settings

    return str(getattr(settings, "TIME_ZONE", None) or "UTC")


def load_settings() -> None:
    """Declare the schedules of ``FEISHU_INBOX["SCHEDULES"]`` (``apps.ready`` calls this).

    Each is ``name -> {"cron", "handler": "dotted.path", "tz", "catch_up", "max_catch_up",
    "partition"}``; the path names a function (it receives the ``Event``) or a ``django.tasks``
    task (run with no arguments). A handler that cannot be imported is a problem like any other.
    """
    from django.utils.module_loading import import_string

    from ..conf import raw_settings

    try:
        declared = raw_settings().get("SCHEDULES", {})
    except ConfigurationError:
        return  # FEISHU_INBOX itself is invalid: check_settings reports it
    where = 'FEISHU_INBOX["SCHEDULES"]'
    if not isinstance(declared, dict):
        _problems.append(f"{where} must be a dict of schedule name -> {{'cron': ..., ...}}")
        return
    for name, entry in declared.items():
        here = f"{where}[{name!r}]"
        if not isinstance(entry, dict):
            _problems.append(f"{here} must be a dict with 'cron' and 'handler'")
            continue
        unknown = sorted(set(entry) - set(SETTINGS_KEYS))
        missing = [k for k in ("cron", "handler") if k not in entry]
        if unknown or missing:
            _problems.append(
                f"{here}: "
                + "; ".join(
                    ([f"unknown keys {unknown}"] if unknown else [])
                    + ([f"missing {missing}"] if missing else [])
                )
                + f" (its keys: {', '.join(SETTINGS_KEYS)})"
            )
            continue
        try:
            target = import_string(entry["handler"])
        except (ImportError, TypeError, ValueError) as exc:
            _problems.append(f"{here}: handler {entry['handler']!r} cannot be imported ({exc})")
            continue
        target, retry, problem = _task_target(target)
        if problem:
            _problems.append(f"{here}: {problem}")
            continue
        declare(
            name,
            entry["cron"],
            target,
            tz=entry.get("tz"),
            catch_up=entry.get("catch_up", SKIP),
            max_catch_up=entry.get("max_catch_up", 10),
            partition=entry.get("partition"),
            tenant=entry.get("tenant", ""),
            origin=f"{where} -> {entry['handler']}",
            retry=retry,
        )


def _task_target(target: Any) -> tuple[Any, RetryPolicy | None, str]:
    """A ``django.tasks`` task named by the settings runs, at each occurrence, as the schedule's
    job (its leases, effects, steps; the task's own ``@retry`` policy), with no arguments:
    ``(what runs, its retry policy, the problem)``; anything else is returned as it is."""
    try:
        from ..tasks.framework import framework

        task_class = framework().Task
    except (ImportError, ConfigurationError):  # no tasks framework installed: not a task
        return target, None, ""
    if not isinstance(target, task_class):
        return target, None, ""
    if target.takes_context:
        return target, None, "a scheduled task cannot take a context (takes_context=True)"
    from ..tasks import retry_policy_of

    def run(event: Any) -> Any:
        return target.call()

    run.__module__ = target.func.__module__
    run.__name__ = run.__qualname__ = target.func.__name__
    return run, retry_policy_of(target), ""


def declared() -> dict[str, ScheduleSpec]:
    """The declared schedules by name (the first of a duplicated name; see ``problems``)."""
    return {name: specs[0] for name, specs in sorted(_declared.items()) if specs}


def problems() -> list[str]:
    """Every problem with the declared schedules, as sentences."""
    found = list(_problems)
    for name, specs in sorted(_declared.items()):
        if len(specs) > 1:
            origins = ", ".join(s.origin or "?" for s in specs)
            found.append(f"schedule name {name!r} is declared {len(specs)} times: {origins}")
    return found


def validate() -> None:
    """Raise one ConfigurationError listing every schedule problem (at worker start-up)."""
    found = problems()
    if found:
        raise ScheduleConfigurationError("Invalid schedules: " + "; ".join(found) + ".")
