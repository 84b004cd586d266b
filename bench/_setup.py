"""Shared set-up for the benchmarks: a fresh database per run, Django configured in-process.

Nothing here is a test: benchmarks print figures and ratios measured in one run.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PG_SERVER = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
sys.path.insert(0, str(ROOT))


def fresh_postgres(name: str) -> str:
    """Drop and create database ``name`` (plus ``$BENCH_DB_SUFFIX``, so benches of two
    checkouts on one server never drop each other's database); returns its URL."""
    import psycopg

    drop_postgres(name)
    name += os.environ.get("BENCH_DB_SUFFIX", "")
    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{PG_SERVER}/{name}"


def drop_postgres(name: str) -> None:
    """Drop database ``name`` (plus ``$BENCH_DB_SUFFIX``), if it is there."""
    import psycopg

    name += os.environ.get("BENCH_DB_SUFFIX", "")
    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def fresh_sqlite(name: str) -> str:
    path = ROOT / ".bench" / f"{name}.sqlite3"
    path.parent.mkdir(exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return f"sqlite:///{path}"


def django_setup(database_url: str, migrate: bool = True) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    os.environ.setdefault("LOG_LEVEL", "ERROR")
    import django

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)


def truncate_ledger() -> None:
    """Empty the ledger's tables, so a measurement starts from the same tables (this machine's
    PostgreSQL runs without autovacuum: a run would otherwise inherit the last one's dead rows)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            # CASCADE: the tables that reference the jobs (the waits), whichever the checkout
            # has (bench/worker.py --against runs an older one)
            "TRUNCATE feishu_inbox_attempt, feishu_inbox_step, feishu_inbox_cardstream, "
            "feishu_inbox_eventjob, feishu_inbox_partition CASCADE"
        )


def empty_ledger() -> None:
    """``truncate_ledger`` on PostgreSQL; SQLite has no TRUNCATE: the same tables' rows
    deleted, those that reference the jobs first."""
    from django.db import connection

    if connection.vendor == "postgresql":
        truncate_ledger()
        return
    with connection.cursor() as cur:
        for table in (
            "feishu_inbox_turncleanup",
            "feishu_inbox_attempt",
            "feishu_inbox_step",
            "feishu_inbox_cardstream",
            "feishu_inbox_eventjob",
            "feishu_inbox_partition",
        ):
            cur.execute(f"DELETE FROM {table}")


def analyze() -> None:
    """Fresh planner statistics (PostgreSQL), as autovacuum would give them."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("ANALYZE")


def timed(fn: Callable[[], int]) -> tuple[int, float]:
    """Run ``fn`` (returns a count); returns (count, seconds)."""
    start = time.perf_counter()
    n = fn()
    return n, time.perf_counter() - start


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def median(values: list[float]) -> float:
    return statistics.median(values)


def reproduce() -> str:
    return "python " + " ".join(shlex.quote(a) for a in sys.argv)


def each_backend(
    script: str, sqlite: bool, progress: bool = False
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Run ``script`` again with this run's arguments once per database, PostgreSQL first
    (SQLite too with ``sqlite``), each in a process of its own (``--backend``: one Django
    set-up per process); yield each one's JSON answer, the last line it printed.
    ``progress``: what it writes to stderr shows as it goes (else it is kept back)."""
    argv = [a for a in sys.argv[1:] if a != "--sqlite"]
    for backend in ["postgres"] + (["sqlite"] if sqlite else []):
        out = subprocess.run(
            [sys.executable, script, *argv, "--backend", backend],
            check=True,
            stdout=subprocess.PIPE,
            stderr=None if progress else subprocess.PIPE,
            text=True,
        ).stdout
        yield backend, json.loads(out.strip().splitlines()[-1])


def machine_cpu_seconds() -> float:
    """The CPU time every core of the machine has spent busy since boot (/proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    busy = sum(int(f) for f in fields) - int(fields[3]) - int(fields[4])  # less idle, iowait
    return busy / os.sysconf("SC_CLK_TCK")


def wait_for_exit(procs: list[subprocess.Popen[bytes]]) -> float:
    """Wait for each process to exit 0; returns the CPU seconds they used together."""
    used = 0.0
    for proc in procs:
        _, status, usage = os.wait4(proc.pid, 0)  # the exit status and the process's CPU time
        proc.returncode = os.waitstatus_to_exitcode(status)
        assert proc.returncode == 0, proc.args
        used += usage.ru_utime + usage.ru_stime
    return used
