"""Backfills at their edges, for ``tests/backfills/test_backfill_edges.py``: a table keyed by
UUID, and a backfill whose batches meet the database going away under them.

``UuidRow`` is a test table of the demo app (not in its migrations: ``make_uuid_table``
creates it), walked by ``test.fill_uuid``. ``LaterRow`` is a model whose column ``filled`` a
later migration adds (``test.fill_later`` filters on it): its table as an earlier migration
state has it lacks the column. ``test.blinks`` walks ``backfill_jobs.Row`` and adds
one to each row's counter; each of its batches that finds a word in ``BLINKS`` takes it and,
after its writes, meets:

- ``"read_only"``: its next write refused as a read-only server refuses it (SQLSTATE 25006,
  what a failover's demoted primary answers, on PostgreSQL; ``PRAGMA query_only`` on SQLite,
  which holds for the rest of the connection's life: the batch succeeds again only on a new
  connection);
- ``"drop"`` (PostgreSQL): its connection killed by the server (``pg_terminate_backend``).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import connection, models
from django.db.models import F

import feishu_inbox

from .backfill_jobs import Row

UUID_TABLE = "fi_test_backfill_uuid_row"
#: What the next batches of ``test.blinks`` meet, one word a batch (see the module).
BLINKS: list[str] = []


class UuidRow(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    counter = models.IntegerField(default=0)

    class Meta:
        app_label = "demo"
        db_table = UUID_TABLE

    def __str__(self) -> str:
        return f"uuid row {self.pk}"


def make_uuid_table() -> None:
    """Create the UUID-keyed test table (once per test database)."""
    if UUID_TABLE in connection.introspection.table_names():
        return
    with connection.schema_editor() as editor:
        editor.create_model(UuidRow)


class LaterRow(models.Model):
    filled = models.IntegerField(null=True)

    class Meta:
        app_label = "demo"
        db_table = "fi_test_backfill_later_row"

    def __str__(self) -> str:
        return f"later row {self.pk}"


@feishu_inbox.backfill("test.fill_later", LaterRow.objects.filter(filled=None))
def fill_later(batch: Any) -> None:
    batch.update(filled=1)


@feishu_inbox.backfill("test.fill_uuid", UuidRow, batch_size=40)
def fill_uuid(batch: Any) -> None:
    """counter + 1, over the batch's range of UUIDs."""
    batch.update(counter=F("counter") + 1)


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
