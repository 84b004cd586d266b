"""What the Prometheus metrics cost, on PostgreSQL, measured in one run:

- no-op runworker throughput (1 x 4 slots) with metrics on and off (``FEISHU_INBOX_METRICS=off``
  makes every instrument a no-op), in alternating rounds: the hot path's counters should cost
  nothing noticeable;
- one reading of the ledger's gauges (what a scrape does when its 5 s cache is stale) on a
  ledger of --rows jobs (most completed, as bench/admin_pages.py fills it): under 100 ms.

    .venv/bin/python bench/metrics.py [--jobs 5000] [--rounds 3] [--rows 1000000]
"""

from __future__ import annotations

import argparse
import json
import time

from _setup import django_setup, fresh_postgres, median, percentile, reproduce, truncate_ledger
from admin_pages import fill
from worker import throughput


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--reads", type=int, default=20)
    args = parser.parse_args()
    url = fresh_postgres("bench_metrics")
    django_setup(url)
    rates: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(args.rounds):
        for kind in ("on", "off"):
            rate = throughput(url, 1, 4, args.jobs, "bench.noop", {"FEISHU_INBOX_METRICS": kind})
            rates[kind].append(rate)
            print(f"round {r + 1}: metrics {kind}: {rate:,.0f} jobs/s")

    if not args.rows:
        print(json.dumps({k: median(v) for k, v in rates.items()}))
        _print_rates(rates)
        return
    from django.db import connection

    from feishu_inbox.monitoring import LedgerCollector

    truncate_ledger()
    with connection.cursor() as cur:
        cur.execute("TRUNCATE feishu_inbox_partition")
    started = time.perf_counter()
    fill(args.rows)
    print(f"filled {args.rows:,} jobs in {time.perf_counter() - started:.0f} s")
    collector = LedgerCollector(cache_seconds=0)
    reads = []
    for _ in range(args.reads):
        started = time.perf_counter()
        families = list(collector.collect())
        reads.append((time.perf_counter() - started) * 1000)
    up = next(f for f in families if f.name == "feishu_inbox_ledger_up").samples[0].value
    assert up == 1, "the ledger could not be read"
    result = {
        "jobs_per_s_1x4": {k: median(v) for k, v in rates.items()},
        "rounds": rates,
        "ledger_read_ms": {
            "rows": args.rows,
            "p50": percentile(reads, 50),
            "max": max(reads),
        },
    }
    print(json.dumps(result, indent=2))
    _print_rates(rates)
    print(
        f"reading the ledger's gauges at {args.rows:,} jobs: p50 {percentile(reads, 50):.1f} ms, "
        f"max {max(reads):.1f} ms over {args.reads} reads"
    )
    print(f"reproduce: {reproduce()}; this machine's speed swings: compare within one run")


def _print_rates(rates: dict[str, list[float]]) -> None:
    on, off = median(rates["on"]), median(rates["off"])
    ratios = [a / b for a, b in zip(rates["on"], rates["off"], strict=True)]
    print(
        f"no-op jobs/s at 1 x 4: metrics on {on:,.0f}, off {off:,.0f} (ratio {on / off:.2f}; "
        f"per round {', '.join(f'{x:.2f}' for x in ratios)})"
    )


if __name__ == "__main__":
    main()
