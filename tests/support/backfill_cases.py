"""Backfills at their edges, for ``tests/backfills/test_backfill_edges.py``: a backfill whose
batches meet the database going away under them.

``test.blinks`` walks ``backfill_jobs.Row`` and adds one to each row's counter; each of its
batches that finds a word in ``BLINKS`` takes it and, after its writes, meets:

- ``"read_only"``: its next write refused as a read-only server refuses it (SQLSTATE 25006,
  what a failover's demoted primary answers, on PostgreSQL; ``PRAGMA query_only`` on SQLite,
  which holds for the rest of the connection's life: the batch succeeds again only on a new
  connection);
- ``"drop"`` (PostgreSQL): its connection killed by the server (``pg_terminate_backend``).
"""

from __future__ import annotations

from django.db import connection
from django.db.models import F

import feishu_inbox

from .backfill_jobs import Row

#: What the next batches of ``test.blinks`` meet, one word a batch (see the module).
BLINKS: list[str] = []


@feishu_inbox.backfill("test.blinks", Row, batch_size=100, takes="pks")
def blinks(keys: list[int]) -> None:
    """counter + 1; then, when ``BLINKS`` says so, the database goes away (see the module)."""
    Row.objects.filter(pk__in=keys).update(counter=F("counter") + 1)
    if not BLINKS:
        return
    blink = BLINKS.pop(0)
    with connection.cursor() as cur:
        if blink == "drop":
            cur.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        elif connection.vendor == "postgresql":
            cur.execute("SET TRANSACTION READ ONLY")
        else:
            cur.execute("PRAGMA query_only = ON")
    Row.objects.filter(pk__in=keys).update(value=F("id") * 2)  # refused: the server is away
