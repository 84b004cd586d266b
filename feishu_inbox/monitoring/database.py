"""The database server's own state as it bears on the ledger, for Prometheus: the dead row
versions in the ledger's tables and the age of the oldest snapshot holding vacuum back (a
session in a long transaction, an analytics query, a standby's feedback, a replication slot),
and the replication a commit reaches now. Read with the ledger's gauges (``ledger_metrics``),
cached as they are; on SQLite there is nothing to read."""

from __future__ import annotations

from typing import Any

from ..ledger import replication
from ..ledger import stats as ledger_stats


def database_families() -> list[Any]:
    from prometheus_client.core import GaugeMetricFamily

    found = ledger_stats.vacuum()
    if not found.tables:
        return []
    dead = GaugeMetricFamily(
        "feishu_inbox_database_dead_tuples",
        "Dead row versions in each of the ledger's tables (vacuum removes them once no "
        "snapshot can see them).",
        labels=["table"],
    )
    live = GaugeMetricFamily(
        "feishu_inbox_database_live_tuples",
        "Live rows in each of the ledger's tables (the statistics collector's estimate).",
        labels=["table"],
    )
    for table, (n_dead, n_live) in sorted(found.tables.items()):
        dead.add_metric([table], n_dead)
        live.add_metric([table], n_live)
    snapshot = GaugeMetricFamily(
        "feishu_inbox_database_oldest_snapshot_seconds",
        "Age of the oldest open transaction holding a snapshot on the ledger's database "
        "(0: none): while it lasts, vacuum leaves every row version it might see.",
    )
    snapshot.add_metric([], found.oldest_snapshot_seconds)
    xids = GaugeMetricFamily(
        "feishu_inbox_database_oldest_xmin_age",
        "Age in transaction ids of the oldest xmin holding vacuum back (sessions, standbys' "
        "feedback, replication slots, prepared transactions).",
    )
    xids.add_metric([], found.oldest_xmin_xids)
    now = replication.read()
    standby = GaugeMetricFamily(
        "feishu_inbox_database_replication_lag_bytes",
        "WAL bytes the furthest-behind standby has not flushed (0: none, or no standby).",
    )
    standby.add_metric([], now.lag_bytes)
    synchronous = GaugeMetricFamily(
        "feishu_inbox_database_replication",
        "The replication a commit gets now: 1 for the current kind (sync, async, none, "
        "unknown), 0 for the others.",
        labels=["replication"],
    )
    for kind in ("sync", "async", "none", "unknown"):
        synchronous.add_metric([kind], 1 if kind == now.kind else 0)
    return [dead, live, snapshot, xids, standby, synchronous]
