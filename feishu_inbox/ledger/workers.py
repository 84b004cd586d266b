"""The workers an operator can see (SPEC §9d): each worker process keeps one heartbeat row.

A worker writes its row when it starts, every ``WORKER_BEAT_SECONDS`` while it runs (one
UPDATE, by the database's clock) and when it stops. Whoever reads the rows tells the live
from the lost by the database's clock too: a beat older than three intervals is a lost worker
(killed, its host gone). The rows of lost and stopped workers are deleted after
``WORKER_RETENTION`` by the next worker's beat.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count
from django.db.models.functions import Now

from ..conf import checked_settings
from ..models import EventJob, WorkerBeat

#: A worker whose last beat is older than this many intervals is lost.
LOST_AFTER_BEATS = 3


def started(
    worker_id: str,
    *,
    concurrency: int,
    queues: tuple[str, ...],
    version: str,
    excluded_queues: tuple[str, ...] = (),
) -> None:
    """The worker's row, as it starts (written again if a row of that id was left)."""
    WorkerBeat.objects.update_or_create(
        worker_id=worker_id,
        defaults={
            "host": socket.gethostname()[:255],
            "pid": os.getpid(),
            "version": version[:32],
            "concurrency": concurrency,
            "busy": 0,
            "queues": ",".join(queues)[:255],
            "excluded_queues": ",".join(excluded_queues)[:255],
            "started_at": Now(),
            "last_beat_at": Now(),
            "stopped_at": None,
        },
    )


def beat(worker_id: str, *, busy: int) -> None:
    """A beat: still alive, with ``busy`` slots running a job; and the rows of workers lost
    or stopped longer ago than the retention go."""
    WorkerBeat.objects.filter(worker_id=worker_id).update(last_beat_at=Now(), busy=busy)
    WorkerBeat.objects.filter(last_beat_at__lt=Now() - checked_settings().WORKER_RETENTION).delete()


def stopped(worker_id: str) -> None:
    WorkerBeat.objects.filter(worker_id=worker_id).update(
        last_beat_at=Now(), busy=0, stopped_at=Now()
    )


@dataclass(frozen=True)
class Worker:
    worker_id: str
    host: str
    pid: int
    version: str
    concurrency: int
    busy: int
    queues: str
    excluded_queues: str
    #: What it runs, in words (``WorkerBeat.scope``).
    scope: str
    started_at: datetime
    last_beat_at: datetime
    stopped_at: datetime | None
    #: live, lost or stopped
    state: str
    #: The jobs the ledger has running under its leases now.
    running_jobs: list[int]

    def as_dict(self) -> dict[str, object]:
        return {
            "worker_id": self.worker_id,
            "state": self.state,
            "host": self.host,
            "pid": self.pid,
            "version": self.version,
            "concurrency": self.concurrency,
            "busy": self.busy,
            "queues": self.queues.split(",") if self.queues else [],
            "excluded_queues": self.excluded_queues.split(",") if self.excluded_queues else [],
            "started_at": self.started_at.isoformat(),
            "last_beat_at": self.last_beat_at.isoformat(),
            "stopped_at": self.stopped_at.isoformat() if self.stopped_at else None,
            "running_jobs": self.running_jobs,
        }


def state_of(row: WorkerBeat, now: datetime) -> str:
    if row.stopped_at is not None:
        return "stopped"
    lost_after = timedelta(seconds=LOST_AFTER_BEATS * checked_settings().WORKER_BEAT_SECONDS)
    return "lost" if now - row.last_beat_at > lost_after else "live"


def workers(limit: int = 200) -> list[Worker]:
    """The workers with a row, the most recent beat first, with what each runs (two
    queries: the rows, and the running jobs of those workers)."""
    from .stats import database_now

    now = database_now()
    rows = list(WorkerBeat.objects.order_by("-last_beat_at")[:limit])
    running: dict[str, list[int]] = {}
    for worker_id, job_id in (
        EventJob.objects.running()
        .filter(worker_id__in=[r.worker_id for r in rows])
        .order_by("id")
        .values_list("worker_id", "id")
    ):
        running.setdefault(worker_id, []).append(job_id)
    return [
        Worker(
            worker_id=r.worker_id,
            host=r.host,
            pid=r.pid,
            version=r.version,
            concurrency=r.concurrency,
            busy=r.busy,
            queues=r.queues,
            excluded_queues=r.excluded_queues,
            scope=r.scope,
            started_at=r.started_at,
            last_beat_at=r.last_beat_at,
            stopped_at=r.stopped_at,
            state=state_of(r, now),
            running_jobs=running.get(r.worker_id, []),
        )
        for r in rows
    ]


def live_count() -> int:
    lost_after = timedelta(seconds=LOST_AFTER_BEATS * checked_settings().WORKER_BEAT_SECONDS)
    found = WorkerBeat.objects.filter(
        stopped_at__isnull=True, last_beat_at__gte=Now() - lost_after
    ).aggregate(n=Count("worker_id"))
    return int(found["n"] or 0)
