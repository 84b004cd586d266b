"""What a job writes to PostgreSQL's WAL, by table and index: its enqueue, its claim and its
finish, through the stored functions the worker calls, read back from the WAL itself
(``pg_walinspect``, PostgreSQL 15+), this database's records only.

1,000 chats; ``--jobs`` jobs enqueued in one statement, then one job of each chat claimed
(``feishu_inbox_claim``, ``--limit`` a call) and finished (``feishu_inbox_finish_batch``, the
same number a call), once for each ``--payload`` size (bytes of text in the event). Record
bytes per job, full-page images apart: those depend on where the checkpoints fall (the run
starts each stage right after a ``CHECKPOINT``, so they are the most a stage can write).
Bytes, not time: a busy machine gives the same figures.

    .venv/bin/python bench/wal_per_job.py [--jobs 3000] [--limit 10] [--payload 0 1000]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from typing import Any

from _setup import django_setup, drop_postgres, fresh_postgres

CHATS = 1000
DATABASE = "fi_bench_wal"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--limit", type=int, default=10, help="jobs a claim and a finish call")
    parser.add_argument("--payload", type=int, nargs="+", default=[0, 1000])
    parser.add_argument("--top", type=int, default=12, help="rows of each stage's breakdown")
    args = parser.parse_args()
    url = fresh_postgres(DATABASE)
    try:
        django_setup(url)
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            for size in args.payload:
                run(conn, args, size)
    finally:
        from django.db import connections

        connections.close_all()
        drop_postgres(DATABASE)


class Window:
    """The WAL written between ``start()`` and ``stop()``, this database's records."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.database = str(
            conn.execute(
                "SELECT oid FROM pg_database WHERE datname = current_database()"
            ).fetchone()[0]
        )

    def start(self) -> None:
        self.conn.execute("CHECKPOINT")
        self.since = self.conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]

    def stop(self) -> tuple[dict[tuple[str, str], tuple[int, int]], int]:
        """Per (relation, record type): (records, record bytes less images); image bytes."""
        until = self.conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        # Relations by file node, read now: a TRUNCATE gives a table a new one.
        names = dict(
            self.conn.execute(
                "SELECT pg_relation_filenode(oid)::text, relname FROM pg_class"
                " WHERE pg_relation_filenode(oid) IS NOT NULL"
            ).fetchall()
        )
        found: dict[tuple[str, str], list[int]] = collections.defaultdict(lambda: [0, 0])
        images = 0
        for manager, kind, length, image, blocks in self.conn.execute(
            "SELECT resource_manager, record_type, record_length, fpi_length, block_ref"
            " FROM pg_get_wal_records_info(%s, %s)",
            (self.since, until),
        ).fetchall():
            where = re.search(r"rel \d+/(\d+)/(\d+)", blocks or "")
            if where is None or where.group(1) != self.database:
                continue  # another database's (the server is shared), or no relation's
            row = found[(names.get(where.group(2), where.group(2)), f"{manager}/{kind}")]
            row[0] += 1
            row[1] += length - image
            images += image
        return {k: (v[0], v[1]) for k, v in found.items()}, images


def run(conn: Any, args: argparse.Namespace, size: int) -> None:
    conn.execute("TRUNCATE feishu_inbox_eventjob, feishu_inbox_partition CASCADE")
    payload = json.dumps({"event": {"message": {"content": "x" * size}}})
    window = Window(conn)
    stages: dict[str, tuple[dict[tuple[str, str], tuple[int, int]], int, int]] = {}

    window.start()
    conn.execute(
        "SELECT count(*) FROM (SELECT feishu_inbox_enqueue('default', 'w' || g, 'bench.noop',"
        " 'w' || g, 'chat-' || (g %% %s), false, %s::jsonb, NULL::integer, '', '')"
        " FROM generate_series(1, %s) g) s",
        (CHATS, payload, args.jobs),
    )
    stages["enqueue"] = (*window.stop(), args.jobs)

    window.start()
    claimed: list[tuple[int, str, str]] = []
    while len(claimed) < min(CHATS, args.jobs):
        got = conn.execute(
            "SELECT id, lease_token, partition_key FROM feishu_inbox_claim('bench', 't', 60, %s)",
            (args.limit,),
        ).fetchall()
        if not got:
            break
        claimed += got
    stages["claim"] = (*window.stop(), len(claimed))

    window.start()
    for i in range(0, len(claimed), args.limit):
        part = claimed[i : i + args.limit]
        conn.execute(
            "SELECT count(*) FROM feishu_inbox_finish_batch('bench', %s::bigint[], %s, %s, %s,"
            " 't2', 0, 60, ARRAY[]::text[])",
            ([c[0] for c in part], [c[1] for c in part], [c[2] for c in part], [""] * len(part)),
        )
    stages["finish"] = (*window.stop(), len(claimed))

    print(
        f"\npayload {size} bytes of text; {args.jobs:,} jobs over {CHATS:,} chats, "
        f"{args.limit} a claim and a finish call"
    )
    total = 0.0
    for stage, (rows, images, n) in stages.items():
        record = sum(b for _, b in rows.values()) / n
        total += record
        print(
            f"  {stage}: {record:,.0f} record bytes a job "
            f"(and {images / n:,.0f} of page images after the checkpoint)"
        )
        for (relation, kind), (count, size_) in sorted(rows.items(), key=lambda kv: -kv[1][1])[
            : args.top
        ]:
            print(f"    {size_ / n:7,.0f} B  {count / n:5.2f} records  {relation:40} {kind}")
    print(f"  a job, enqueue to finish: {total:,.0f} record bytes")


if __name__ == "__main__":
    main()
