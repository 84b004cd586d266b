"""runworker on PostgreSQL beside PgQueuer, Oban-py, Celery, Procrastinate and django-tasks-db,
measured in one run.

- no-op handler throughput: 1 process x 1 slot, 1 x 4, 2 x 4, and enqueue -> handler-start
  latency (one job every 10 ms on a fixed schedule; p50, p99, max), in ``--rounds`` alternating
  rounds with every peer (goal: ahead of PgQueuer, 2x every other peer); ``--queues-only``
  measures these rows alone;
- a 3-step no-op handler at 1 x 1: what a memoized step costs (goal: one round trip each);
- CPU of an idle worker over --idle-seconds (goal: < 1% of a core);
- worker RSS over --memory-jobs jobs (goal: growth < 10% after warm-up);
- replies/s through the Open API client against the local fake of Feishu (tests/support/fake_feishu.py)
  at 1 x 4, with ``feishu_inbox.reply`` (an idempotent effect) and with the bare client call:
  the difference is the effect's bookkeeping per reply.
- no-op django.tasks tasks through the ledger's backend beside django-tasks-db: enqueue rate
  (Task.enqueue() one at a time), processing rate (1 and 2 processes of one slot, as its
  db_worker), enqueue -> start latency (goal: >= 2x its processing rate, p50 < 10 ms against
  its 0.1 s-interval figure). ``--tasks-only`` measures this row alone.

The peers run from shared/peers (copied to /tmp, their own virtualenvs and database; Oban-py
needs a Python >= 3.12 on the machine, Celery the local Redis).

    .venv/bin/python bench/worker.py [--jobs 10000] [--rounds 1] [--queues-only]
                                     [--idle-seconds 30] [--memory-jobs 100000]
                                     [--replies 2000] [--peers DIR | --no-peers] [--tasks-only]
                                     [--peers-work DIR] [--against CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _setup import (
    ROOT,
    django_setup,
    fresh_postgres,
    machine_cpu_seconds,
    median,
    percentile,
    reproduce,
    truncate_ledger,
    wait_for_exit,
)


def worker_env(url: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": url,
        "FEISHU_INBOX_HANDLERS": "bench.bench_handlers",
        "LOG_LEVEL": "WARNING",
        **extra,
    }


def fill(
    n: int, partitions: int, event_type: str = "bench.noop", tenants: Sequence[str] = ("",)
) -> None:
    """Enqueue n jobs through the ledger's own enqueue, in one statement (set-up only):
    round-robin over ``tenants`` ("": none), each tenant's over its ``partitions //
    len(tenants)`` chats (at least one)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM (SELECT feishu_inbox_enqueue('default', 'n' || g || '-' || %(t)s,"
            " %(type)s, 'n' || g || '-' || %(t)s,"
            " concat_ws('-', 'chat', NULLIF(tenant, ''), (g / %(ts)s) %% %(chats)s), false,"
            " '{}'::jsonb, NULL::integer, '', tenant)"
            " FROM (SELECT g, (%(names)s::text[])[1 + g %% %(ts)s] AS tenant"
            " FROM generate_series(1, %(n)s) g) jobs) s",
            {
                "t": time.time(),
                "type": event_type,
                "names": list(tenants),
                "ts": len(tenants),
                "chats": max(1, partitions // len(tenants)),
                "n": n,
            },
        )
        cur.execute("ANALYZE")


def fill_messages(n: int, partitions: int, event_type: str) -> None:
    """Enqueue n message events (each with its own message id), in one statement."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM (SELECT feishu_inbox_enqueue('default', 'm' || g, %s, "
            "'m' || g, 'chat-' || (g %% %s), false, "
            "jsonb_build_object('event', jsonb_build_object('message', "
            "jsonb_build_object('message_id', 'om_' || g))), NULL::integer) "
            "FROM generate_series(1, %s) g) s",
            [event_type, partitions, n],
        )
        cur.execute("ANALYZE")


def throughput(
    url: str,
    procs: int,
    concurrency: int,
    n: int,
    event_type: str = "bench.noop",
    env: dict[str, str] | None = None,
    partitions: int = 1000,
    root: Path = ROOT,
    tenants: Sequence[str] = ("",),
) -> float:
    """Jobs/s over the database window from the first claim to the last finish (and, in
    COMMITS_PER_JOB, the database's commits per job over the run). ``root``: the checkout
    whose ``manage.py runworker`` runs (``--against``: another commit's). ``tenants``: whose
    jobs they are (``fill``)."""
    from django.db import connection

    truncate_ledger()
    wal_before_fill = wal_lsn()
    if event_type.startswith("bench.reply"):
        fill_messages(n, partitions, event_type)
    else:
        fill(n, partitions, event_type, tenants)
    wal_before_run = wal_lsn()
    commits_before = _commits()
    machine_before = machine_cpu_seconds()
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "runworker",
                "--burst",
                "--concurrency",
                str(concurrency),
                "-v",
                "0",
            ],
            cwd=root,
            env=worker_env(url, **(env or {})),
        )
        for _ in range(procs)
    ]
    worker_cpu = wait_for_exit(workers)
    machine_cpu = machine_cpu_seconds() - machine_before
    shape = f"{procs}x{concurrency}" + ("" if partitions > 1 else "_one_chat")
    if len(tenants) > 1:
        shape += f"_{len(tenants)}_tenants"
    COMMITS_PER_JOB[shape] = (_commits() - commits_before) / n
    WAL_PER_JOB[shape] = (
        wal_bytes(wal_before_fill, wal_before_run) / n,
        wal_bytes(wal_before_run) / n,
    )
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*), EXTRACT(EPOCH FROM max(finished_at) - min(claimed_at)) "
            "FROM feishu_inbox_eventjob WHERE status = 'completed'"
        )
        done, seconds = cur.fetchone()
    assert done == n, (done, n)
    # Where the cores went: the workers' own CPU, and the rest of the machine's (PostgreSQL's
    # backends, almost all of it), per job, over the run's whole wall time.
    CPU_PER_JOB[shape] = (
        1e6 * worker_cpu / n,
        1e6 * (machine_cpu - worker_cpu) / n,
    )
    return done / float(seconds)


#: Per shape ("1x4"), the last throughput run's CPU per job, in µs: (workers, rest of machine).
CPU_PER_JOB: dict[str, tuple[float, float]] = {}
#: Per shape, the last run's WAL bytes per job, the whole server's (nothing else runs): written
#: by the enqueue of the jobs, and by the workers' run (claims, finishes, history rows).
WAL_PER_JOB: dict[str, tuple[float, float]] = {}
#: Per shape, the last run's commits in the database per job (every session's: the workers'
#: heartbeats and renewals too, a few per second).
COMMITS_PER_JOB: dict[str, float] = {}


def wal_lsn() -> str:
    """The server's current WAL position (every database's: the peers' too)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn()::text")
        return str(cur.fetchone()[0])


def wal_bytes(since: str, until: str | None = None) -> float:
    """WAL bytes the server wrote from ``since`` to ``until`` (now)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_wal_lsn_diff(COALESCE(%s::pg_lsn, pg_current_wal_lsn()), %s::pg_lsn)",
            [until, since],
        )
        return float(cur.fetchone()[0])


def _commits() -> int:
    """The database's committed transactions so far (its sessions' counts are flushed when
    they end: the burst workers have ended when this is read after a run)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
        cur.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        return int(cur.fetchone()[0])


#: The ledger without Feishu's message limits (the app's 50/s, a chat's 5/s), to measure what an
#: effect's bookkeeping costs rather than the limit (tests/support/settings_json.py).
NO_LIMITS = {
    "DJANGO_SETTINGS_MODULE": "tests.support.settings_json",
    "FEISHU_INBOX_JSON": json.dumps(
        {"FEISHU_RATE_LIMITS": {"chat": None, "user": None, "app": None}}
    ),
}


def replies(url: str, n: int) -> dict[str, float]:
    """Replies/s at 1 x 4 through the client against the local fake: as idempotent effects
    (``feishu_inbox.reply``) and as bare client calls, without Feishu's message limits (the
    bookkeeping's cost), and as effects at the default limits (``n // 4`` of them: the app's
    50/s bounds them); every reply created once."""
    from tests.support.fake_feishu import FakeFeishu

    limited_n = max(n // 4, 1)
    with FakeFeishu(apps={"cli_bench": "bench-secret"}) as fake:
        env = {"FEISHU_APP_ID": "cli_bench", "FEISHU_APP_SECRET": "bench-secret"}
        env["FEISHU_DOMAIN"] = fake.url
        effect = throughput(url, 1, 4, n, "bench.reply", {**env, **NO_LIMITS})
        raw = throughput(url, 1, 4, n, "bench.reply_raw", env)
        effect_c1 = throughput(url, 1, 1, n, "bench.reply", {**env, **NO_LIMITS})
        raw_c1 = throughput(url, 1, 1, n, "bench.reply_raw", env)
        limited = throughput(url, 1, 4, limited_n, "bench.reply", env)
        counts = fake.counts()
    assert counts["messages"] == 4 * n + limited_n and counts.get("duplicate", 0) == 0, counts
    return {
        "limited_per_s": limited,
        "replies_per_s": effect,
        "raw_per_s": raw,
        "replies_per_s_c1": effect_c1,
        "raw_per_s_c1": raw_c1,
        # One slot: what the effect adds to each reply's time (its two fenced statements).
        "overhead_ms": 1000 / effect_c1 - 1000 / raw_c1,
        "token_requests": counts["token_requests"],
    }


def start_idle_worker(url: str, **env: str) -> subprocess.Popen[bytes]:
    return start_workers(url, 1, 1, **env)[0]


def start_workers(
    url: str, procs: int, concurrency: int, settle: float = 0.0, **env: str
) -> list[subprocess.Popen[bytes]]:
    """``procs`` long-running ``runworker`` processes of ``concurrency`` slots, started
    together; returns once each has logged its start-up line, and ``settle`` seconds more
    (into their idle sleep). ``env``: their own settings."""
    logs = Path(tempfile.mkdtemp(prefix="benchworker-"))
    workers = []
    for k in range(procs):
        with open(logs / f"worker{k}.log", "wb") as err:  # a file: nobody has to keep reading it
            workers.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "manage.py",
                        "runworker",
                        "--concurrency",
                        str(concurrency),
                        "-v",
                        "1",
                    ],
                    cwd=ROOT,
                    env=worker_env(url, LOG_LEVEL="INFO", **env),
                    stderr=err,
                )
            )
    deadline = time.monotonic() + 60
    for k, proc in enumerate(workers):
        log = logs / f"worker{k}.log"
        while b"started" not in log.read_bytes():  # its start-up line
            if time.monotonic() > deadline or proc.poll() is not None:
                stop(workers)
                raise SystemExit(f"the worker did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)
    time.sleep(settle)
    return workers


def stop(workers: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM (a graceful drain), then wait; killed if one is still there a minute later."""
    for proc in workers:
        proc.terminate()
    for proc in workers:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def latency(url: str, n: int, gap: float, **env: str) -> tuple[float, float, float]:
    """Enqueue -> handler start (p50, p99, max ms) with an idle worker: one job every ``gap``
    seconds on a fixed schedule, whatever each enqueue takes (as the peers' probes do).
    ``env``: the worker's own settings (bench/pgbouncer.py: behind PgBouncer)."""
    from feishu_inbox import ledger

    out = Path(tempfile.mkdtemp()) / "latency.txt"
    proc = start_idle_worker(url, BENCH_LATENCY_FILE=str(out), **env)
    try:
        time.sleep(1.0)  # let the worker settle into its idle sleep (this is what we measure)
        start = time.monotonic()
        for i in range(n):
            t0 = time.time()
            ledger.enqueue(
                event_id=f"lat-{i}-{t0}",
                event_type="bench.latency",
                partition_key=f"lat-{i}",
                payload={"t0": t0},
            )
            # the arrivals' schedule, not synchronisation: job i+1 is due at start + (i+1) gaps
            time.sleep(max(0.0, start + (i + 1) * gap - time.monotonic()))
        deadline = time.monotonic() + 60
        while (not out.exists() or len(out.read_text().splitlines()) < n) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)  # waiting for the handlers to record, bounded
    finally:
        proc.terminate()
        proc.wait(30)
    lat = [
        (float(b) - float(a)) * 1000
        for a, b in (line.split() for line in out.read_text().splitlines())
    ]
    return percentile(lat, 50), percentile(lat, 99), max(lat)


TASK_PAYLOAD = (
    '{"args": [], "kwargs": {}, "backend": "default", "queue_name": "default", "priority": 0,'
    ' "run_after": null, "takes_context": false, "ordering_key": null}'
)


def fill_tasks(n: int) -> None:
    """n no-op tasks as LedgerBackend.enqueue stores them (each its own partition), in one
    statement through the ledger's enqueue function (set-up only, as the peer's bulk fill)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM (SELECT feishu_inbox_enqueue('django.tasks', id, "
            "'task:bench.bench_tasks.noop', id, 'task:default:~' || id, false, %s::jsonb, 1) "
            "FROM (SELECT md5(random()::text || g) AS id FROM generate_series(1, %s) g) ids) s",
            [TASK_PAYLOAD, n],
        )
        cur.execute("ANALYZE")


def tasks_row(url: str, n: int) -> dict[str, float]:
    """The ledger as a django.tasks backend: enqueue/s, tasks/s at 1 and 2 processes of one
    slot, enqueue -> start p50/p99 ms with an idle worker woken by NOTIFY."""
    from django.db import connection

    from bench import bench_tasks

    truncate_ledger()
    calls = 2000
    t0 = time.perf_counter()
    for _ in range(calls):
        bench_tasks.noop.enqueue()
    row = {"enqueue": calls / (time.perf_counter() - t0)}
    for label, procs in (("c1", 1), ("2x1", 2)):
        truncate_ledger()
        fill_tasks(n)
        workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "manage.py",
                    "runworker",
                    "--burst",
                    "--concurrency",
                    "1",
                    "-v",
                    "0",
                ],
                cwd=ROOT,
                env=worker_env(url),
            )
            for _ in range(procs)
        ]
        for w in workers:
            assert w.wait(600) == 0
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*), EXTRACT(EPOCH FROM max(finished_at) - min(claimed_at)) "
                "FROM feishu_inbox_eventjob WHERE status = 'completed' AND app = 'django.tasks'"
            )
            done, seconds = cur.fetchone()
        assert done == n, (done, n)
        row[label] = done / float(seconds)
    truncate_ledger()
    out = Path(tempfile.mkdtemp()) / "task-latency.txt"
    proc = start_idle_worker(url, BENCH_LATENCY_FILE=str(out))
    count = 200
    try:
        time.sleep(1.0)  # let the worker settle into its idle sleep (this is what we measure)
        for _ in range(count):
            bench_tasks.latency.enqueue(time.time())
            time.sleep(0.01)  # pacing the arrivals, as the peer's latency run does
        deadline = time.monotonic() + 60
        while (not out.exists() or len(out.read_text().splitlines()) < count) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)  # waiting for the tasks to record, bounded
    finally:
        proc.terminate()
        proc.wait(30)
    lat = [
        (float(b) - float(a)) * 1000
        for a, b in (line.split() for line in out.read_text().splitlines())
    ]
    row["p50_ms"], row["p99_ms"] = percentile(lat, 50), percentile(lat, 99)
    return row


def print_tasks_row(ours: dict[str, float], theirs: dict[str, float], n: int) -> None:
    def cell(key: str, fmt: str = ",.0f") -> str:
        value = theirs.get(key)
        return "-" if value is None else format(value, fmt)

    ratio = ours["c1"] / theirs["c1"] if theirs.get("c1") else None
    print(f"\nno-op django.tasks tasks on PostgreSQL ({n:,})   LedgerBackend   django-tasks-db")
    print(
        f"  enqueue() calls/s, one at a time       {ours['enqueue']:13,.0f}   {cell('enqueue'):>15}"
    )
    print(f"  tasks/s, 1 process x 1 slot            {ours['c1']:13,.0f}   {cell('c1'):>15}")
    print(f"  tasks/s, 2 processes x 1 slot          {ours['2x1']:13,.0f}   {cell('2x1'):>15}")
    print(
        f"  enqueue -> start p50 / p99 ms          {ours['p50_ms']:5.1f} / {ours['p99_ms']:5.1f}   "
        f"{cell('p50_ms', '.1f'):>5} / {cell('p99_ms', '.1f'):>5} (interval 0.1 s)"
    )
    if ratio is not None:
        print(f"  processing rate, ratio of the figures (1 process): {ratio:.2f}x (goal >= 2x)")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(url: str, seconds: float) -> float:
    proc = start_idle_worker(url)
    try:
        time.sleep(2.0)  # past start-up
        before, t0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(seconds)  # measuring an idle process: it must do nothing meanwhile
        used = cpu_seconds(proc.pid) - before
        return 100 * used / (time.monotonic() - t0)
    finally:
        proc.terminate()
        proc.wait(30)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def memory(url: str, jobs: int) -> tuple[int, int, float]:
    from django.db import connection

    truncate_ledger()
    fill(jobs, 1000)
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runworker", "--burst", "--concurrency", "4", "-v", "0"],
        cwd=ROOT,
        env=worker_env(url),
    )
    warm = None
    last = 0
    warm_at = max(jobs // 10, 1)
    with connection.cursor() as cur:
        while proc.poll() is None:
            cur.execute("SELECT count(*) FROM feishu_inbox_eventjob WHERE status = 'completed'")
            done = cur.fetchone()[0]
            try:
                rss = rss_kib(proc.pid)
            except (FileNotFoundError, ProcessLookupError):
                break
            if warm is None and done >= warm_at:
                warm = rss
            if done < jobs:
                last = rss
            time.sleep(0.5)  # sampling interval
    assert proc.wait(600) == 0
    warm = warm or last
    return warm, last, 100 * (last - warm) / warm


#: Every peer of the no-op rows, in the order of the table's columns.
PEER_NAMES = ("pgqueuer", "oban", "celery", "procrastinate", "django-tasks-db")

#: The peers with a virtualenv of their own in the peers' folder: its directory, the
#: interpreter that makes it (Oban-py needs Python >= 3.12) and what it installs.
QUEUE_PEERS: dict[str, tuple[str, tuple[str, ...], list[str]]] = {
    "pgqueuer": (".venv-pgqueuer", ("python3",), ["pgqueuer[asyncpg,psycopg]==1.6.0", "uvloop"]),
    "oban": (".venv-oban", ("python3.13", "python3.12"), ["oban==0.7.0", "uvloop", "psycopg"]),
    "celery": (".venv-celery", ("python3",), ["celery[redis]==5.7.0"]),
}


def peer_run(command: list[str], work: Path, env: dict[str, str]) -> dict[str, Any]:
    """One sub-command of a peer's harness; the JSON object it prints last."""
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=work, timeout=900, env=env, check=False
    )
    if done.returncode:
        raise RuntimeError(f"{' '.join(command[1:3])} failed: {done.stderr.strip()[-500:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _interpreters(names: tuple[str, ...]) -> list[str]:
    """The interpreters of those names on PATH, then pyenv's own builds of them (a pyenv shim
    of a version that is not active fails to run)."""
    found = [p for p in (shutil.which(n) for n in names) if p]
    for name in names:
        version = name.removeprefix("python")
        found += sorted(str(p) for p in Path.home().glob(f".pyenv/versions/{version}*/bin/python3"))
    return found


def _runs(interpreter: str) -> bool:
    done = subprocess.run([interpreter, "-c", "import venv"], capture_output=True, check=False)
    return done.returncode == 0


def queue_peer(
    work: Path,
    name: str,
    n: int,
    env: dict[str, str],
    shapes: tuple[str, ...] = ("c1", "c4", "2x4"),
    latency: bool = True,
) -> dict[str, float]:
    """PgQueuer, Oban-py or Celery through its harness in ``work``: no-op jobs/s at ``shapes``
    (of 1 x 1, 1 x 4 and 2 x 4), and enqueue -> start latency (one job every 10 ms); each run
    checked to have run every job exactly once. PgQueuer's documented defaults have no slot
    count (a fetched batch of 10 runs at once): its 1 x 1 and 1 x 4 are one measurement of one
    process."""
    venv, interpreters, packages = QUEUE_PEERS[name]
    py = work / venv / "bin" / "python"
    if not py.exists():
        found = next((c for c in _interpreters(interpreters) if _runs(c)), None)
        if found is None:
            raise RuntimeError(f"needs one of {', '.join(interpreters)} (none runs here)")
        subprocess.run([found, "-m", "venv", str(work / venv)], check=True)
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", *packages],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    script = str(work / f"{name}_bench" / "bench.py")

    def run(*args: str) -> dict[str, Any]:
        return peer_run([str(py), script, *args], work, env)

    def once(result: dict[str, Any]) -> float:
        if not result.get("exactly_once", False):
            raise RuntimeError(f"a run did not run every job exactly once: {result}")
        return float(result["jobs_per_s"])

    extra = ["--config", "reliable"] if name == "celery" else []  # acks_late, prefetch 1
    res: dict[str, float] = {}
    sizes = {"c1": ("1", "1"), "c4": ("1", "4"), "2x4": ("2", "4")}
    for label in shapes:
        procs, concurrency = sizes[label]
        if name == "pgqueuer" and label == "c4":
            continue  # the 1 x 1 run's figure (set below)
        run("reset")
        wal_before_fill = wal_lsn()
        run("fill", "--n", str(n))
        wal_before_run = wal_lsn()
        slots = [] if name == "pgqueuer" else ["--concurrency", concurrency]
        result = run("work", "--procs", procs, *slots, *extra)
        res[label] = once(result)
        # The same figures as ours (WAL_PER_JOB, CPU_PER_JOB): the server's WAL per job for
        # the enqueue and for the run, and the CPU per job of all but the peer's processes.
        res[f"wal_fill_{label}"] = wal_bytes(wal_before_fill, wal_before_run) / n
        res[f"wal_run_{label}"] = wal_bytes(wal_before_run) / n
        if "cpu_ms_per_job_other" in result:
            res[f"rest_cpu_us_{label}"] = 1000 * float(result["cpu_ms_per_job_other"])
    if name == "pgqueuer" and "c1" in res:
        res["c4"] = res["c1"]
        for key in ("wal_fill", "wal_run", "rest_cpu_us"):
            if f"{key}_c1" in res:
                res[f"{key}_c4"] = res[f"{key}_c1"]
    if latency:
        run("reset")
        lat_args = ["--n", "500", "--gap", "0.01"]
        lat = run(
            "latency", *lat_args, *([] if name == "pgqueuer" else ["--concurrency", "1"]), *extra
        )
        res.update(p50_ms=lat["p50_ms"], p99_ms=lat["p99_ms"], max_ms=lat["max_ms"])
    return res


def peers_env(directory: Path, work: Path) -> dict[str, str]:
    """The shared peer scripts copied to ``work`` and set up (once); the environment they run
    in: they configure themselves from their own settings, none of ours may leak in."""
    if not (work / ".venv").exists():
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(directory, work, ignore=shutil.ignore_patterns("results", ".venv"))
        (work / "results").mkdir(exist_ok=True)
        for script in work.rglob("*.sh"):
            script.chmod(0o755)
        subprocess.run(
            ["bash", str(work / "setup.sh")], check=True, cwd=work, stdout=subprocess.DEVNULL
        )
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "FEISHU_INBOX_HANDLERS")
    }


def peers(
    directory: Path,
    n: int,
    work: Path,
    only_djtasks: bool = False,
    skip: tuple[str, ...] = (),
) -> dict[str, dict[str, float]]:
    """Run the shared peer scripts (copied to ``work``), but the queue peers in ``skip``
    (measured beside ours instead); returns their figures."""
    env = peers_env(directory, work)
    py = str(work / ".venv" / "bin" / "python")

    def run(*args: str) -> dict[str, Any]:
        return peer_run([py, *args], work, env)

    p, d = str(work / "procrastinate_bench" / "bench.py"), str(work / "djtasks" / "bench.py")
    res: dict[str, dict[str, float]] = {name: {} for name in PEER_NAMES if name not in skip}
    try:  # each peer on its own: one failing must not lose the other's figures
        if only_djtasks:
            raise RuntimeError("skipped (--tasks-only)")
        for label, args in (
            ("c1", ["work", "--concurrency", "1"]),
            ("c4", ["work", "--concurrency", "4"]),
            ("2x4", ["work-procs", "--procs", "2", "--concurrency", "4"]),
        ):
            run(p, "reset")
            run(p, "enqueue", "--n", str(n), "--mode", "batch")
            res["procrastinate"][label] = run(p, *args)["jobs_per_s"]
        run(p, "reset")
        lat = run(p, "latency", "--n", "500", "--gap", "0.01")
        res["procrastinate"]["p50_ms"] = lat["p50_ms"]
        res["procrastinate"]["p99_ms"] = lat["p99_ms"]
    except (RuntimeError, subprocess.SubprocessError) as exc:
        print(f"procrastinate not measured: {exc}")
    try:
        run(d, "reset")
        res["django-tasks-db"]["enqueue"] = run(d, "enqueue", "--n", "2000")["jobs_per_s"]
        for label, procs in (("c1", "1"), ("2x1", "2")):
            run(d, "reset")
            run(d, "fill", "--n", str(n))
            res["django-tasks-db"][label] = run(d, "work", "--procs", procs)["jobs_per_s"]
        run(d, "reset")
        lat = run(d, "latency", "--n", "200", "--gap", "0.01", "--interval", "0.1")
        res["django-tasks-db"]["p50_ms"] = lat["p50_ms"]
        res["django-tasks-db"]["p99_ms"] = lat["p99_ms"]
    except (RuntimeError, subprocess.SubprocessError) as exc:
        print(f"django-tasks-db not measured: {exc}")
    if not only_djtasks:
        for name in (name for name in QUEUE_PEERS if name not in skip):
            try:
                res[name] = queue_peer(work, name, n, env)
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                print(f"{name} not measured: {exc}")
    return res


def against(url: str, other: Path, n: int, rounds: int) -> None:
    """This checkout's worker beside another's (the code before a change), shape by shape:
    1 x 1, 1 x 4 and 2 x 4, each round running the two back to back (this one first in odd
    rounds, the other first in even ones), so a machine whose speed swings weighs on both."""
    trees = {"this": ROOT, "other": other}
    print(f"this checkout: {ROOT}\nthe other:     {other}")
    shapes = [("1x1", 1, 1), ("1x4", 1, 4), ("2x4", 2, 4)]
    for _label, procs, slots in shapes:  # each tree's first runs pay their one-off costs
        for root in trees.values():
            throughput(url, procs, slots, min(n, 2000), root=root)
    figures: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in shapes}
    for number in range(1, rounds + 1):
        order = ["this", "other"] if number % 2 else ["other", "this"]
        for label, procs, slots in shapes:
            got = {name: throughput(url, procs, slots, n, root=trees[name]) for name in order}
            figures[label].append((got["this"], got["other"]))
        print(json.dumps({"round": number, **{k: v[-1] for k, v in figures.items()}}))
    print(f"\nno-op jobs/s on PostgreSQL, this checkout / the other ({n:,} jobs, {rounds} rounds)")
    for label, runs in figures.items():
        cells = ", ".join(f"{a:,.0f} / {b:,.0f} ({a / b:.2f})" for a, b in runs)
        ratio = median([a / b for a, b in runs])
        print(f"  {label}: {cells}; median ratio {ratio:.2f}")
    print(f"reproduce: {reproduce()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--idle-seconds", type=float, default=30)
    parser.add_argument("--memory-jobs", type=int, default=100_000)
    parser.add_argument("--replies", type=int, default=2_000)
    parser.add_argument(
        "--database", default="fi_bench_worker", help="the database to (re)create for the run"
    )
    parser.add_argument("--peers", type=Path, default=ROOT.parent / "shared" / "peers")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument(
        "--queues-only", action="store_true", help="only the no-op rows beside the peers"
    )
    parser.add_argument("--tasks-only", action="store_true", help="only the django.tasks row")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds (medians)")
    parser.add_argument(
        "--tenants",
        type=int,
        nargs="*",
        default=[10, 1000],
        help="the no-op rows at 1 x 4 and 2 x 4 with the jobs shared by this many tenants too "
        "(the fair claim), beside one tenant's (the plain claim); none: --tenants",
    )
    parser.add_argument(
        "--against",
        type=Path,
        metavar="CHECKOUT",
        help="measure the no-op shapes of this code beside those of another checkout (a git "
        "worktree of an earlier commit), in alternating rounds, and nothing else",
    )
    parser.add_argument(
        "--peers-work",
        type=Path,
        default=Path("/tmp/feishu-inbox-peers"),
        help="where the peers are copied and set up (PGDATABASE chooses their database)",
    )
    args = parser.parse_args()

    url = fresh_postgres("fi_bench_tasks" if args.tasks_only else args.database)
    django_setup(url)
    if args.against:
        against(url, args.against.resolve(), args.jobs, args.rounds)
        return
    if args.tasks_only:
        # Rounds alternate ours and the peer's, so a machine whose load changes meanwhile
        # weighs on both; each figure is the median of the rounds, each ratio the median of
        # the rounds' ratios.
        task_rounds: list[tuple[dict[str, float], dict[str, float]]] = []
        for _ in range(args.rounds):
            tasks = tasks_row(url, args.jobs)
            their_tasks = (
                {} if args.no_peers else peers(args.peers, args.jobs, args.peers_work, True)
            )
            task_rounds.append((tasks, their_tasks.get("django-tasks-db", {})))
            print(
                json.dumps(
                    {
                        "round": len(task_rounds),
                        "tasks": tasks,
                        "django-tasks-db": task_rounds[-1][1],
                    }
                )
            )
        ours_m = {k: median([r[0][k] for r in task_rounds]) for k in task_rounds[0][0]}
        theirs_m = {
            k: median([r[1][k] for r in task_rounds if k in r[1]])
            for k in task_rounds[0][1]
            if task_rounds[0][1]
        }
        print_tasks_row(ours_m, theirs_m, args.jobs)
        ratios = [r[0]["c1"] / r[1]["c1"] for r in task_rounds if r[1].get("c1")]
        if ratios:
            print(
                f"  per-round processing ratios: {', '.join(f'{x:.2f}' for x in ratios)}; "
                f"median {median(ratios):.2f}x ({args.rounds} task_rounds)"
            )
        print(json.dumps({"tasks": ours_m, "django-tasks-db": theirs_m, "ratios": ratios}))
        print(f"reproduce: {reproduce()}")
        return
    # Rounds alternate ours and the peers (ours first in odd rounds, last in even ones), so a
    # machine whose speed changes meanwhile weighs on both; each figure printed is the median
    # of the rounds, each ratio the median of the rounds' ratios. PgQueuer, the peer to lead,
    # runs right beside our runs of the same shape (its one process just before our 1 x 1 and
    # its two just after our 2 x 4 in odd rounds, the other way round in even ones): this
    # machine's speed swings within minutes, and the other peers' runs take several.
    rounds: list[tuple[dict[str, float], dict[str, dict[str, float]]]] = []
    # Our database was created for this run (the peers' has served many): a first run of each
    # shape, not counted, pays its one-off costs (the new database's first statements, the
    # migrated catalog's first reads, a server whose caches are cold) so that round 1
    # measures what the rounds after it measure.
    for procs, slots in ((1, 1), (1, 4), (2, 4)):
        throughput(url, procs, slots, min(args.jobs, 2000))
    peer_env = {} if args.no_peers else peers_env(args.peers, args.peers_work)

    def pgqueuer(into: dict[str, dict[str, float]], *shapes: str, latency: bool = False) -> None:
        if args.no_peers:
            return
        try:
            got = queue_peer(args.peers_work, "pgqueuer", args.jobs, peer_env, shapes, latency)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            print(f"pgqueuer {shapes or 'latency'} not measured: {exc}")
            return
        into.setdefault("pgqueuer", {}).update(got)

    for number in range(1, args.rounds + 1):
        odd = number % 2 == 1
        their_round: dict[str, dict[str, float]] = {}
        if not odd and not args.no_peers:
            their_round = peers(args.peers, args.jobs, args.peers_work, skip=("pgqueuer",))
        # Beside our own runs: PgQueuer's latency (after ours in odd rounds, before in even)
        # and its throughput shapes.
        if not odd:
            pgqueuer(their_round, latency=True)
        shapes = [("c1", 1, 1), ("c4", 1, 4), ("2x4", 2, 4)]
        pgqueuer(their_round, "c1" if odd else "2x4")
        mine = {
            label: throughput(url, procs, slots, args.jobs)
            for label, procs, slots in (shapes if odd else shapes[::-1])
        }
        pgqueuer(their_round, "2x4" if odd else "c1")
        # One busy chat: its jobs are serial by definition, one commit each.
        mine["one_chat"] = throughput(url, 1, 4, min(args.jobs, 2000), partitions=1)
        # The fair claim beside the plain one (docs/tenants.md): the same jobs over the same
        # 1,000 chats, shared round-robin by 10 and by 1,000 tenants (1,000: one chat each).
        for count in args.tenants:
            for label, procs, slots in shapes[1:]:
                mine[f"{label}_{count}_tenants"] = throughput(
                    url, procs, slots, args.jobs, tenants=[f"t{i}" for i in range(count)]
                )
        for shape, (fill_bytes, run_bytes) in WAL_PER_JOB.items():
            mine[f"wal_fill_{shape}"], mine[f"wal_run_{shape}"] = fill_bytes, run_bytes
        for shape, (workers_us, rest_us) in CPU_PER_JOB.items():
            mine[f"cpu_us_{shape}"], mine[f"rest_cpu_us_{shape}"] = workers_us, rest_us
        for shape, commits in COMMITS_PER_JOB.items():
            mine[f"commits_{shape}"] = commits
        mine["p50_ms"], mine["p99_ms"], mine["max_ms"] = latency(url, 500, 0.01)
        if odd and not args.no_peers:
            pgqueuer(their_round, latency=True)
            their_round.update(peers(args.peers, args.jobs, args.peers_work, skip=("pgqueuer",)))
        rounds.append((mine, their_round))
        print(json.dumps({"round": number, "feishu_inbox": mine, "peers": their_round}))
    ours = {k: median([r[0][k] for r in rounds]) for k in rounds[0][0]}
    their: dict[str, dict[str, float]] = {}
    for name in PEER_NAMES:
        keys = {k for r in rounds for k in r[1].get(name, {})}
        values = {k: [r[1][name][k] for r in rounds if k in r[1].get(name, {})] for k in keys}
        their[name] = {k: median(v) for k, v in values.items() if v}
    if not args.queues_only:
        ours["steps_c1"] = throughput(url, 1, 1, args.jobs, "bench.steps")
        sent = replies(url, args.replies) if args.replies else {}
        idle = idle_cpu(url, args.idle_seconds)
        warm, end, growth = memory(url, args.memory_jobs) if args.memory_jobs else (0, 0, 0.0)

    def cell(name: str, key: str) -> str:
        value = their.get(name, {}).get(key)
        return "-" if value is None else f"{value:,.0f}" if "ms" not in key else f"{value:.1f}"

    names = ["feishu_inbox", *PEER_NAMES]
    print(f"\nno-op jobs/s on PostgreSQL ({args.jobs:,} jobs; medians of {args.rounds} round(s))")
    print(f"  {'':24}" + "".join(f"{n:>16}" for n in names))
    rows = [
        ("1 process x 1 slot", "c1"),
        ("1 process x 4 slots", "c4"),
        ("2 processes x 4 slots", "2x4"),
        ("latency p50 ms", "p50_ms"),
        ("latency p99 ms", "p99_ms"),
        ("latency max ms", "max_ms"),
    ]

    def their_key(name: str, key: str) -> str | None:
        """django-tasks-db's db_worker runs one job at a time per process: no 1 x 4, and its
        2 x 4 cell is 2 x 1."""
        return {"c4": None, "2x4": "2x1"}.get(key, key) if name == "django-tasks-db" else key

    for label, key in rows:
        mine_cell = f"{ours[key]:,.0f}" if "ms" not in key else f"{ours[key]:.1f}"
        cells = [mine_cell]
        for name in PEER_NAMES:
            k = their_key(name, key)
            cells.append("(no option)" if k is None else cell(name, k))
        print(f"  {label:24}" + "".join(f"{c:>16}" for c in cells))
    print(
        "  (PgQueuer at its defaults: 10 jobs per fetch, no slot count: 1 x 1 and 1 x 4 are one "
        "run; Celery with acks_late and prefetch 1 on Redis, which keeps nothing on disk; "
        "django-tasks-db's 2 x 4 cell is 2 processes x 1, its latency at a 0.1 s interval)"
    )
    for name in PEER_NAMES:
        parts = []
        for _, key in rows[:5]:
            k = their_key(name, key)
            per = [
                r[0][key] / r[1][name][k]
                for r in rounds
                if k is not None and r[1].get(name, {}).get(k)
            ]
            if per:
                parts.append(
                    f"{key} {' / '.join(f'{x:.2f}' for x in per)} (median {median(per):.2f})"
                )
        if parts:
            print(f"  feishu_inbox / {name}, per round: " + "; ".join(parts))
    print("  (jobs/s ratios above 1: feishu_inbox did more; latency ratios below 1: it was faster)")
    print(
        "  CPU per job, the workers' / the rest of the machine's (PostgreSQL): "
        + "; ".join(
            f"{shape} {ours[f'cpu_us_{shape}']:.0f} / {ours[f'rest_cpu_us_{shape}']:.0f} µs"
            for shape in ("1x1", "1x4", "2x4")
            if f"cpu_us_{shape}" in ours
        )
        + f" (2 cores: {2e6 / ours['2x4']:.0f} µs of core time per job at 2 x 4)"
    )
    pgq = their.get("pgqueuer", {})

    def beside(key: str, label: str, fmt: str) -> str:
        shape = {"c1": "1x1", "c4": "1x4"}.get(label, label)  # ours by shape, the peers' by label
        mine_value, theirs_value = ours.get(f"{key}_{shape}"), pgq.get(f"{key}_{label}")
        if mine_value is None:
            return ""
        text = f"{shape} {mine_value:{fmt}}"
        if theirs_value:
            text += f" / PgQueuer {theirs_value:{fmt}} ({mine_value / theirs_value:.2f})"
        return text

    for title, key in (
        ("WAL bytes per job written by the enqueue", "wal_fill"),
        ("WAL bytes per job written by the run (claims, finishes)", "wal_run"),
        ("PostgreSQL's CPU per job, µs (the machine's but the workers')", "rest_cpu_us"),
    ):
        cells = [beside(key, shape, ",.0f") for shape in ("c1", "2x4")]
        print(f"  {title}: " + "; ".join(c for c in cells if c))
    if args.tenants:
        print("  fair claims (no-op jobs/s over the same 1,000 chats; ratio to one tenant's):")
        for count in args.tenants:
            row: list[str] = []
            for label in ("c4", "2x4"):
                ratios = [
                    r[0][f"{label}_{count}_tenants"] / r[0][label]
                    for r in rounds
                    if f"{label}_{count}_tenants" in r[0]
                ]
                if ratios:
                    row.append(
                        f"{label} {ours[f'{label}_{count}_tenants']:,.0f} "
                        f"({' / '.join(f'{x:.2f}' for x in ratios)})"
                    )
            print(f"    {count:>5} tenants: " + "; ".join(row))
    print(
        "  commits per job in the database (every session's): "
        + "; ".join(
            f"{shape} {ours[f'commits_{shape}']:.2f}"
            for shape in ("1x1", "1x4", "2x4")
            if f"commits_{shape}" in ours
        )
        + f"; one chat at 1 x 4 ({ours['one_chat']:,.0f} jobs/s): "
        + f"{ours.get('commits_1x4_one_chat', float('nan')):.2f}"
    )
    if args.queues_only:
        print(json.dumps({"feishu_inbox": ours, "peers": their, "rounds": rounds}))
        print(f"reproduce: {reproduce()}")
        return
    per_step_ms = (1000 / ours["steps_c1"] - 1000 / ours["c1"]) / 3
    # A step commits on its own (its record is the memo); a no-op job's finish goes in a batch,
    # so the round trip to compare with is a busy chat's job: one statement, one commit.
    round_trip_ms = 1000 / ours["one_chat"]
    print(
        f"3-step no-op handler, 1 process x 1 slot: {ours['steps_c1']:,.0f} jobs/s; each step adds "
        f"{per_step_ms:.2f} ms, a committed round trip (a busy chat's job: one statement, one "
        f"commit) takes {round_trip_ms:.2f} ms: a step costs {per_step_ms / round_trip_ms:.2f} "
        f"of it (goal: one round trip each, at most)"
    )
    tasks = tasks_row(url, args.jobs)
    print_tasks_row(tasks, their.get("django-tasks-db", {}), args.jobs)
    if sent:
        print(
            f"replies/s through the client against the local fake: 1 x 4 slots "
            f"{sent['replies_per_s']:,.0f} as idempotent effects ({sent['raw_per_s']:,.0f} as bare "
            f"client calls), 1 x 1 {sent['replies_per_s_c1']:,.0f} ({sent['raw_per_s_c1']:,.0f}): "
            f"the effect's bookkeeping (two fenced statements) adds {sent['overhead_ms']:.2f} ms "
            f"per reply (Feishu's message limits off); at the default limits "
            f"{sent['limited_per_s']:,.0f} replies/s at 1 x 4 (the app's 50/s); "
            f"{sent['token_requests']} token request(s) for "
            f"{4 * args.replies + max(args.replies // 4, 1):,} replies"
        )
    print(f"idle worker CPU over {args.idle_seconds:.0f} s: {idle:.2f}% of a core (goal < 1%)")
    if args.memory_jobs:
        print(
            f"worker RSS over {args.memory_jobs:,} jobs: {warm / 1024:.1f} MiB after warm-up, "
            f"{end / 1024:.1f} MiB at the end: growth {growth:+.1f}% (goal < 10%)"
        )
    print(
        json.dumps(
            {
                "feishu_inbox": ours,
                "replies": sent,
                "tasks": tasks,
                "peers": their,
                "idle_cpu_percent": idle,
                "rss_warm_kib": warm,
                "rss_end_kib": end,
                "rss_growth_percent": growth,
            }
        )
    )
    print(f"reproduce: {reproduce()}")


if __name__ == "__main__":
    main()
