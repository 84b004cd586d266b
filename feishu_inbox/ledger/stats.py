"""Reading the ledger: the next wake-up, the statistics operators see, and the dashboard's data.

Every figure comes from an indexed query: the dashboard refreshes every few seconds on a ledger
of millions of rows and must never scan it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count
from django.utils import timezone

from ..models import BLOCKING, Attempt, EventJob, Partition, PartitionState, Status
from ..store import EVERY_KEY, KeyFilter, store


def next_wakeup(keys: KeyFilter = EVERY_KEY) -> datetime | None:
    """The earliest time a claim may find work: a due head or a lease to expire (of only the
    partitions ``keys`` takes, if given: some task queues, or all but some)."""
    return store().next_wakeup(keys)


def database_now() -> datetime:
    """The database's clock (PostgreSQL); the local clock on SQLite (same host)."""
    return store().now()


def seconds_until_wakeup(keys: KeyFilter = EVERY_KEY) -> float | None:
    """Seconds until ``next_wakeup()`` by the database's clock (negative: overdue)."""
    wake = next_wakeup(keys)
    if wake is None:
        return None
    return (wake - database_now()).total_seconds()


@dataclass(frozen=True)
class Stats:
    counts: dict[str, int]
    due: int
    delayed: int
    oldest_due_age_seconds: float | None
    blocked_partitions: int
    running_partitions: int
    #: Of ``due``, the jobs that are not their partition's head: they wait behind an earlier
    #: unresolved job (running, failed, unknown, or not yet due). ``due - due_behind_head``
    #: heads are claimable now; ``oldest_due_age_seconds`` is about those.
    due_behind_head: int = 0
    #: True when ``counts["completed"]`` is the planner's estimate (a very large ledger).
    completed_estimated: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "counts": self.counts,
            "completed_estimated": self.completed_estimated,
            "due": self.due,
            "delayed": self.delayed,
            "due_behind_head": self.due_behind_head,
            "oldest_due_age_seconds": self.oldest_due_age_seconds,
            "blocked_partitions": self.blocked_partitions,
            "running_partitions": self.running_partitions,
        }


#: Above this many rows (the database's estimate) the completed count is estimated, not counted.
EXACT_COUNT_LIMIT = 200_000


def stats(*, count_completed: bool = True) -> Stats:
    """Queue statistics (SPEC §3): counts per state, due vs delayed, oldest due age, blocked.

    ``due``: queued/retry-wait jobs whose time has come (some may wait behind their
    partition's head); ``delayed``: retry-wait jobs not yet due; ``oldest_due_age_seconds``:
    how long the oldest claimable head has been due (how far workers lag).
    ``count_completed=False`` reads no completed row at all (the metrics: their count is 0).
    """
    ledger_store = store()
    # Unresolved states are few and counted exactly; completed jobs are counted exactly only
    # while the ledger is small, else estimated (no full scan on every dashboard refresh).
    counts = {s.value: 0 for s in Status}
    counts.update(ledger_store.count_unresolved())
    estimated = False
    if count_completed:
        rows_estimate = ledger_store.estimate_jobs()
        estimated = rows_estimate is not None and rows_estimate > EXACT_COUNT_LIMIT
        if rows_estimate is not None and estimated:
            counts[Status.COMPLETED] = max(0, rows_estimate - sum(counts.values()))
        else:
            counts[Status.COMPLETED] = ledger_store.count_completed()
    due, delayed = ledger_store.due_and_delayed()
    oldest = ledger_store.oldest_due()
    now = ledger_store.now()
    per_state = ledger_store.blocked_and_running_partitions()
    return Stats(
        counts=counts,
        due=due,
        delayed=delayed,
        oldest_due_age_seconds=(
            None if oldest is None else max(0.0, (now - oldest).total_seconds())
        ),
        blocked_partitions=sum(per_state.get(s, 0) for s in BLOCKING),
        running_partitions=per_state.get(Status.RUNNING, 0),
        due_behind_head=max(0, due - _due_heads(now)),  # two reads: clamp a job due between
        completed_estimated=estimated,
    )


def _due_heads(now: datetime) -> int:
    """Partitions whose head is claimable and due (the partial index on ``head_due_at``)."""
    claimable = [PartitionState.QUEUED, PartitionState.RETRY_WAIT]
    return Partition.objects.filter(head_state__in=claimable, head_due_at__lte=now).count()


# --- the admin dashboard's read model ------------------------------------------------------


@dataclass(frozen=True)
class BlockedPartition:
    key: str
    head_id: int
    state: str
    event_type: str
    error_type: str
    #: Unresolved jobs waiting behind the head.
    waiting: int


@dataclass(frozen=True)
class Dashboard:
    stats: Stats
    running: list[EventJob]
    blocked: list[BlockedPartition]
    #: Completed attempts per minute over the last ten minutes, oldest first.
    completions_per_minute: list[int]
    generated_at: datetime


