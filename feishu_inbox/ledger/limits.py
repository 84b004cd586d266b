"""Rate limits kept by the ledger (SPEC §9c): what a limit is. A leaf (no model): handlers
declare limits at import time. Their token buckets live in ``buckets.py``.

A ``RateLimit`` is a key template, a rate and a burst: ``RateLimit("crm:{app}", 10)`` lets
10 calls a second through for each app, together, whichever worker makes them.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..errors import ConfigurationError

#: The error type a job waiting for a rate limit (or a concurrency slot) records.
WAITING = "RateLimited"


@dataclass(frozen=True)
class RateLimit:
    """At most ``rate`` calls per ``per`` (seconds or a timedelta) for each value of ``key``,
    with bursts of up to ``burst`` (default: ``rate``). ``key`` is a template whose fields come
    from the job (``{app}``, ``{chat_id}``, ``{open_id}``, ``{tenant_key}``, ``{event_type}``)
    or from the caller."""

    key: str
    rate: float
    per: timedelta | float = 1.0
    burst: float | None = None

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConfigurationError(f"RateLimit {self.key!r}: " + "; ".join(problems) + ".")

    def problems(self) -> list[str]:
        found = []
        if not isinstance(self.key, str) or not self.key or len(self.key) > 200:
            found.append("the key must be a template of 1 to 200 characters")
        else:
            try:
                list(string.Formatter().parse(self.key))
            except ValueError as exc:
                found.append(f"the key is not a template ({exc})")
        if not _positive(self.rate):
            found.append(f"the rate must be a positive number (got {self.rate!r})")
        if not _positive(self.seconds):
            found.append(f"per must be a positive duration (got {self.per!r})")
        if self.burst is not None and not (_positive(self.burst) and self.burst >= 1):
            found.append(f"the burst must be at least 1 (got {self.burst!r})")
        return found

    @property
    def seconds(self) -> float:
        return self.per.total_seconds() if isinstance(self.per, timedelta) else float(self.per)

    @property
    def per_second(self) -> float:
        return self.rate / self.seconds

    @property
    def capacity(self) -> float:
        return float(self.burst if self.burst is not None else max(self.rate, 1))

    def fields(self) -> list[str]:
        return [name for _, name, _, _ in string.Formatter().parse(self.key) if name]

    def bucket(self, values: Mapping[str, Any]) -> Bucket:
        """This limit's bucket for ``values``; ConfigurationError naming a missing field."""
        missing = [name for name in self.fields() if values.get(name) in (None, "")]
        if missing:
            raise ConfigurationError(
                f"RateLimit {self.key!r} needs {', '.join(missing)}, which this job does not "
                f"have (it has {', '.join(sorted(k for k, v in values.items() if v)) or 'none'})."
            )
        key = self.key.format_map({k: str(v) for k, v in values.items()})[:255]
        return Bucket(key, self.per_second, self.capacity)


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True)
class Bucket:
    key: str
    per_second: float
    capacity: float
