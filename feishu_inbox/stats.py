"""Reading the ledger: the next wake-up, and the statistics operators and the dashboard see."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .models import BLOCKING, Status
from .sql import (
    CLAIMABLE_SQL,
    COMPLETED,
    RUNNING,
    J,
    P,
    aware,
    dialect,
    fetchall,
    in_list,
)


def next_wakeup() -> datetime | None:
    """The earliest time a claim may find work: a due head or a lease to expire."""
    rows = fetchall(
        f"""
        SELECT MIN(t) FROM (
            SELECT MIN(head_due_at) AS t FROM {P} WHERE head_state IN {CLAIMABLE_SQL}
            UNION ALL
            SELECT MIN(lease_until) AS t FROM {J} WHERE status = '{RUNNING}'
        ) AS w
        """
    )
    return aware(rows[0][0])


def seconds_until_wakeup() -> float | None:
    """Seconds until ``next_wakeup()`` by the database's clock (negative: overdue)."""
    wake = next_wakeup()
    if wake is None:
        return None
    return (wake - database_now()).total_seconds()


def database_now() -> datetime:
    """The database's clock (PostgreSQL); the local clock on SQLite (same host)."""
    d = dialect()
    if not d.pg:
        return datetime.now(timezone.utc)
    return fetchall("SELECT now()")[0][0]


@dataclass(frozen=True)
class Stats:
    counts: dict[str, int]
    due: int
    delayed: int
    oldest_due_age_seconds: float | None
    blocked_partitions: int
    running_partitions: int
    #: True when ``counts["completed"]`` is the planner's estimate (a very large ledger).
    completed_estimated: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "counts": self.counts,
            "completed_estimated": self.completed_estimated,
            "due": self.due,
            "delayed": self.delayed,
            "oldest_due_age_seconds": self.oldest_due_age_seconds,
            "blocked_partitions": self.blocked_partitions,
            "running_partitions": self.running_partitions,
        }


#: Above this many rows (PostgreSQL's estimate) the completed count is estimated, not counted.
EXACT_COUNT_LIMIT = 200_000


def stats() -> Stats:
    """Queue statistics (SPEC §3): counts per state, due vs delayed, oldest due age, blocked.

    ``due``: queued/retry-wait jobs whose time has come (some may wait behind their
    partition's head); ``delayed``: retry-wait jobs not yet due; ``oldest_due_age_seconds``:
    how long the oldest claimable head has been due (how far workers lag).
    """
    d = dialect()
    counts = {s.value: 0 for s in Status}
    # Unresolved states are few and counted exactly through the status index; completed jobs
    # are counted exactly only while the ledger is small, else estimated (no full scan on
    # every dashboard refresh).
    unresolved = [s.value for s in Status if s != Status.COMPLETED]
    for status, n in fetchall(
        f"SELECT status, COUNT(*) FROM {J} WHERE status IN {in_list(unresolved)} GROUP BY status",
        unresolved,
    ):
        counts[status] = n
    estimated = False
    rows_estimate = -1
    if d.pg:
        rows_estimate = int(
            fetchall("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [J])[0][0]
        )
    if rows_estimate > EXACT_COUNT_LIMIT:
        counts[COMPLETED] = max(0, rows_estimate - sum(counts.values()))
        estimated = True
    else:
        counts[COMPLETED] = fetchall(f"SELECT COUNT(*) FROM {J} WHERE status = %s", [COMPLETED])[0][
            0
        ]
    due, delayed = fetchall(
        f"""
        SELECT COALESCE(SUM(CASE WHEN available_at <= {d.now} THEN 1 ELSE 0 END), 0),
               COALESCE(SUM(CASE WHEN available_at > {d.now} THEN 1 ELSE 0 END), 0)
        FROM {J} WHERE status IN {CLAIMABLE_SQL}
        """
    )[0]
    now = database_now()
    oldest = fetchall(
        f"SELECT MIN(head_due_at) FROM {P} WHERE head_state IN {CLAIMABLE_SQL} "
        f"AND head_due_at <= {d.now}"
    )[0][0]
    oldest = aware(oldest)
    blocked_states = tuple(s.value for s in BLOCKING)
    per_state = dict(
        fetchall(
            f"SELECT head_state, COUNT(*) FROM {P} WHERE head_state IN {in_list(blocked_states)} "
            f"OR head_state = %s GROUP BY head_state",
            [*blocked_states, RUNNING],
        )
    )
    return Stats(
        counts=counts,
        due=int(due),
        delayed=int(delayed),
        oldest_due_age_seconds=(
            None if oldest is None else max(0.0, (now - oldest).total_seconds())
        ),
        blocked_partitions=sum(per_state.get(s, 0) for s in blocked_states),
        running_partitions=per_state.get(RUNNING, 0),
        completed_estimated=estimated,
    )
