"""Fair claims (issue 53, docs/tenants.md "Fair claims"): what sharing the slots between
tenants costs, and what a light tenant waits for behind a heavy one, on real ``runworker``
processes, measured in one run.

1. Throughput (PostgreSQL): no-op jobs/s from the first claim to the last finish
   (``runworker --burst``, bench/worker.py's ``throughput``) at 1 x 4 and 2 x 4, with 1, 10
   and 1,000 tenants: ``--jobs`` jobs round-robin over the tenants, each tenant's over its
   share of ``--chats`` chats (1,000: one tenant's 1,000 chats, 100 each of 10 tenants, one
   each of 1,000). One tenant is the plain claim (the fair one ranks only while several
   tenants have due heads): each figure's ratio is to the 1-tenant figure of its shape in
   the same round. Beside it, CPU per job: the workers' and the rest of the machine's
   (PostgreSQL's, on a quiet machine: where the claim's cost shows).
2. The issue's scenario (2 workers x 4 slots, long-running): tenant A's ``--heavy`` no-op
   jobs over 50 chats (and over 500: ``--heavy-chats``) drain; once ``--light-after`` of them
   have finished, tenant B's ``--light`` jobs over ``--light-chats`` chats are enqueued one
   after another. Printed: B's enqueue -> handler start p50 / p99 (t0 taken just before each
   enqueue, the start written by the handler, as bench/worker.py's latency), B's last finish
   (from B's first enqueue), A's drain (A's first claim to its last finish), how many of A's
   jobs had finished when B's last did, B's p99 / A's drain; and the same run without tenants
   (A and B of none: the plain claim throughout), whose total jobs/s the fair run's is
   compared with (the issue's goal: within 10%).

``--rounds`` alternate the order of the cases (odd rounds in order, even ones reversed);
figures are the rounds' medians, ratios the medians of each round's ratio. ``--sqlite``: the
scenario on SQLite too (its workers poll every 10 ms: no NOTIFY). The machine's speed swings:
compare figures of one run only.

    nice -n 10 .venv/bin/python bench/fair.py [--jobs 10000] [--chats 1000] [--rounds 3]
        [--tenants 1 10 1000] [--heavy 20000] [--heavy-chats 50 500] [--light 200]
        [--light-chats 5] [--light-after 200] [--part all|throughput|scenario] [--sqlite]

A short trial: ``--jobs 500 --heavy 2000 --light 50 --light-after 50 --rounds 1``. PostgreSQL
database ``fi_bench_fair`` (plus ``$BENCH_DB_SUFFIX``) on ``$BENCH_PG``, dropped at the end;
SQLite's in ``.bench/``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _setup import (
    django_setup,
    drop_postgres,
    each_backend,
    empty_ledger,
    fresh_postgres,
    fresh_sqlite,
    median,
    percentile,
    reproduce,
)
from worker import CPU_PER_JOB, fill, start_workers, stop, throughput

DATABASE = "fi_bench_fair"
SHAPES = (("1x4", 1, 4), ("2x4", 2, 4))
HEAVY, LIGHT = "bench.noop", "bench.latency"  # bench/bench_handlers.py
SCENARIO_PROCS, SCENARIO_SLOTS = 2, 4  # as tests/runtime/test_fair_workers.py


def tenant_names(count: int) -> list[str]:
    return [f"t{i}" for i in range(count)]


# --- 1. throughput ---------------------------------------------------------------------------


def throughput_round(url: str, args: argparse.Namespace, number: int) -> dict[str, float]:
    """Each shape with each tenant count, once; the order reversed in even rounds."""
    cases = [(shape, tenants) for shape in SHAPES for tenants in args.tenants]
    got: dict[str, float] = {}
    for (label, procs, slots), tenants in cases if number % 2 else cases[::-1]:
        key = f"{label}_{tenants}"
        got[f"jobs_per_s_{key}"] = throughput(
            url, procs, slots, args.jobs, partitions=args.chats, tenants=tenant_names(tenants)
        )
        got[f"worker_cpu_us_{key}"], got[f"db_cpu_us_{key}"] = CPU_PER_JOB[
            label if tenants == 1 else f"{label}_{tenants}_tenants"
        ]
        print(f"round {number}: {key}: {got[f'jobs_per_s_{key}']:,.0f} jobs/s", file=sys.stderr)
    for label, _, _ in SHAPES:
        for tenants in args.tenants:
            got[f"ratio_{label}_{tenants}"] = (
                got[f"jobs_per_s_{label}_{tenants}"] / got[f"jobs_per_s_{label}_1"]
            )
    return got


# --- 2. the scenario -----------------------------------------------------------------


def enqueue_heavy(n: int, chats: int, tenant: str) -> None:
    """A's backlog, in one go (set-up only): PostgreSQL in one statement (``fill``), SQLite
    through ``ledger.enqueue`` in one transaction."""
    from django.db import connection, transaction

    from feishu_inbox import ledger

    if connection.vendor == "postgresql":
        fill(n, chats, HEAVY, (tenant,))
        return
    with transaction.atomic():
        for i in range(n):
            ledger.enqueue(
                event_id=f"a{i}",
                event_type=HEAVY,
                partition_key=f"chat-a-{i % chats}",
                payload={},
                tenant=tenant,
            )


def wait_until(done: Callable[[], bool], procs: list[subprocess.Popen[bytes]], what: str) -> None:
    deadline = time.monotonic() + 600
    while not done():
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.02)  # polling the ledger, bounded


def scenario(url: str, args: argparse.Namespace, chats: int, tenants: bool) -> dict[str, float]:
    """One run: A's backlog over ``chats`` chats draining through 2 x 4 when B's jobs arrive
    (``tenants``: A's and B's; else both of none)."""
    from django.db import connection
    from django.db.models import Max, Min

    from feishu_inbox import ledger
    from feishu_inbox.models import EventJob

    heavy, light = ("A", "B") if tenants else ("", "")
    total = args.heavy + args.light
    empty_ledger()
    enqueue_heavy(args.heavy, chats, heavy)
    out = Path(tempfile.mkdtemp(prefix="benchfair-")) / "starts.txt"
    poll = {} if connection.vendor == "postgresql" else {"FEISHU_INBOX_POLL_INTERVAL": "0.01"}
    procs = start_workers(url, SCENARIO_PROCS, SCENARIO_SLOTS, BENCH_LATENCY_FILE=str(out), **poll)
    jobs = EventJob.objects
    try:
        wait_until(
            lambda: jobs.filter(event_type=HEAVY, status="completed").count() >= args.light_after,
            procs,
            f"{args.light_after} of A's jobs",
        )
        began = time.perf_counter()
        for i in range(args.light):
            ledger.enqueue(
                event_id=f"b{i}",
                event_type=LIGHT,
                partition_key=f"chat-b-{i % args.light_chats}",
                payload={"t0": time.time()},
                tenant=light,
            )
        enqueue_s = time.perf_counter() - began
        wait_until(
            lambda: jobs.filter(status="completed").count() == total, procs, "every job to end"
        )
    finally:
        stop(procs)
    assert not jobs.exclude(status="completed", attempt=1).exists(), list(
        jobs.exclude(status="completed", attempt=1).values("status", "attempt", "error_type")[:3]
    )
    starts = [line.split() for line in out.read_text().splitlines()]
    assert len(starts) == args.light, (len(starts), args.light)
    waits = [(float(started) - float(t0)) * 1000 for t0, started in starts]
    a = jobs.filter(event_type=HEAVY).aggregate(first=Min("claimed_at"), last=Max("finished_at"))
    b = jobs.filter(event_type=LIGHT).aggregate(first=Min("received_at"), last=Max("finished_at"))
    run = jobs.aggregate(first=Min("claimed_at"), last=Max("finished_at"))
    a_drain = (a["last"] - a["first"]).total_seconds()
    p99 = percentile(waits, 99)
    return {
        "b_p50_ms": percentile(waits, 50),
        "b_p99_ms": p99,
        "b_max_ms": max(waits),
        "b_enqueue_s": enqueue_s,
        "b_last_s": (b["last"] - b["first"]).total_seconds(),
        "a_drain_s": a_drain,
        "a_done_at_b_first": jobs.filter(event_type=HEAVY, finished_at__lte=b["first"]).count(),
        "a_done_at_b_last": jobs.filter(event_type=HEAVY, finished_at__lte=b["last"]).count(),
        "b_p99_over_a_drain": p99 / 1000 / a_drain,
        "jobs_per_s": total / (run["last"] - run["first"]).total_seconds(),
    }


def scenario_round(url: str, args: argparse.Namespace, number: int) -> dict[str, float]:
    """Each A's chat count with tenants and without, once; reversed in even rounds."""
    cases = [(chats, tenants) for chats in args.heavy_chats for tenants in (True, False)]
    got: dict[str, float] = {}
    for chats, tenants in cases if number % 2 else cases[::-1]:
        key = f"s{chats}_{'tenants' if tenants else 'none'}"
        found = scenario(url, args, chats, tenants)
        got.update({f"{key}_{name}": value for name, value in found.items()})
        print(f"round {number}: {key}: {found}", file=sys.stderr)
    for chats in args.heavy_chats:
        got[f"s{chats}_ratio_jobs_per_s"] = (
            got[f"s{chats}_tenants_jobs_per_s"] / got[f"s{chats}_none_jobs_per_s"]
        )
    return got


