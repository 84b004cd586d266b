"""runworker on PostgreSQL beside Procrastinate and django-tasks-db, measured in one run.

- no-op handler throughput: 1 process x 1 slot, 1 x 4, 2 x 4 (goal: ahead of both peers);
- a 3-step no-op handler at 1 x 1: what a memoized step costs (goal: one round trip each);
- enqueue -> handler-start latency with an idle worker woken by NOTIFY (goal: p50 < 10 ms);
- CPU of an idle worker over --idle-seconds (goal: < 1% of a core);
- worker RSS over --memory-jobs jobs (goal: growth < 10% after warm-up);
- replies/s through the Open API client against the local fake of Feishu (tests/support/fake_feishu.py)
  at 1 x 4, with ``feishu_inbox.reply`` (an idempotent effect) and with the bare client call:
  the difference is the effect's bookkeeping per reply.
- no-op django.tasks tasks through the ledger's backend beside django-tasks-db: enqueue rate
  (Task.enqueue() one at a time), processing rate (1 and 2 processes of one slot, as its
  db_worker), enqueue -> start latency (goal: >= 2x its processing rate, p50 < 10 ms against
  its 0.1 s-interval figure). ``--tasks-only`` measures this row alone.

The peers run from shared/peers (copied to /tmp, their own virtualenv and database).

    .venv/bin/python bench/worker.py [--jobs 10000] [--idle-seconds 30] [--memory-jobs 100000]
                                     [--replies 2000] [--peers DIR | --no-peers] [--tasks-only]
                                     [--peers-work DIR]
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
from pathlib import Path

from _setup import (
    ROOT,
    django_setup,
    fresh_postgres,
    median,
    percentile,
    reproduce,
    truncate_ledger,
)


def worker_env(url: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": url,
        "FEISHU_INBOX_HANDLERS": "bench.bench_handlers",
        "LOG_LEVEL": "WARNING",
        **extra,
    }


def fill(n: int, partitions: int, event_type: str = "bench.noop") -> None:
    """Enqueue n jobs through the ledger's own enqueue, in one statement (set-up only)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM (SELECT feishu_inbox_enqueue('default', 'n' || g || '-' || %s,"
            " %s, 'n' || g || '-' || %s, 'chat-' || (g %% %s), false, '{}'::jsonb, NULL::integer)"
            " FROM generate_series(1, %s) g) s",
            [time.time(), event_type, time.time(), partitions, n],
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
) -> float:
    """Jobs/s over the database window from the first claim to the last finish."""
    from django.db import connection

    truncate_ledger()
    if event_type.startswith("bench.reply"):
        fill_messages(n, 1000, event_type)
    else:
        fill(n, 1000, event_type)
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
            cwd=ROOT,
            env=worker_env(url, **(env or {})),
        )
        for _ in range(procs)
    ]
    for w in workers:
        assert w.wait(600) == 0
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*), EXTRACT(EPOCH FROM max(finished_at) - min(claimed_at)) "
            "FROM feishu_inbox_eventjob WHERE status = 'completed'"
        )
        done, seconds = cur.fetchone()
    assert done == n, (done, n)
    return done / float(seconds)


def replies(url: str, n: int) -> dict[str, float]:
    """Replies/s at 1 x 4 through the client against the local fake: as idempotent effects
    (``feishu_inbox.reply``) and as bare client calls; every reply created once."""
    from tests.support.fake_feishu import FakeFeishu

    with FakeFeishu(apps={"cli_bench": "bench-secret"}) as fake:
        env = {"FEISHU_APP_ID": "cli_bench", "FEISHU_APP_SECRET": "bench-secret"}
        env["FEISHU_DOMAIN"] = fake.url
        effect = throughput(url, 1, 4, n, "bench.reply", env)
        raw = throughput(url, 1, 4, n, "bench.reply_raw", env)
        effect_c1 = throughput(url, 1, 1, n, "bench.reply", env)
        raw_c1 = throughput(url, 1, 1, n, "bench.reply_raw", env)
        counts = fake.counts()
    assert counts["messages"] == 4 * n and counts.get("duplicate", 0) == 0, counts
    return {
        "replies_per_s": effect,
        "raw_per_s": raw,
        "replies_per_s_c1": effect_c1,
        "raw_per_s_c1": raw_c1,
        # One slot: what the effect adds to each reply's time (its two fenced statements).
        "overhead_ms": 1000 / effect_c1 - 1000 / raw_c1,
        "token_requests": counts["token_requests"],
    }


