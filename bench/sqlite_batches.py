"""SQLite: no-op runworker throughput with batches (BATCH_WINDOW 5 ms) and without (0), in
alternating rounds, 1 process x 1 and x 4 slots, on a scratch database file.

    .venv/bin/python bench/sqlite_batches.py [--jobs 3000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from _setup import ROOT, reproduce

DB = ROOT / ".bench" / "sqlite_batches.sqlite3"


def setup() -> None:
    DB.parent.mkdir(exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        DB.with_name(DB.name + suffix).unlink(missing_ok=True)
    os.environ.update(
        DATABASE_URL=f"sqlite:///{DB}",
        DJANGO_SETTINGS_MODULE="project.settings",
        FEISHU_INBOX_READ_DOTENV="0",
        LOG_LEVEL="ERROR",
    )
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def run(n: int, window: str, slots: int) -> float:
    """Jobs/s from the first claim to the last finish of n no-op jobs over 1,000 chats."""
    from django.db import connection

    from feishu_inbox import ledger
    from feishu_inbox.models import Attempt, EventJob, Partition

    Attempt.objects.all().delete()
    EventJob.objects.all().delete()
    Partition.objects.all().delete()
    for i in range(n):
        ledger.enqueue(
            event_id=f"e{i}-{time.time()}",
            event_type="bench.noop",
            partition_key=f"chat-{i % 1000}",
            payload={},
        )
    env = {
        **os.environ,
        "FEISHU_INBOX_HANDLERS": "bench.bench_handlers",
        "FEISHU_INBOX_BATCH_WINDOW": window,
    }
    command = [sys.executable, "manage.py", "runworker", "--burst", "-v", "0"]
    subprocess.run([*command, "--concurrency", str(slots)], cwd=ROOT, env=env, check=True)
    connection.close()
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*), (julianday(max(finished_at)) - julianday(min(claimed_at))) * 86400"
            " FROM feishu_inbox_eventjob WHERE status = 'completed'"
        )
        done, seconds = cur.fetchone()
    assert done == n, (done, n)
    return float(done) / float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    setup()
    rates: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for window in ("0.005", "0"):
            for slots in (1, 4):
                rates.setdefault((window, slots), []).append(run(args.jobs, window, slots))
    for (window, slots), per_round in rates.items():
        figures = " / ".join(f"{x:,.0f}" for x in per_round)
        print(f"SQLite, BATCH_WINDOW={window}, 1 process x {slots}: {figures} jobs/s per round")
    print(f"reproduce: {reproduce()}")


if __name__ == "__main__":
    main()
