"""runworker through PgBouncer in transaction mode beside the same worker reaching PostgreSQL
directly, in one run (docs/production.md, "PostgreSQL topology"; docs/benchmarks.md):

- no-op jobs/s, 2 processes x 4 slots (a pool of 3 server connections behind PgBouncer, fewer
  than the workers' connections; nothing prepared on the server);
- enqueue -> handler start with an idle worker (one job every --gap seconds on a fixed
  schedule; p50, p99, max ms): directly (LISTEN and NOTIFY), behind PgBouncer with LISTEN on a
  direct connection (LISTEN_URL; goal p50 < 50 ms, p99 < 250 ms), and behind PgBouncer in
  poll-only mode (POLL_ONLY; goal: within POLL_INTERVAL).

PgBouncer is the distribution's (apt-get install pgbouncer), started on a free port for the
run. The database is PostgreSQL's at BENCH_PG.

    .venv/bin/python bench/pgbouncer.py [--jobs 10000] [--latency-jobs 100] [--gap 0.1]
                                        [--poll-interval 1.0]
"""

from __future__ import annotations

import argparse
import json
from urllib.parse import urlsplit

from _setup import django_setup, fresh_postgres, reproduce
from worker import latency, throughput


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--latency-jobs", type=int, default=100)
    parser.add_argument("--gap", type=float, default=0.1)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    args = parser.parse_args()
    url = fresh_postgres("bench_pgbouncer")
    django_setup(url)
    from tests.support.pgbouncer import POOL_SIZE, PgBouncer, pooled_env

    parts = urlsplit(url)
    bouncer = PgBouncer(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    try:
        listen = pooled_env(url, bouncer, listen=True)
        poll = {
            **pooled_env(url, bouncer, listen=False),
            "FEISHU_INBOX_POLL_INTERVAL": str(args.poll_interval),
        }
        rows = {}
        for name, env in (("direct", {}), ("pgbouncer", listen)):
            reached = env.get("DATABASE_URL", url)
            jobs = throughput(reached, 2, 4, args.jobs, env=env)
            p50, p99, top = latency(reached, args.latency_jobs, args.gap, **env)
            rows[name] = {"jobs_per_s": jobs, "p50_ms": p50, "p99_ms": p99, "max_ms": top}
        p50, p99, top = latency(poll["DATABASE_URL"], args.latency_jobs, args.gap, **poll)
        rows["pgbouncer_poll_only"] = {"p50_ms": p50, "p99_ms": p99, "max_ms": top}
    finally:
        bouncer.stop()
    print(f"# {reproduce()}")
    print(f"# PgBouncer pool: {POOL_SIZE} server connections; poll interval {args.poll_interval}s")
    print(f"{'topology':<22}{'jobs/s 2x4':>12}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    for name, row in rows.items():
        jobs_s = f"{row['jobs_per_s']:.0f}" if "jobs_per_s" in row else "-"
        print(
            f"{name:<22}{jobs_s:>12}{row['p50_ms']:>10.1f}{row['p99_ms']:>10.1f}"
            f"{row['max_ms']:>10.1f}"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
