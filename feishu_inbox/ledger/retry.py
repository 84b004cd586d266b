"""Retry policies (SPEC §3): how many attempts a job gets, and how long it waits between them.

A handler declares its own (``@handler("…", retry=RetryPolicy(attempts=8, backoff="linear"))``);
the site's settings (``MAX_ATTEMPTS``, ``BACKOFF_*``) are the default. A handler may also name
the time of its next attempt for one failure: ``raise RetryAt(when)`` / ``RetryAfter(seconds)``
(a rate limit's ``Retry-After``); the attempts still bound it.

A job's attempts are fixed when it is stored (its ``max_attempts``), so lease expiry, which any
claimer does without the handler at hand, applies the same bound.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from ..conf import InboxSettings, checked_settings

Backoff = Literal["exponential", "linear", "fixed"]
BACKOFFS: tuple[Backoff, ...] = ("exponential", "linear", "fixed")


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` in all; retry *n* waits ``delay`` · 2ⁿ⁻¹ (exponential), · n (linear) or
    just ``delay`` (fixed), at most ``max_delay`` seconds, less up to ``jitter`` of it at random
    (True: the site's ``BACKOFF_JITTER``; False: none; a fraction)."""

    attempts: int = 5
    backoff: Backoff = "exponential"
    delay: float = 5.0
    max_delay: float = 3600.0
    jitter: bool | float = True

    def problems(self) -> list[str]:
        """Every problem with these values, as sentences (empty when valid)."""
        found = []
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool):
            found.append(f"attempts must be a whole number (got {self.attempts!r})")
        elif self.attempts < 1:
            found.append(f"attempts must be at least 1 (got {self.attempts})")
        if self.backoff not in BACKOFFS:
            found.append(f"backoff must be one of {', '.join(BACKOFFS)} (got {self.backoff!r})")
        if not _number(self.delay) or self.delay <= 0:
            found.append(f"delay must be a number of seconds > 0 (got {self.delay!r})")
        if not _number(self.max_delay) or (_number(self.delay) and self.max_delay < self.delay):
            found.append(f"max_delay must be a number >= delay (got {self.max_delay!r})")
        jitter = self.jitter
        if not isinstance(jitter, bool) and not (_number(jitter) and 0 <= jitter <= 1):
            found.append(f"jitter must be True, False or a fraction within 0..1 (got {jitter!r})")
        return found

    def delay_before(self, attempt: int, conf: InboxSettings | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        n = max(attempt, 1)
        if self.backoff == "exponential":
            ceiling = self.delay * 2 ** min(n - 1, 64)
        elif self.backoff == "linear":
            ceiling = self.delay * n
        else:
            ceiling = self.delay
        ceiling = min(self.max_delay, ceiling)
        jitter = self.jitter
        if jitter is True:
            jitter = (conf or checked_settings()).BACKOFF_JITTER
        return ceiling * (1 - float(jitter) * random.random())

    def describe(self) -> str:
        if isinstance(self.jitter, bool):
            jitter = "jitter" if self.jitter else "no jitter"
        else:
            jitter = f"jitter {self.jitter:g}"
        return (
            f"{self.attempts} attempts, {self.backoff} backoff from {self.delay:g} s "
            f"up to {self.max_delay:g} s, {jitter}"
        )


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def site_policy(conf: InboxSettings | None = None) -> RetryPolicy:
    """The site's default policy, from settings."""
    conf = conf or checked_settings()
    return RetryPolicy(
        attempts=conf.MAX_ATTEMPTS,
        backoff="exponential",
        delay=conf.BACKOFF_BASE,
        max_delay=conf.BACKOFF_CAP,
        jitter=conf.BACKOFF_JITTER,
    )


class RetryAt(Exception):
    """Raised by a handler: retry this job at ``when`` (a datetime, or seconds/timedelta from
    now), not after the policy's backoff. The policy's attempts still bound it."""

    def __init__(self, when: datetime | timedelta | float, message: str = "") -> None:
        if isinstance(when, bool) or not isinstance(when, datetime | timedelta | int | float):
            raise TypeError(
                f"RetryAt needs a datetime, a timedelta or seconds (got {type(when).__name__})"
            )
        self.when = when
        super().__init__(message or f"retry requested at {when}")

    @property
    def needs_clock(self) -> bool:
        """A point in time: the seconds to it are counted by the database's clock."""
        return isinstance(self.when, datetime)

    @property
    def seconds(self) -> float:
        """The requested delay (for a datetime: from the host's clock; see ``seconds_from``)."""
        if isinstance(self.when, datetime):
            return self.seconds_from(datetime.now(self.when.tzinfo))
        if isinstance(self.when, timedelta):
            return max(0.0, self.when.total_seconds())
        return max(0.0, float(self.when))

    def seconds_from(self, now: datetime) -> float:
        """How long from ``now`` (the database's clock) until the requested time (>= 0)."""
        if isinstance(self.when, datetime):
            return max(0.0, (self.when - now).total_seconds())
        return self.seconds


class RetryAfter(RetryAt):
    """``RetryAt`` for a number of seconds (an HTTP ``Retry-After``)."""

    def __init__(self, seconds: float | timedelta, message: str = "") -> None:
        super().__init__(seconds, message or f"retry requested after {seconds} s")


def backoff_seconds(attempt: int, conf: InboxSettings | None = None) -> float:
    """The site policy's delay after failed attempt number ``attempt`` (1-based)."""
    return site_policy(conf).delay_before(attempt, conf)


# --- each event type's own policy -------------------------------------------------------------

#: The retry policy each event type's handler declared (``runtime.registry`` hands them down):
#: a job stored for such a type gets that policy's attempts (``ledger.enqueue``).
_policies: dict[str, RetryPolicy] = {}


def register_policy(event_type: str, policy: RetryPolicy) -> None:
    _policies[event_type] = policy


def own_policy(event_type: str) -> RetryPolicy | None:
    """The retry policy the handler of ``event_type`` declared (None: it follows the site's)."""
    return _policies.get(event_type)


def own_attempts(event_type: str) -> int | None:
    """The attempts of the handler's own retry policy (None: it follows the site's)."""
    policy = _policies.get(event_type)
    return policy.attempts if policy else None
