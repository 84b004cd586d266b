"""Claim+finish cost with 1,000 vs 200,000 jobs waiting behind a blocked partition.

The claim reads the partition-head index, never the backlog, so the two costs should match:
goal ratio <= 1.5. Runs on PostgreSQL (and SQLite with --sqlite).

    .venv/bin/python bench/claim_backlog.py [--small 1000] [--large 200000] [--jobs 3000]
"""

from __future__ import annotations

import argparse
import json

from _setup import (
    django_setup,
    each_backend,
    fresh_postgres,
    fresh_sqlite,
    median,
    reproduce,
    timed,
)


def fill_backlog(n: int) -> None:
    """A partition whose head is failed, with ``n`` queued jobs waiting behind it."""
    from django.db import connection

    from feishu_inbox import ledger
    from feishu_inbox.store.schema import JOB_TABLE

    ledger.enqueue(event_id="blocked-head", event_type="t", partition_key="blocked", payload={})
    lease = ledger.claim("setup")[0].lease
    from django.test import override_settings

    with override_settings(FEISHU_INBOX={"MAX_ATTEMPTS": 1}):
        ledger.fail(lease, error_type="Boom")
    columns = (
        "app, event_id, event_type, dedupe_key, partition_key, private_message, payload, "
        "status, attempt, received_at, available_at, worker_id, lease_token, "
        "effects_in_flight, side_effect_started, effect_uncertain, error_type, error_message, "
        "resolution"
    )
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(
                f"INSERT INTO {JOB_TABLE} ({columns}) SELECT 'default', 'b' || g, 't', 'b' || g, "
                "'blocked', FALSE, '{}'::jsonb, 'queued', 0, now(), now(), '', '', 0, FALSE, "
                "FALSE, '', '', '' FROM generate_series(1, %s) g",
                [n],
            )
            cur.execute("ANALYZE")
        else:
            cur.execute(
                f"WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < %s) "
                f"INSERT INTO {JOB_TABLE} ({columns}) SELECT 'default', 'b' || i, 't', 'b' || i, "
                "'blocked', 0, '{}', 'queued', 0, datetime('now'), datetime('now'), '', '', 0, "
                "0, 0, '', '', '' FROM g",
                [n],
            )


def claim_finish_rate(jobs: int, partitions: int) -> float:
    """Seconds per job to claim and finish ``jobs`` runnable jobs one at a time."""
    from feishu_inbox import ledger

    for i in range(jobs):
        ledger.enqueue(
            event_id=f"r{i}", event_type="t", partition_key=f"chat-{i % partitions}", payload={}
        )

    def work() -> int:
        done = 0
        while claimed := ledger.claim("bench"):
            ledger.finish(claimed[0].lease)
            done += 1
        return done

    done, seconds = timed(work)
    assert done == jobs, (done, jobs)
    return seconds / done


def measure(backend: str, backlog: int, jobs: int, partitions: int, rounds: int) -> float:
    from django.core.management import call_command
    from django.db import connections

    samples = []
    for r in range(rounds):
        connections.close_all()
        name = f"fi_bench_backlog_{backlog}_{r}"
        url = fresh_postgres(name) if backend == "postgres" else fresh_sqlite(name)
        connections["default"].settings_dict["NAME"] = (
            url.split("/")[-1] if backend == ("postgres") else url.split("///", 1)[1]
        )
        call_command("migrate", verbosity=0)
        fill_backlog(backlog)
        samples.append(claim_finish_rate(jobs, partitions))
    connections.close_all()
    return median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=200_000)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--partitions", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sqlite", action="store_true", help="also measure SQLite")
    parser.add_argument("--backend", help=argparse.SUPPRESS)  # one backend per process
    args = parser.parse_args()
    if args.backend is None:
        results = {}
        for backend, r in each_backend(__file__, args.sqlite):
            results[backend] = r
            print(
                f"{backend}: claim+finish {r['small_us']:.0f} us/job with {args.small:,} "
                f"waiting behind a blocked chat, {r['large_us']:.0f} us/job with "
                f"{args.large:,}: ratio {r['ratio']:.2f} (goal <= 1.5)"
            )
        print(json.dumps(results, indent=2))
        print(f"reproduce: {reproduce()}")
        return
    url = fresh_postgres("fi_bench_backlog") if args.backend == "postgres" else fresh_sqlite("x")
    django_setup(url, migrate=False)
    small = measure(args.backend, args.small, args.jobs, args.partitions, args.rounds)
    large = measure(args.backend, args.large, args.jobs, args.partitions, args.rounds)
    print(json.dumps({"small_us": small * 1e6, "large_us": large * 1e6, "ratio": large / small}))


if __name__ == "__main__":
    main()
