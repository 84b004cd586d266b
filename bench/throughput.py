"""Enqueue and claim+finish throughput on PostgreSQL, beside pgbench's limit for a job.

claim+finish runs as runworker does: each finish also claims the claimer's next job, in one
statement (one commit per job instead of two).

pgbench runs a one-insert / one-claim (SKIP LOCKED) / one-update job (3 commits, the mix of
shared/peers/pgbench/job.sql) on the same server in the same run, so the ratio shows how close
the ledger gets to what the database itself can do. Each round measures pgbench and the ledger
back to back, and the figures printed are the medians of the rounds: this machine's speed
swings from minute to minute, so a ratio of two figures taken far apart says little.

    .venv/bin/python bench/throughput.py [--jobs 10000] [--partitions 1000] [--seconds 5]
                                         [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import subprocess
import tempfile
import time

from _setup import PG_SERVER, django_setup, fresh_postgres, median, reproduce, truncate_ledger

PGBENCH_SETUP = """
DROP TABLE IF EXISTS pgb_jobs;
CREATE TABLE pgb_jobs (
  id bigserial PRIMARY KEY, status smallint NOT NULL DEFAULT 0,
  payload jsonb NOT NULL DEFAULT '{}', created_at timestamptz NOT NULL DEFAULT now(),
  started_at timestamptz, finished_at timestamptz);