def dashboard(*, shown: int = 20, minutes: int = 10) -> Dashboard:
    """Everything the dashboard shows, from indexed queries only."""
    now = timezone.now()
    running = list(
        EventJob.objects.running()
        .only("id", "event_type", "partition_key", "worker_id", "lease_until")
        .order_by("lease_until")[:shown]
    )
    blocked_rows = list(
        Partition.objects.filter(head_state__in=BLOCKING).order_by("head_id")[:shown]
    )
    heads = EventJob.objects.only("id", "event_type", "error_type", "status").in_bulk(
        [p.head_id for p in blocked_rows]
    )
    waiting = dict(
        EventJob.objects.filter(partition_key__in=[p.key for p in blocked_rows])
        .unresolved()
        .values_list("partition_key")
        .annotate(n=Count("id"))
    )
    blocked = []
    for p in blocked_rows:
        head = heads.get(p.head_id or 0)
        blocked.append(
            BlockedPartition(
                key=p.key,
                head_id=p.head_id or 0,
                state=p.head_state,
                event_type=head.event_type if head else "",
                error_type=head.error_type if head else "",
                waiting=max(waiting.get(p.key, 1) - 1, 0),
            )
        )
    per_minute = [0] * minutes
    for ended in Attempt.objects.filter(
        ended_at__gte=now - timedelta(minutes=minutes), outcome=Status.COMPLETED
    ).values_list("ended_at", flat=True):
        minute = int((now - ended).total_seconds() // 60)
        if 0 <= minute < minutes:
            per_minute[minutes - 1 - minute] += 1
    return Dashboard(
        stats=stats(),
        running=running,
        blocked=blocked,
        completions_per_minute=per_minute,
        generated_at=now,
    )


def unfinished_with_key_prefix(app: str, prefix: str) -> bool:
    """Whether a job of ``app`` whose dedupe key starts with ``prefix`` has not completed (a
    webhook delivery that a replay would only repeat: it will be sent anyway)."""
    return (
        EventJob.objects.filter(app=app, dedupe_key__startswith=prefix)
        .exclude(status=Status.COMPLETED)
        .exists()
    )


@dataclass(frozen=True)
class Vacuum:
    """What vacuum owes the ledger: dead row versions per table, and the age of the oldest
    snapshot that keeps it from removing them (PostgreSQL; empty elsewhere)."""

    #: table -> (dead row versions, live row versions)
    tables: dict[str, tuple[int, int]]
    #: Seconds since the oldest open transaction holding a snapshot on this database began.
    oldest_snapshot_seconds: float
    #: The age, in transaction ids, of the oldest xmin holding vacuum back (sessions, standbys'
    #: feedback, replication slots, prepared transactions).
    oldest_xmin_xids: int


def vacuum() -> Vacuum:
    """The ledger's dead tuples and what holds them (two catalogue reads, no table scan)."""
    found = store()
    tables = {r["table_name"]: (int(r["dead"]), int(r["live"])) for r in found.dead_tuples()}
    oldest = found.oldest_snapshot()
    if oldest is None:
        return Vacuum(tables, 0.0, 0)
    return Vacuum(tables, float(oldest["seconds"] or 0.0), int(oldest["xids"] or 0))


#: The per-tenant gauges read at most this many unresolved jobs (a bound on a scrape's cost:
#: past it each count is "at least").
TENANT_SCAN_LIMIT = 100_000
#: The label of the tenants summed together (beyond the top N), and of jobs of no tenant.
OTHER_TENANTS, NO_TENANT = "other", "none"


@dataclass(frozen=True)
class TenantLoad:
    tenant: str
    #: Queued and retry-wait jobs (due or not), and running ones.
    backlog: int
    running: int


def tenant_load(top: int, scan_limit: int = TENANT_SCAN_LIMIT) -> list[TenantLoad]:
    """The ``top`` tenants with the largest backlog, each with its own row, then the rest
    summed as ``OTHER_TENANTS`` (zero when there is no rest): a label set of at most
    ``top + 1`` values however many tenants there are. Jobs of no tenant count as
    ``NO_TENANT``. Reads at most ``scan_limit`` unresolved jobs."""
    active = (Status.QUEUED, Status.RETRY_WAIT, Status.RUNNING)
    sample = EventJob.objects.filter(status__in=active).order_by().values("pk")[:scan_limit]
    rows = (
        EventJob.objects.filter(pk__in=sample)
        .order_by()
        .values_list("tenant", "status")
        .annotate(n=Count("id"))
    )
    loads: dict[str, list[int]] = {}
    for tenant, status, n in rows:
        load = loads.setdefault(tenant or NO_TENANT, [0, 0])
        load[1 if status == Status.RUNNING else 0] += n
    ranked = sorted(loads.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0]))
    found = [TenantLoad(t, b, r) for t, (b, r) in ranked[:top]]
    rest = ranked[top:]  # always a row, zero when there is no rest: a steady series
    found.append(
        TenantLoad(OTHER_TENANTS, sum(b for _, (b, _) in rest), sum(r for _, (_, r) in rest))
    )
    return found
