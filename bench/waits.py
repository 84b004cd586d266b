"""Waits (SPEC §9e): what 100,000 waiting jobs cost the claim, and signal → resume latency.

1. Claim+finish cost, and the cost of a claim that finds nothing (an idle worker's, which also
   sweeps for due waits), with 100,000 jobs waiting (half of them holding their chat, half
   having given it back; each with an open wait, due in an hour) beside none. The claim reads
   the claimable heads' index and the sweep the open waits' deadline index: goal ratio <= 1.1.
2. Signal → resumed handler: one idle ``runworker`` (concurrency 1); jobs wait for their own
   key; each signal commits at t0 and the resumed handler writes when its ``wait_for``
   returned; p50, p99 and max over ``--signals`` signals ``--gap`` seconds apart.

    .venv/bin/python bench/waits.py [--waiting 100000] [--jobs 2000] [--signals 200] [--sqlite]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _setup import (
    ROOT,
    analyze,
    django_setup,
    each_backend,
    fresh_postgres,
    fresh_sqlite,
    median,
    percentile,
    reproduce,
    timed,
)


def fill_waiting(n: int) -> None:
    """``n`` jobs in ``waiting``, each with an open wait due in an hour: the first half hold
    their chat (its head is the waiting job), the second gave it back (a parked key)."""
    from django.db import connection

    from feishu_inbox.store.schema import JOB_TABLE, PARTITION_TABLE, WAIT_TABLE
    from feishu_inbox.store.waits import PARKED_PREFIX

    half = n // 2
    columns = (
        "app, event_id, event_type, dedupe_key, partition_key, private_message, payload, "
        "status, attempt, received_at, available_at, worker_id, lease_token, "
        "effects_in_flight, side_effect_started, effect_uncertain, error_type, error_message, "
        "resolution"
    )
    pg = connection.vendor == "postgresql"
    series = (
        "generate_series(1, %s) AS s(i)"
        if pg
        else "(WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < %s) "
        "SELECT i FROM g) AS s"
    )
    now, hour = (
        ("now()", "now() + interval '1 hour'")
        if pg
        else (
            "datetime('now')",
            "datetime('now', '+1 hour')",
        )
    )
    false, empty = ("FALSE", "'{}'::jsonb") if pg else ("0", "'{}'")
    key = f"CASE WHEN s.i <= {half} THEN 'held-' || s.i ELSE '{PARKED_PREFIX}' || s.i END"
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {JOB_TABLE} ({columns}) SELECT 'default', 'w' || s.i, 'bench.waits', "
            f"'w' || s.i, {key}, {false}, {empty}, 'waiting', 0, {now}, {now}, '', '', 0, "
            f"{false}, {false}, 'Waiting', '', '' FROM {series}",
            [n],
        )
        cur.execute(
            f"INSERT INTO {PARTITION_TABLE} (key, head_id, head_state, head_due_at, head_priority) "
            f"SELECT partition_key, id, 'waiting', available_at, 0 FROM {JOB_TABLE} "
            "WHERE event_type = 'bench.waits' AND partition_key LIKE 'held-%%'"
        )
        cur.execute(
            f"INSERT INTO {WAIT_TABLE} (job_id, name, key, until, state, hold_chat, payload, "
            "created_at, resolved_at, partition_key) "
            f"SELECT id, 'wait:1', 'k-' || id, {hour}, 'open', "
            f"partition_key LIKE 'held-%%', NULL, {now}, NULL, 'chat-' || id "
            f"FROM {JOB_TABLE} WHERE event_type = 'bench.waits'"
        )


def costs(jobs: int) -> tuple[float, float]:
    """Seconds per job to claim and finish ``jobs`` runnable jobs one at a time (300 chats),
    and seconds per claim that finds nothing (its sweeps included)."""
    from feishu_inbox import ledger
    from feishu_inbox.ledger import rules

    for i in range(jobs):
        ledger.enqueue(event_id=f"r{i}", event_type="t", partition_key=f"c-{i % 300}", payload={})

    def work() -> int:
        done = 0
        while claimed := ledger.claim("bench"):
            ledger.finish(claimed[0].lease)
            done += 1
        return done

    done, seconds = timed(work)
    assert done == jobs, (done, jobs)

    def empty() -> int:
        for _ in range(500):
            rules._last_sweep[0] = 0.0  # each empty claim sweeps, as an idle worker's does
            assert not ledger.claim("bench")
        return 500

    n, idle = timed(empty)
    return seconds / done, idle / n


def measure_claims(backend: str, waiting: int, jobs: int, rounds: int) -> dict[str, float]:
    from django.core.management import call_command
    from django.db import connections

    found: dict[str, list[float]] = {"none": [], "waiting": [], "none_idle": [], "waiting_idle": []}
    for r in range(rounds):
        for label, n in (("none", 0), ("waiting", waiting)):
            connections.close_all()
            name = f"fi_bench_waits_{label}_{r}"
            url = fresh_postgres(name) if backend == "postgres" else fresh_sqlite(name)
            connections["default"].settings_dict["NAME"] = (
                url.split("/")[-1] if backend == "postgres" else url.split("///", 1)[1]
            )
            call_command("migrate", verbosity=0)
            if n:
                fill_waiting(n)
            analyze()  # both cases planned from statistics, as autovacuum would give them
            busy, idle = costs(jobs)
            found[label].append(busy)
            found[f"{label}_idle"].append(idle)
    connections.close_all()
    return {k: median(v) for k, v in found.items()}


def signal_latency(url: str, n: int, gap: float) -> dict[str, float]:
    """Signals to idle waiting jobs, one every ``gap`` s; ms from each commit to its handler."""
    import feishu_inbox
    from feishu_inbox import ledger
    from feishu_inbox.models import EventJob

    out = Path(tempfile.mkdtemp()) / "signals.txt"
    for i in range(n):
        ledger.enqueue(
            event_id=f"s{i}", event_type="bench.signal", partition_key=f"s-{i}", payload={}
        )
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "FEISHU_INBOX_HANDLERS": "bench.bench_handlers",
        "BENCH_LATENCY_FILE": str(out),
        "LOG_LEVEL": "ERROR",
        "PYTHONPATH": str(ROOT),
    }
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "runworker", "--concurrency", "1", "-v", "0"],
        cwd=ROOT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 300
        while EventJob.objects.filter(status="waiting").count() < n:  # every job waits
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError("the jobs did not all start to wait")
            time.sleep(0.05)
        start = time.monotonic()
        for i in range(n):
            time.sleep(max(0.0, start + i * gap - time.monotonic()))  # a fixed schedule
            feishu_inbox.signal(f"bench-{i}", {"t0": time.time()})  # autocommit: commits now
        deadline = time.monotonic() + 120
        while not out.exists() or len(out.read_text().splitlines()) < n:
            if time.monotonic() > deadline:
                raise RuntimeError("not every signalled job resumed")
            time.sleep(0.05)
    finally:
        worker.terminate()
        worker.wait(30)
    ms = [
        (float(b) - float(a)) * 1000
        for a, b in (ln.split() for ln in out.read_text().split("\n") if ln)
    ]
    return {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99), "max_ms": max(ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waiting", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--signals", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.02)
    parser.add_argument("--sqlite", action="store_true", help="also measure SQLite")
    parser.add_argument("--backend", help=argparse.SUPPRESS)  # one backend per process
    args = parser.parse_args()
    if args.backend is None:
        results = {}
        for backend, r in each_backend(__file__, args.sqlite):
            results[backend] = r
            print(
                f"{backend}: claim+finish {r['none'] * 1e6:.0f} us/job with no job waiting, "
                f"{r['waiting'] * 1e6:.0f} us/job with {args.waiting:,} waiting: ratio "
                f"{r['waiting'] / r['none']:.2f} (goal <= 1.1); an empty claim (sweeps "
                f"included) {r['none_idle'] * 1e6:.0f} vs {r['waiting_idle'] * 1e6:.0f} us: "
                f"ratio {r['waiting_idle'] / r['none_idle']:.2f}; signal -> resumed handler "
                f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, max {r['max_ms']:.1f} ms"
            )
        print(json.dumps(results, indent=2))
        print(f"reproduce: {reproduce()}")
        return
    url = fresh_postgres("fi_bench_waits") if args.backend == "postgres" else fresh_sqlite("w")
    django_setup(url, migrate=False)
    result = measure_claims(args.backend, args.waiting, args.jobs, args.rounds)
    from django.core.management import call_command
    from django.db import connections

    connections.close_all()
    url = fresh_postgres("fi_bench_signals") if args.backend == "postgres" else fresh_sqlite("s")
    connections["default"].settings_dict["NAME"] = (
        url.split("/")[-1] if args.backend == "postgres" else url.split("///", 1)[1]
    )
    call_command("migrate", verbosity=0)
    result.update(signal_latency(url, args.signals, args.gap))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