def start_idle_worker(url: str, **env: str) -> subprocess.Popen[bytes]:
    log = Path(tempfile.mkdtemp()) / "worker.log"
    with open(log, "wb") as err:  # a file, not a pipe: nobody has to keep reading it
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "runworker", "--concurrency", "1", "-v", "1"],
            cwd=ROOT,
            env=worker_env(url, LOG_LEVEL="INFO", **env),
            stderr=err,
        )
    deadline = time.monotonic() + 60
    while b"started" not in log.read_bytes():  # its start-up line
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"the worker did not start: {log.read_text()}")
        time.sleep(0.05)
    return proc


def latency(url: str, n: int, gap: float) -> tuple[float, float]:
    from feishu_inbox import ledger

    out = Path(tempfile.mkdtemp()) / "latency.txt"
    proc = start_idle_worker(url, BENCH_LATENCY_FILE=str(out))
    try:
        time.sleep(1.0)  # let the worker settle into its idle sleep (this is what we measure)
        for i in range(n):
            t0 = time.time()
            ledger.enqueue(
                event_id=f"lat-{i}-{t0}",
                event_type="bench.latency",
                partition_key=f"lat-{i}",
                payload={"t0": t0},
            )
            time.sleep(gap)  # pacing the arrivals, as the peers' latency runs do
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
    return percentile(lat, 50), percentile(lat, 99)


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


