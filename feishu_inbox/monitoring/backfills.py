"""The backfills' and exports' gauges (SPEC §9i), read with the ledger's: each backfill's rows
done, estimate of its total, rate, ETA, and whether it is stalled; exports running. One
indexed read of a table of one row per backfill name."""

from __future__ import annotations

from typing import Any


def backfill_families() -> list[Any]:
    from prometheus_client.core import GaugeMetricFamily

    from ..backfills.control import progress
    from ..tables.backfills import Backfill, Export, ExportState

    labels = ["backfill"]
    gauges = {
        "rows_done": GaugeMetricFamily(
            "feishu_inbox_backfill_rows_done",
            "Rows a backfill's current run has done.",
            labels=labels,
        ),
        "total_estimate": GaugeMetricFamily(
            "feishu_inbox_backfill_rows_estimated",
            "The rows a backfill's run walks, estimated when it started (-1: unknown).",
            labels=labels,
        ),
        "rate": GaugeMetricFamily(
            "feishu_inbox_backfill_rows_per_second",
            "A backfill's rate, smoothed over its last batches.",
            labels=labels,
        ),
        "eta_seconds": GaugeMetricFamily(
            "feishu_inbox_backfill_eta_seconds",
            "Seconds until a running backfill is done at its rate (-1: unknown or not running).",
            labels=labels,
        ),
        "stalled": GaugeMetricFamily(
            "feishu_inbox_backfill_stalled",
            "1 when a running backfill committed no batch within its stall window.",
            labels=labels,
        ),
    }
    state = GaugeMetricFamily(
        "feishu_inbox_backfill_state",
        "1 for each backfill's current state (running, paused, applied, cancelled, failed).",
        labels=["backfill", "state"],
    )
    for row in Backfill.objects.all():
        p = progress(row)
        for field, gauge in gauges.items():
            value = getattr(p, field)
            gauge.add_metric([p.name], -1.0 if value is None else float(value))
        state.add_metric([p.name, p.state], 1.0)
    exports = GaugeMetricFamily(
        "feishu_inbox_exports_running", "Exports whose manifest is not written yet."
    )
    exports.add_metric([], Export.objects.filter(state=ExportState.RUNNING).count())
    return [*gauges.values(), state, exports]
