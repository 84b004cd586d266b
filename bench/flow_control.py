"""What flow control costs, on PostgreSQL, measured in one run.

- no-op runworker throughput (1 x 4 and 2 x 4 slots) of this checkout beside another one
  (``--base``, e.g. a worktree of the commit before flow control), in alternating rounds: a
  site that declares no limit should see no difference beyond noise;
- the cost of a job that takes a rate-limit token: no-op jobs that each take one token of
  their chat's bucket (spread rows), and of one bucket all share (one hot row), in both
  checkouts;
- what the worker's flow-control checks cost a job of a handler that declares nothing (a
  pause, a concurrency key, a rate limit, a timeout looked up), in µs, in this process.

``--batch-window 0`` runs this checkout's workers without batches (one commit per job, as a
base from before them): then the two sides differ by what they do per job, not by batching.

    git worktree add /tmp/base <commit>
    .venv/bin/python bench/flow_control.py --base /tmp/base [--jobs 5000] [--rounds 3]
                                           [--noop-only] [--batch-window 0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from _setup import (
    ROOT,
    django_setup,
    fresh_postgres,
    machine_cpu_seconds,
    median,
    reproduce,
    wait_for_exit,
)


def run_sql(url: str, sql: str, params: list[object]) -> list[tuple[object, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return list(cur) if cur.description else []


def prepare(tree: Path, name: str) -> str:
    url = fresh_postgres(name)
    env = {**os.environ, "DATABASE_URL": url}
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=tree, env=env, check=True
    )
    return url


def throughput(
    tree: Path, url: str, procs: int, slots: int, n: int, event_type: str, **extra: str
) -> float:
    run_sql(
        url,
        # CASCADE: the tables that reference the jobs, whichever the checkout has
        "TRUNCATE feishu_inbox_attempt, feishu_inbox_step, feishu_inbox_eventjob, "
        "feishu_inbox_partition CASCADE",
        [],
    )
    run_sql(
        url,
        "SELECT count(*) FROM (SELECT feishu_inbox_enqueue('default', 'n' || g, %s, 'n' || g, "
        "'chat-' || (g %% 1000), false, '{}'::jsonb, NULL::integer) "
        "FROM generate_series(1, %s) g) s",
        [event_type, n],
    )
    run_sql(url, "ANALYZE", [])
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "FEISHU_INBOX_HANDLERS": "bench.bench_handlers",
        "LOG_LEVEL": "WARNING",
        **extra,
    }
    machine_before = machine_cpu_seconds()
    workers = [
        subprocess.Popen(
            # -v 0 on both sides: before 048c231 runworker's default verbosity logged a line
            # per job whatever the site's LOGGING said, and the comparison would weigh that
            [
                *(sys.executable, "manage.py", "runworker", "--burst", "-v", "0"),
                *("--concurrency", str(slots)),
            ],
            cwd=tree,
            env=env,
        )
        for _ in range(procs)
    ]
    worker_cpu = wait_for_exit(workers)
    machine_cpu = machine_cpu_seconds() - machine_before
    ((done, seconds),) = run_sql(
        url,
        "SELECT count(*), EXTRACT(EPOCH FROM max(finished_at) - min(claimed_at)) "
        "FROM feishu_inbox_eventjob WHERE status = 'completed'",
        [],
    )
    assert done == n, (done, n)
    # Where the two cores went, per job: the workers' own CPU and the rest of the machine's
    # (PostgreSQL's backends, almost all of it).
    CPU_PER_JOB.setdefault((str(tree), procs, slots, event_type), []).append(
        (1e6 * worker_cpu / n, 1e6 * (machine_cpu - worker_cpu) / n)
    )
    return float(done) / float(seconds)  # type: ignore[arg-type]


#: (checkout, processes, slots, event type) -> each run's CPU per job in µs (workers, the rest).
CPU_PER_JOB: dict[tuple[str, int, int, str], list[tuple[float, float]]] = {}


def checks_per_job(url: str, n: int = 200_000) -> float:
    """µs of the flow-control lookups the worker makes for each job of a handler that
    declares nothing (runtime/worker.py, _execute and _context), in this process: the pauses
    (a cached list, read again every half second), concurrency keys, rate limits, timeout."""
    import time

    os.environ["FEISHU_INBOX_HANDLERS"] = "bench.bench_handlers"
    django_setup(url, migrate=False)
    from feishu_inbox.ledger import pauses
    from feishu_inbox.runtime import registry

    registry.registered()
    start = time.perf_counter()
    for _ in range(n):
        pauses.holding(app="default", event_type="bench.noop", partition_key="chat-1")
        registry.concurrency_for("bench.noop")
        registry.rate_limits_for("bench.noop")
        registry.timeout_for("bench.noop")
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the other checkout")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--noop-only",
        action="store_true",
        help="only the no-op rows (a base from before flow control has no token handlers)",
    )
    parser.add_argument(
        "--batch-window",
        help="this checkout's BATCH_WINDOW (0: no batches, one commit per job, as a base "
        "from before them)",
    )
    args = parser.parse_args()
    extra = {} if args.batch_window is None else {"FEISHU_INBOX_BATCH_WINDOW": args.batch_window}
    ours = prepare(ROOT, "fi_bench_flow")
    base = prepare(args.base, "fi_bench_flow_base")
    rows: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for label, tree, url, procs, slots, kind in (
            ("noop 1x4", ROOT, ours, 1, 4, "bench.noop"),
            ("base noop 1x4", args.base, base, 1, 4, "bench.noop"),
            ("noop 2x4", ROOT, ours, 2, 4, "bench.noop"),
            ("base noop 2x4", args.base, base, 2, 4, "bench.noop"),
            ("token of its chat 1x4", ROOT, ours, 1, 4, "bench.limited"),
            ("base token of its chat 1x4", args.base, base, 1, 4, "bench.limited"),
            ("token of one shared bucket 1x4", ROOT, ours, 1, 4, "bench.limited_app"),
            ("base token of one shared bucket 1x4", args.base, base, 1, 4, "bench.limited_app"),
        ):
            if args.noop_only and kind != "bench.noop":
                continue
            rate = throughput(
                tree, url, procs, slots, args.jobs, kind, **(extra if tree == ROOT else {})
            )
            rows.setdefault(label, []).append(rate)
            print(f"round {r + 1}: {label}: {rate:,.0f} jobs/s", flush=True)
    med = {k: median(v) for k, v in rows.items()}
    noop = med["noop 1x4"]
    print(json.dumps({k: [round(x) for x in v] for k, v in rows.items()}, indent=2))
    for label in ("token of its chat 1x4", "token of one shared bucket 1x4"):
        if label not in med:
            continue
        extra = (1 / med[label] - 1 / noop) * 4 * 1000  # per job, per slot
        base_noop, base_rate = med["base noop 1x4"], med["base " + label]
        base_extra = (1 / base_rate - 1 / base_noop) * 4 * 1000
        print(
            f"{label}: {med[label]:,.0f} jobs/s, ~{extra:.2f} ms more per job per slot; "
            f"base {base_rate:,.0f} jobs/s, ~{base_extra:.2f} ms (ratio "
            f"{med[label] / base_rate:.2f})"
        )
    print(
        f"no limits declared: 1x4 {med['noop 1x4']:,.0f} vs base {med['base noop 1x4']:,.0f} "
        f"(ratio {med['noop 1x4'] / med['base noop 1x4']:.2f}); 2x4 {med['noop 2x4']:,.0f} vs "
        f"{med['base noop 2x4']:,.0f} (ratio {med['noop 2x4'] / med['base noop 2x4']:.2f})"
    )
    for (tree, procs, slots, kind), runs in CPU_PER_JOB.items():
        if kind == "bench.noop":
            side = "this checkout" if Path(tree) == ROOT else "base"
            workers_us = median([w for w, _ in runs])
            rest_us = median([r for _, r in runs])
            print(
                f"CPU per no-op job, {side} {procs}x{slots}: workers {workers_us:.0f} µs, the "
                f"rest of the machine (PostgreSQL) {rest_us:.0f} µs (medians of {len(runs)})"
            )
    print(
        "flow-control checks of a job whose handler declares nothing: "
        f"{checks_per_job(ours):.2f} µs per job (this process)"
    )
    print(f"reproduce: {reproduce()}; this machine's speed swings: compare within one run")


if __name__ == "__main__":
    main()
