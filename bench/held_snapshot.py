"""The hot path while another session holds a snapshot open (an analytics query, a forgotten
transaction): no-op jobs at a steady rate through runworker processes, then a REPEATABLE READ
transaction is opened and held while they keep flowing. Printed per window: enqueue -> start
p50/p99, the dead row versions in the ledger's tables and the snapshot's age (what
``feishu_inbox_database_dead_tuples`` and ``..._oldest_snapshot_seconds`` show).

The issue's goal: a 10-minute hold at 300 jobs/s, the last window's p99 within 2x the p99
before the snapshot. The database is a throwaway cluster of its own (initdb on a free port,
autovacuum on, as in production; the machine's server binaries), so the shared server's
settings (this machine's runs without autovacuum) do not decide the figure.

    .venv/bin/python bench/held_snapshot.py [--rate 300] [--baseline 60] [--hold 600]
                                            [--window 60] [--workers 2] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _setup import ROOT, django_setup, percentile, reproduce

#: Threads that enqueue, each its share of the rate (one thread reached about 110/s here).
ENQUEUERS = 4


def throwaway_cluster() -> tuple[str, Path]:
    from tests.support.private_postgres import SERVER_USER, as_server_user, pg_ctl, server_bin
    from tests.support.processes import free_port

    home = Path(tempfile.mkdtemp(prefix="feishu_inbox-bench-"))
    if os.geteuid() == 0:
        shutil.chown(home, user=SERVER_USER)
    data, port = home / "data", free_port()
    subprocess.run(
        as_server_user(
            [str(server_bin() / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"]
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    with open(data / "postgresql.conf", "a") as conf:
        conf.write(f"port = {port}\nlisten_addresses = '127.0.0.1'\n")
        conf.write(f"unix_socket_directories = '{home}'\nmax_connections = 200\n")
    pg_ctl(data, "-l", str(home / "server.log"), "start")
    import psycopg

    with psycopg.connect(f"postgres://postgres@127.0.0.1:{port}/postgres", autocommit=True) as db:
        db.execute("CREATE DATABASE bench_held_snapshot")
    return f"postgres://postgres@127.0.0.1:{port}/bench_held_snapshot", data


def start_workers(url: str, n: int, concurrency: int, out: Path) -> list[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "FEISHU_INBOX_HANDLERS": "bench.bench_handlers",
        "BENCH_LATENCY_FILE": str(out),
        "LOG_LEVEL": "WARNING",
    }
    command = [sys.executable, "manage.py", "runworker", "--concurrency", str(concurrency)]
    return [subprocess.Popen([*command, "-v", "0"], cwd=ROOT, env=env) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=300)
    parser.add_argument("--baseline", type=float, default=60)
    parser.add_argument("--hold", type=float, default=600)
    parser.add_argument("--window", type=float, default=60)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    from tests.support.private_postgres import pg_ctl

    url, data = throwaway_cluster()
    try:
        run(url, args)
    finally:
        pg_ctl(data, "-m", "immediate", "stop", check=False)
        shutil.rmtree(data.parent, ignore_errors=True)


def run(url: str, args: argparse.Namespace) -> None:
    django_setup(url)
    import psycopg

    from feishu_inbox import ledger
    from feishu_inbox.ledger import stats

    out = Path(tempfile.mkdtemp()) / "latency.txt"
    out.touch()
    workers = start_workers(url, args.workers, args.concurrency, out)
    warm = 50
    for n in range(warm):  # the workers up and their connections open before anything counts
        ledger.enqueue(
            event_id=f"warm-{n}",
            event_type="bench.latency",
            partition_key=f"chat-{n}",
            payload={"t0": time.time()},
        )
    deadline = time.time() + 120
    while len(out.read_text().splitlines()) < warm and time.time() < deadline:
        time.sleep(0.2)  # the warm-up's jobs to run, bounded
    out.write_text("")
    began = time.time()
    total = args.baseline + args.hold
    enqueued = [0] * ENQUEUERS

    def enqueue(k: int) -> None:
        """Enqueuer k's share of the rate, on a fixed schedule of its own."""
        from django.db import connection

        n = 0
        rate = args.rate / ENQUEUERS
        try:
            while time.time() - began < total:
                ledger.enqueue(
                    event_id=f"held-{k}-{n}",
                    event_type="bench.latency",
                    partition_key=f"chat-{(n * ENQUEUERS + k) % 100}",
                    payload={"t0": time.time()},
                )
                n += 1
                # the arrivals' schedule: job n is due at began + n / rate
                time.sleep(max(0.0, began + n / rate - time.time()))
        finally:
            enqueued[k] = n
            connection.close()

    samples: list[tuple[float, int, float]] = []  # (seconds since start, dead tuples, snapshot)
    holder = psycopg.connect(url)
    held_at = 0.0
    threads = [threading.Thread(target=enqueue, args=(k,)) for k in range(ENQUEUERS)]
    try:
        for thread in threads:
            thread.start()
        held = False
        while time.time() - began < total:
            if not held and time.time() - began >= args.baseline:
                holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                holder.execute("SELECT count(*) FROM feishu_inbox_eventjob").fetchone()
                held, held_at = True, time.time() - began
            found = stats.vacuum()
            dead = sum(d for d, _ in found.tables.values())
            samples.append((time.time() - began, dead, found.oldest_snapshot_seconds))
            time.sleep(min(args.window / 4, 5.0))  # a sample every few seconds
        for thread in threads:
            thread.join()
        n = sum(enqueued)
        deadline = time.time() + 300
        while len(out.read_text().splitlines()) < n and time.time() < deadline:
            time.sleep(0.2)  # the last jobs to run, bounded
        found = stats.vacuum()
        samples.append((time.time() - began, sum(d for d, _ in found.tables.values()), 0.0))
    finally:
        holder.close()
        for proc in workers:
            proc.terminate()
        for proc in workers:
            proc.wait(60)
    lines = [line.split() for line in out.read_text().splitlines()]
    latencies = [(float(a) - began, (float(b) - float(a)) * 1000) for a, b in lines]
    print(f"# {reproduce()}")
    print(
        f"# {n} jobs enqueued at {args.rate:g}/s, {len(lines)} started; a REPEATABLE READ "
        f"snapshot held from {held_at:.0f} s for {args.hold:g} s; {args.workers} workers x "
        f"{args.concurrency} slots; autovacuum on"
    )
    print(f"{'window (s)':<14}{'jobs':>8}{'p50 ms':>10}{'p99 ms':>10}{'dead tuples':>14}")
    edges = [0.0, args.baseline]
    while edges[-1] < total:
        edges.append(min(total, edges[-1] + args.window))
    rows = []
    for lo, hi in itertools.pairwise(edges):
        window = [ms for at, ms in latencies if lo <= at < hi]
        dead = max((d for at, d, _ in samples if at <= hi), default=0)
        if window:
            rows.append((lo, hi, len(window), percentile(window, 50), percentile(window, 99)))
            print(
                f"{lo:>5.0f}-{hi:<8.0f}{len(window):>8}{percentile(window, 50):>10.1f}"
                f"{percentile(window, 99):>10.1f}{dead:>14}"
            )
    before, last = rows[0][4], rows[-1][4]
    print(
        f"p99 before the snapshot {before:.1f} ms; in the last window {last:.1f} ms "
        f"({last / before:.1f}x; goal <= 2x)"
    )


if __name__ == "__main__":
    main()