# --- one backend -----------------------------------------------------------------------------


def measure(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    postgres = backend == "postgres"
    url = fresh_postgres(DATABASE) if postgres else fresh_sqlite("fair")
    django_setup(url)
    found: dict[str, list[float]] = {}
    try:
        if postgres and args.part != "scenario":
            # A first run of each shape, not counted, pays the new database's one-off costs
            # (as bench/worker.py's).
            for _, procs, slots in SHAPES:
                throughput(url, procs, slots, min(args.jobs, 2000), partitions=args.chats)
        for number in range(1, args.rounds + 1):
            got: dict[str, float] = {}
            if postgres and args.part != "scenario":
                got.update(throughput_round(url, args, number))
            if args.part != "throughput":
                got.update(scenario_round(url, args, number))
            for key, value in got.items():
                found.setdefault(key, []).append(value)
    finally:
        from django.db import connections

        connections.close_all()
        if postgres:
            drop_postgres(DATABASE)
    return {k: median(v) for k, v in found.items()} | {
        f"{k}_rounds": v for k, v in found.items() if "ratio" in k
    }


# --- the tables ------------------------------------------------------------------------------


def rounds_of(values: list[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def throughput_table(r: dict[str, Any], args: argparse.Namespace) -> str:
    rows = [
        f"No-op jobs/s on PostgreSQL, first claim to last finish ({args.jobs:,} jobs over "
        f"{args.chats:,} chats, round-robin over the tenants; medians of {args.rounds} round(s))",
        "",
        "| tenants | 1 x 4 | ratio to 1 tenant (per round) | 2 x 4 | ratio to 1 tenant (per round) "
        "| CPU per job, workers / rest of the machine (PostgreSQL), 1 x 4; 2 x 4 |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for tenants in args.tenants:
        cells = [f"{tenants:,}" + (" (the plain claim)" if tenants == 1 else "")]
        cpu = []
        for label, _, _ in SHAPES:
            key = f"{label}_{tenants}"
            cells.append(f"{r[f'jobs_per_s_{key}']:,.0f}")
            ratio = f"ratio_{key}"
            cells.append(f"{r[ratio]:.2f} ({rounds_of(r[f'{ratio}_rounds'])})")
            cpu.append(f"{r[f'worker_cpu_us_{key}']:.0f} / {r[f'db_cpu_us_{key}']:.0f} µs")
        cells.append("; ".join(cpu))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def scenario_table(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    names = {"postgres": "PostgreSQL", "sqlite": "SQLite"}
    rows = [
        f"A's {args.heavy:,} no-op jobs draining through {SCENARIO_PROCS} workers x "
        f"{SCENARIO_SLOTS} slots; B's {args.light:,} jobs over {args.light_chats} chats enqueued "
        f"once {args.light_after:,} of A's had finished (medians of {args.rounds} round(s))",
        "",
        "| database, A's chats, whose jobs | B enqueue → start p50 / p99 / max ms "
        "| B's enqueue, s | B's last finish, s after its first enqueue | A's drain, s "
        "| A's jobs done at B's first / last | B's p99 / A's drain | jobs/s (A and B) "
        "| jobs/s, tenants / none (per round) |",
        "| --- |" + " ---: |" * 8,
    ]
    for backend, r in results.items():
        for chats in args.heavy_chats:
            for whose in ("tenants", "none"):
                k = f"s{chats}_{whose}_"
                if f"{k}jobs_per_s" not in r:
                    continue
                ratio = f"s{chats}_ratio_jobs_per_s"
                label = "A's and B's tenants" if whose == "tenants" else "no tenants"
                cells = [
                    f"{names[backend]}, {chats}, {label}",
                    f"{r[k + 'b_p50_ms']:,.1f} / {r[k + 'b_p99_ms']:,.1f} / {r[k + 'b_max_ms']:,.1f}",
                    f"{r[k + 'b_enqueue_s']:.2f}",
                    f"{r[k + 'b_last_s']:.2f}",
                    f"{r[k + 'a_drain_s']:.2f}",
                    f"{r[k + 'a_done_at_b_first']:,.0f} / {r[k + 'a_done_at_b_last']:,.0f}",
                    f"{r[k + 'b_p99_over_a_drain']:.3f}",
                    f"{r[k + 'jobs_per_s']:,.0f}",
                    f"{r[ratio]:.2f} ({rounds_of(r[ratio + '_rounds'])})"
                    if whose == "tenants"
                    else "",
                ]
                rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs per throughput run")
    parser.add_argument("--chats", type=int, default=1000, help="chats per throughput run")
    parser.add_argument("--tenants", type=int, nargs="+", default=[1, 10, 1000])
    parser.add_argument("--heavy", type=int, default=20_000, help="tenant A's jobs")
    parser.add_argument("--heavy-chats", type=int, nargs="+", default=[50, 500])
    parser.add_argument("--light", type=int, default=200, help="tenant B's jobs")
    parser.add_argument("--light-chats", type=int, default=5)
    parser.add_argument(
        "--light-after", type=int, default=200, help="A's jobs finished before B's arrive"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians)")
    parser.add_argument("--part", choices=("all", "throughput", "scenario"), default="all")
    parser.add_argument("--sqlite", action="store_true", help="the scenario on SQLite too")
    parser.add_argument("--backend", help=argparse.SUPPRESS)  # one backend per process
    args = parser.parse_args()
    if 1 not in args.tenants:
        args.tenants.insert(0, 1)  # the figure every ratio is to
    if args.backend is not None:
        print(json.dumps(measure(args.backend, args)))
        return
    results = dict(each_backend(__file__, args.sqlite, progress=True))
    if args.part != "scenario":
        print(throughput_table(results["postgres"], args), end="\n\n")
    if args.part != "throughput":
        print(scenario_table(results, args))
    print(json.dumps(results, indent=2))
    print(f"reproduce: {reproduce()}")


if __name__ == "__main__":
    main()
