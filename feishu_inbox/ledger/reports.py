"""The long connections' rows (``FeishuConnection``): each gateway (a ``feishu_connect``
process) reports its channels every few seconds; an operator reads them (dashboard, ``inbox
connections``).

A row whose process stopped reporting is *lost*: it is shown as such, and deleted by the next
process to start (or by a process at exit, for its own rows) once older than ``FORGET_AFTER``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

from django.db import transaction
from django.utils import timezone

from ..models import FeishuConnection

#: A process reports this often (seconds); a row not reported for LOST_AFTER is lost.
REPORT_EVERY = 2.0
LOST_AFTER = timedelta(seconds=15)
FORGET_AFTER = timedelta(days=1)


@dataclass(frozen=True)
class Report:
    """One connection as its process sees it now (wall-clock times, seconds since the epoch)."""

    app: str
    state: str
    since: float
    connected_at: float | None
    last_event_at: float | None
    last_pong_at: float | None
    events: int
    error: str


def _at(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, tz=dt_timezone.utc)


def report(host: str, pid: int, connections: Iterable[Report]) -> None:
    """Write this process's connections as they are now, in one transaction."""
    now = timezone.now()
    with transaction.atomic():
        for c in connections:
            FeishuConnection.objects.update_or_create(
                app=c.app,
                host=host,
                pid=pid,
                defaults={
                    "state": c.state,
                    "since": datetime.fromtimestamp(c.since, tz=dt_timezone.utc),
                    "connected_at": _at(c.connected_at),
                    "last_event_at": _at(c.last_event_at),
                    "last_pong_at": _at(c.last_pong_at),
                    "events": c.events,
                    "error": c.error[:2000],
                    "reported_at": now,
                },
            )


def forget(host: str, pid: int) -> None:
    """A process that stops removes its own rows."""
    FeishuConnection.objects.filter(host=host, pid=pid).delete()


def forget_lost(now: datetime | None = None) -> int:
    """Delete rows not reported for FORGET_AFTER; how many."""
    cutoff = (now or timezone.now()) - FORGET_AFTER
    deleted, _ = FeishuConnection.objects.filter(reported_at__lt=cutoff).delete()
    return deleted


@dataclass(frozen=True)
class Seen:
    row: FeishuConnection
    lost: bool

    def as_dict(self) -> dict[str, object]:
        """JSON-ready (the dashboard, ``inbox connections --json``)."""
        r = self.row
        return {
            "app": r.app,
            "process": f"{r.host}:{r.pid}",
            "state": "lost" if self.lost else r.state,
            "since": r.since.isoformat(),
            "last_event_at": r.last_event_at.isoformat() if r.last_event_at else None,
            "last_pong_at": r.last_pong_at.isoformat() if r.last_pong_at else None,
            "events": r.events,
            "error": r.error,
            "reported_at": r.reported_at.isoformat(),
        }


def seen(now: datetime | None = None) -> list[Seen]:
    """Every connection row, with whether its process is lost."""
    now = now or timezone.now()
    return [Seen(row, now - row.reported_at > LOST_AFTER) for row in FeishuConnection.objects.all()]