CREATE INDEX pgb_jobs_todo ON pgb_jobs (id) WHERE status = 0;
"""
PGBENCH_JOB = """
INSERT INTO pgb_jobs (payload) VALUES ('{"task":"noop"}');
WITH c AS (
  UPDATE pgb_jobs SET status = 1, started_at = now()
   WHERE id = (SELECT id FROM pgb_jobs WHERE status = 0 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
   RETURNING id)
SELECT coalesce((SELECT id FROM c), 0) AS jid \\gset
UPDATE pgb_jobs SET status = 2, finished_at = now() WHERE id = :jid;
"""


def pgbench(db_url: str, clients: int, seconds: int) -> float:
    """Complete 3-commit jobs per second."""
    subprocess.run(["psql", "-qX", db_url, "-c", PGBENCH_SETUP], check=True, capture_output=True)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(PGBENCH_JOB)
    try:
        out = subprocess.run(
            [
                "pgbench",
                "-n",
                "-f",
                f.name,
                "-c",
                str(clients),
                "-j",
                "2",
                "-T",
                str(seconds),
                db_url,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        os.unlink(f.name)
    return float(re.search(r"tps = ([0-9.]+)", out).group(1))  # type: ignore[union-attr]


def fill(jobs: int, partitions: int) -> float:
    """Enqueue ``jobs`` one at a time; returns jobs/s."""
    from feishu_inbox import ledger

    start = time.perf_counter()
    for i in range(jobs):
        ledger.enqueue(
            event_id=f"e{i}-{start}",
            event_type="im.message.receive_v1",
            partition_key=f"chat-{i % partitions}",
            payload={"i": i, "text": "hello"},
        )
    return jobs / (time.perf_counter() - start)


def _claimer(db_url: str, barrier: mp.synchronize.Barrier, done: mp.Queue) -> None:  # type: ignore[name-defined]
    django_setup(db_url, migrate=False)
    from feishu_inbox import ledger
    from feishu_inbox.ledger.stats import stats

    stats()  # connect before the clock starts
    barrier.wait()
    n = 0
    misses = 0
    worker = f"bench-{os.getpid()}"
    while misses < 3:
        claimed = ledger.claim(worker)
        if not claimed:
            misses += 1
            continue
        misses = 0
        # As runworker does: finish and claim the next head in one statement.
        while claimed:
            _, claimed = ledger.finish_and_claim(claimed[0].lease, limit=1)
            n += 1
    done.put((n, time.perf_counter()))


def drain(db_url: str, processes: int) -> float:
    """Claim+finish everything with ``processes`` claimer processes; returns jobs/s."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(processes + 1)
    done: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_claimer, args=(db_url, barrier, done)) for _ in range(processes)]
    for p in procs:
        p.start()
    barrier.wait()
    start = time.perf_counter()
    results = [done.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    total = sum(n for n, _ in results)
    end = max(t for _, t in results)
    return total / (end - start)


def one_round(url: str, pgb_url: str, jobs: int, partitions: int, seconds: int) -> dict:
    """pgbench at 1 and 4 clients, then the ledger's enqueue and claim+finish at 1 and 4
    claimers, back to back, so each ratio compares figures taken within a minute."""
    from django.db import connections

    base = {c: pgbench(pgb_url, c, seconds) for c in (1, 4)}
    truncate_ledger()
    enqueue_rate = fill(jobs, partitions)
    connections.close_all()
    rates = {1: drain(url, 1)}
    truncate_ledger()
    fill(jobs, partitions)
    connections.close_all()
    rates[4] = drain(url, 4)
    # pgbench's job is enqueue + claim + complete; ours over the same three steps:
    full = 1 / (1 / enqueue_rate + 1 / rates[1])
    return {
        "enqueue_jobs_per_s": enqueue_rate,
        "full_job_jobs_per_s_1": full,
        "claim_finish_jobs_per_s_1": rates[1],
        "claim_finish_jobs_per_s_4": rates[4],
        "pgbench_3commit_jobs_per_s_1": base[1],
        "pgbench_3commit_jobs_per_s_4": base[4],
        "ratio_to_pgbench_1": rates[1] / base[1],
        "ratio_to_pgbench_4": rates[4] / base[4],
        "full_job_ratio_to_pgbench_1": full / base[1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=5, help="pgbench duration per run")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of every figure; medians are printed"
    )
    args = parser.parse_args()

    pgb_url = fresh_postgres("fi_bench_pgbench")
    url = fresh_postgres("fi_bench_throughput")
    django_setup(url)
    rounds = []
    for n in range(1, args.rounds + 1):
        r = one_round(url, pgb_url, args.jobs, args.partitions, args.seconds)
        rounds.append(r)
        print(
            f"round {n}: enqueue {r['enqueue_jobs_per_s']:.0f}, claim+finish "
            f"{r['claim_finish_jobs_per_s_1']:.0f} / {r['claim_finish_jobs_per_s_4']:.0f}, "
            f"pgbench {r['pgbench_3commit_jobs_per_s_1']:.0f} / "
            f"{r['pgbench_3commit_jobs_per_s_4']:.0f} jobs/s at 1 / 4; whole job "
            f"{r['full_job_jobs_per_s_1']:.0f} jobs/s, ratio {r['full_job_ratio_to_pgbench_1']:.2f}",
            flush=True,
        )
    m = {k: median([r[k] for r in rounds]) for k in rounds[0]}
    print(f"medians of {len(rounds)} rounds:")
    print(f"enqueue, one at a time:        {m['enqueue_jobs_per_s']:8.0f} jobs/s")
    for c in (1, 4):
        print(
            f"claim+finish, {c} claimer(s):    {m[f'claim_finish_jobs_per_s_{c}']:8.0f} jobs/s   "
            f"pgbench 3-commit job, {c} client(s): {m[f'pgbench_3commit_jobs_per_s_{c}']:6.0f} "
            f"jobs/s   ratio {m[f'ratio_to_pgbench_{c}']:.2f}"
        )
    print(
        f"whole job (enqueue+claim+finish), 1 claimer: {m['full_job_jobs_per_s_1']:.0f} jobs/s, "
        f"ratio to pgbench {m['full_job_ratio_to_pgbench_1']:.2f} (goal >= 0.7; per round: "
        + ", ".join(f"{r['full_job_ratio_to_pgbench_1']:.2f}" for r in rounds)
        + ")"
    )
    print(
        json.dumps({k: round(v, 2) if "ratio" in k else round(v) for k, v in m.items()}, indent=2)
    )
    print(f"server: {PG_SERVER}; reproduce: {reproduce()}")


if __name__ == "__main__":
    main()