def peers(
    directory: Path, n: int, work: Path, only_djtasks: bool = False
) -> dict[str, dict[str, float]]:
    """Run the shared peer scripts (copied to ``work``); returns their figures."""
    if not (work / ".venv").exists():
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(directory, work, ignore=shutil.ignore_patterns("results", ".venv"))
        (work / "results").mkdir(exist_ok=True)
        for script in work.rglob("*.sh"):
            script.chmod(0o755)
        subprocess.run(
            ["bash", str(work / "setup.sh")], check=True, cwd=work, stdout=subprocess.DEVNULL
        )
    py = str(work / ".venv" / "bin" / "python")

    # The peers configure themselves from their own settings: none of ours may leak in.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "FEISHU_INBOX_HANDLERS")
    }

    def run(*args: str) -> dict[str, float]:
        done = subprocess.run(
            [py, *args],
            capture_output=True,
            text=True,
            cwd=work,
            timeout=900,
            env=env,
            check=False,
        )
        if done.returncode:
            raise RuntimeError(f"{' '.join(args[:2])} failed: {done.stderr.strip()[-500:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    p, d = str(work / "procrastinate_bench" / "bench.py"), str(work / "djtasks" / "bench.py")
    res: dict[str, dict[str, float]] = {"procrastinate": {}, "django-tasks-db": {}}
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
    return res


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
    parser.add_argument("--tasks-only", action="store_true", help="only the django.tasks row")
    parser.add_argument("--rounds", type=int, default=1, help="--tasks-only rounds (medians)")
    parser.add_argument(
        "--peers-work",
        type=Path,
        default=Path("/tmp/feishu-inbox-peers"),
        help="where the peers are copied and set up (PGDATABASE chooses their database)",
    )
    args = parser.parse_args()

    url = fresh_postgres("fi_bench_tasks" if args.tasks_only else args.database)
    django_setup(url)
    if args.tasks_only:
        # Rounds alternate ours and the peer's, so a machine whose load changes meanwhile
        # weighs on both; each figure is the median of the rounds, each ratio the median of
        # the rounds' ratios.
        rounds: list[tuple[dict[str, float], dict[str, float]]] = []
        for _ in range(args.rounds):
            tasks = tasks_row(url, args.jobs)
            their = {} if args.no_peers else peers(args.peers, args.jobs, args.peers_work, True)
            rounds.append((tasks, their.get("django-tasks-db", {})))
            print(
                json.dumps({"round": len(rounds), "tasks": tasks, "django-tasks-db": rounds[-1][1]})
            )
        ours_m = {k: median([r[0][k] for r in rounds]) for k in rounds[0][0]}
        theirs_m = {
            k: median([r[1][k] for r in rounds if k in r[1]]) for k in rounds[0][1] if rounds[0][1]
        }
        print_tasks_row(ours_m, theirs_m, args.jobs)
        ratios = [r[0]["c1"] / r[1]["c1"] for r in rounds if r[1].get("c1")]
        if ratios:
            print(
                f"  per-round processing ratios: {', '.join(f'{x:.2f}' for x in ratios)}; "
                f"median {median(ratios):.2f}x ({args.rounds} rounds)"
            )
        print(json.dumps({"tasks": ours_m, "django-tasks-db": theirs_m, "ratios": ratios}))
        print(f"reproduce: {reproduce()}")
        return
    ours = {
        "c1": throughput(url, 1, 1, args.jobs),
        "c4": throughput(url, 1, 4, args.jobs),
        "2x4": throughput(url, 2, 4, args.jobs),
    }
    ours["steps_c1"] = throughput(url, 1, 1, args.jobs, "bench.steps")
    sent = replies(url, args.replies) if args.replies else {}
    ours["p50_ms"], ours["p99_ms"] = latency(url, 500, 0.01)
    idle = idle_cpu(url, args.idle_seconds)
    warm, end, growth = memory(url, args.memory_jobs) if args.memory_jobs else (0, 0, 0.0)

    their: dict[str, dict[str, float]] = {}
    if not args.no_peers:
        try:
            their = peers(args.peers, args.jobs, args.peers_work)
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"peers not measured: {exc}")

    def cell(name: str, key: str) -> str:
        value = their.get(name, {}).get(key)
        return "-" if value is None else f"{value:,.0f}" if "ms" not in key else f"{value:.1f}"

    print(
        f"\nno-op jobs/s on PostgreSQL ({args.jobs:,} jobs)   feishu_inbox   procrastinate   "
        "django-tasks-db"
    )
    print(
        f"  1 process x 1 slot                   {ours['c1']:12,.0f}   {cell('procrastinate', 'c1'):>13}   {cell('django-tasks-db', 'c1'):>15}"
    )
    print(
        f"  1 process x 4 slots                  {ours['c4']:12,.0f}   {cell('procrastinate', 'c4'):>13}   {'(no option)':>15}"
    )
    print(
        f"  2 processes x 4 slots                {ours['2x4']:12,.0f}   {cell('procrastinate', '2x4'):>13}   {cell('django-tasks-db', '2x1'):>15} (2 x 1)"
    )
    print(
        f"enqueue -> start latency p50 / p99 ms  {ours['p50_ms']:5.1f} / {ours['p99_ms']:5.1f}   "
        f"{cell('procrastinate', 'p50_ms'):>5} / {cell('procrastinate', 'p99_ms'):>5}   "
        f"{cell('django-tasks-db', 'p50_ms'):>5} / {cell('django-tasks-db', 'p99_ms'):>5} (interval 0.1 s)"
    )
    per_job_ms, per_step_ms = 1000 / ours["c1"], (1000 / ours["steps_c1"] - 1000 / ours["c1"]) / 3
    print(
        f"3-step no-op handler, 1 process x 1 slot: {ours['steps_c1']:,.0f} jobs/s; each step adds "
        f"{per_step_ms:.2f} ms, a whole no-op job (one statement) takes {per_job_ms:.2f} ms: "
        f"a step costs {per_step_ms / per_job_ms:.2f} of it (goal: one round trip each, at most)"
    )
    tasks = tasks_row(url, args.jobs)
    print_tasks_row(tasks, their.get("django-tasks-db", {}), args.jobs)
    if sent:
        print(
            f"replies/s through the client against the local fake: 1 x 4 slots "
            f"{sent['replies_per_s']:,.0f} as idempotent effects ({sent['raw_per_s']:,.0f} as bare "
            f"client calls), 1 x 1 {sent['replies_per_s_c1']:,.0f} ({sent['raw_per_s_c1']:,.0f}): "
            f"the effect's bookkeeping (two fenced statements) adds {sent['overhead_ms']:.2f} ms "
            f"per reply; {sent['token_requests']} token request(s) for {4 * args.replies:,} replies"
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
