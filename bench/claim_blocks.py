"""What one claim reads while another session holds a snapshot: blocks of the partition table
and its claimable index (PostgreSQL's own counters for the transaction, not a timing, so a
busy machine gives the same figures), as jobs run after the snapshot began.

1,000 chats, each one's next job enqueued as its last one finished; at each checkpoint one
claim of 10 in a transaction rolled back (it changes nothing), with the stored functions as
they are and, beside them, as an earlier versioned file left them (``--against``, default
0039's, the claim before migration 0042: one more walk of the index for the first tenant).

    .venv/bin/python bench/claim_blocks.py [--jobs 40000] [--against FILE]
"""

from __future__ import annotations

import argparse

from _setup import django_setup, drop_postgres, fresh_postgres

CHATS = 1000
TABLES = ("feishu_inbox_partition", "feishu_inbox_part_claimable")


def claim_of(functions: str) -> str:
    """The definition of feishu_inbox_claim in a rendered functions file."""
    start = functions.index("CREATE OR REPLACE FUNCTION feishu_inbox_claim(")
    return functions[start : functions.index("\n$$;", start) + 4]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40_000)
    parser.add_argument("--against", default="0039_fair_claims.sql")
    args = parser.parse_args()
    url = fresh_postgres("fi_bench_claim_blocks")
    try:
        run(url, args)
    finally:
        from django.db import connections

        connections.close_all()
        drop_postgres("fi_bench_claim_blocks")


def run(url: str, args: argparse.Namespace) -> None:
    django_setup(url)
    import psycopg

    from feishu_inbox import ledger
    from feishu_inbox.ledger import rules
    from feishu_inbox.store.queries import current_functions, function_file

    versions = {
        "now": claim_of(current_functions()),
        "before": claim_of(function_file(args.against)),
    }
    made = [0]

    def enqueue(chat: int) -> None:
        made[0] += 1
        ledger.enqueue(
            event_id=f"b{made[0]}",
            event_type="bench.noop",
            partition_key=f"chat-{chat}",
            payload={"chat": chat},
        )

    for chat in range(CHATS):
        enqueue(chat)
    held = psycopg.connect(url)
    held.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    held.execute("SELECT count(*) FROM feishu_inbox_partition").fetchone()
    probe = psycopg.connect(url)

    # Each version as a function of its own, created once: a plan cached by the session, as a
    # worker's is (created anew for each claim, its statements would be planned every time).
    for name, definition in versions.items():
        probe.execute(
            definition.replace("FUNCTION feishu_inbox_claim(", f"FUNCTION bench_claim_{name}(", 1)
        )
    probe.commit()

    def blocks(name: str) -> int:
        with probe.transaction(force_rollback=True):
            probe.execute(f"SELECT count(*) FROM bench_claim_{name}('bench', 'x', 60, 10)")
            found = probe.execute(
                "SELECT sum(pg_stat_get_xact_blocks_fetched(oid)) FROM pg_class"
                " WHERE relname = ANY(%s)",
                (list(TABLES),),
            ).fetchone()
            return int(found[0]) if found else 0

    print(f"one claim of 10, blocks read; {CHATS} chats, a snapshot held from the start")
    print(f"{'jobs since the snapshot':>24} | {'now':>6} | {'before':>6} ({args.against})")
    done = 0
    checkpoints = sorted({0, args.jobs // 8, args.jobs // 2, args.jobs})
    for target in checkpoints:
        while done < target:
            for job in rules.claim("bench", limit=10):
                rules.finish(job.lease)
                enqueue(job.payload["chat"])
                done += 1
        # each three times, alternating (the first read of a page after the jobs may prune
        # it): the least of each
        reads: dict[str, list[int]] = {"now": [], "before": []}
        for _ in range(3):
            for name in ("before", "now"):
                reads[name].append(blocks(name))
        now, before = min(reads["now"]), min(reads["before"])
        print(f"{target:>24,} | {now:>6,} | {before:>6,}")
    held.rollback()
    held.close()
    probe.close()


if __name__ == "__main__":
    main()
