"""Backfills and exports (SPEC §9i): rows per second beside what a site would write by hand.

1. A backfill of ``--rows`` rows (``value = id * 2, counter + 1``, batches of 1,000, no rate
   limit) run by ``runworker --burst`` of one slot, in this process: rows per second from the
   start to the last batch. Each batch is one transaction with the cursor's compare-and-set.
2. The same writes as a plain loop: ``UPDATE … WHERE id BETWEEN a AND a + 999``, one
   autocommitted statement per batch, no cursor, no job, no pacing.
3. An export of the same rows (4 columns, CSV, parts of 100,000, the file-system storage) run by
   the worker: rows per second, and the process's memory (RSS) before and at its peak.
4. Django's ``.iterator(chunk_size=2000)`` into ``csv.writer`` (model instances), and the same
   over ``values_list`` (tuples): rows per second, into one local file.

    .venv/bin/python bench/backfills.py [--rows 200000] [--sqlite]

The machine may be shared: the figures are indicative, run it a few times.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _setup import each_backend, fresh_postgres, fresh_sqlite, reproduce

BATCH = 1000


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Sampler:
    """The process's RSS, sampled every 20 ms while a phase runs."""

    def __init__(self) -> None:
        self.start, self.peak = rss(), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):  # the sampling interval
            self.peak = max(self.peak, rss())

    def stop(self) -> tuple[float, float]:
        self._stop.set()
        self._thread.join()
        return round(self.start / 2**20, 1), round(max(self.peak, rss()) / 2**20, 1)


def measure(backend: str, rows: int) -> dict[str, Any]:
    name = "bench_backfills"
    url = fresh_postgres(name) if backend == "postgres" else fresh_sqlite(name)
    os.environ["BACKFILL_TEST_BATCH"] = str(BATCH)
    from _setup import django_setup

    django_setup(url)
    from django.core.files.storage import FileSystemStorage
    from django.core.management import call_command
    from django.db import connection

    import feishu_inbox
    from feishu_inbox import backfills
    from tests.support import backfill_jobs
    from tests.support.backfill_jobs import TABLE, Row

    backfill_jobs.make_table()
    backfill_jobs.fill_table(rows)

    def worker() -> None:
        call_command("runworker", "--burst", "--concurrency", "1", "-v", "0")

    started = time.perf_counter()
    backfills.start("test.fill")
    worker()
    backfill_seconds = time.perf_counter() - started
    assert set(Row.objects.values_list("counter", flat=True)) == {1}

    started = time.perf_counter()
    with connection.cursor() as cur:
        for low in range(1, rows + 1, BATCH):
            cur.execute(
                f"UPDATE {TABLE} SET value = id * 2, counter = counter + 1 "
                "WHERE id BETWEEN %s AND %s",
                [low, low + BATCH - 1],
            )
    loop_seconds = time.perf_counter() - started
    assert set(Row.objects.values_list("counter", flat=True)) == {2}

    columns = ["id", "label", "value", "counter"]
    with tempfile.TemporaryDirectory() as folder:
        sampler = Sampler()
        started = time.perf_counter()
        feishu_inbox.export(
            "bench",
            Row.objects.all(),
            columns=columns,
            part_rows=100_000,
            storage=FileSystemStorage(location=folder),
        )
        worker()
        export_seconds = time.perf_counter() - started
        rss_before, rss_peak = sampler.stop()

        def plain(values: bool) -> float:
            started = time.perf_counter()
            with (Path(folder) / "plain.csv").open("w", newline="") as f:
                out = csv.writer(f)
                out.writerow(columns)
                if values:
                    for row in Row.objects.values_list(*columns).iterator(chunk_size=2000):
                        out.writerow(row)
                else:
                    for obj in Row.objects.iterator(chunk_size=2000):
                        out.writerow([obj.id, obj.label, obj.value, obj.counter])
            return time.perf_counter() - started

        plain_models, plain_values = plain(False), plain(True)
    return {
        "rows": rows,
        "backfill_rows_per_second": round(rows / backfill_seconds),
        "update_loop_rows_per_second": round(rows / loop_seconds),
        "export_rows_per_second": round(rows / export_seconds),
        "iterator_csv_rows_per_second": round(rows / plain_models),
        "values_list_csv_rows_per_second": round(rows / plain_values),
        "export_rss_mib_before": rss_before,
        "export_rss_mib_peak": rss_peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--sqlite", action="store_true")
    parser.add_argument("--backend", choices=["postgres", "sqlite"])
    args = parser.parse_args()
    if args.backend:
        print(json.dumps(measure(args.backend, args.rows)))
        return
    print(f"# {reproduce()}  (1 slot, batches of {BATCH}, in one process)")
    for backend, figures in each_backend(__file__, args.sqlite):
        print(f"{backend}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
