"""A big table, the backfills that fill it, and the settings they read, for the backfill and
export tests (in-process and in ``runworker`` subprocesses: ``FEISHU_INBOX_HANDLERS``).

``Row`` is a test table of the demo app (not in its migrations: ``make_table`` creates it).
Each batch of ``test.fill`` writes ``value = id * 2`` and adds one to ``counter``: a row whose
counter ends above 1 was backfilled twice. The environment sets the pace and the batch size
(``BACKFILL_TEST_RATE`` rows per second, ``BACKFILL_TEST_BATCH``), and a file in
``WORKER_TEST_DIR`` holds ``test.hang``'s batches (``hold``) until it is removed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from django.db import connection, models
from django.db.models import F

import feishu_inbox

TABLE = "fi_test_backfill_row"


class Row(models.Model):
    label = models.CharField(max_length=64, default="")
    value = models.IntegerField(null=True)
    counter = models.IntegerField(default=0)
    #: JSON that CSV cannot hold (an export's invalid row).
    data = models.JSONField(null=True)

    class Meta:
        app_label = "demo"
        db_table = TABLE

    def __str__(self) -> str:
        return f"row {self.pk}"


def make_table() -> None:
    """Create the test table (once per test database)."""
    if TABLE in connection.introspection.table_names():
        return
    with connection.schema_editor() as editor:
        editor.create_model(Row)


def fill_table(n: int) -> None:
    """``n`` rows in one statement (ids 1..n), each with a label and no value yet."""
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(
                f"INSERT INTO {TABLE} (id, label, value, counter) "
                "SELECT i, 'row ' || i, NULL, 0 FROM generate_series(1, %s) AS i",
                [n],
            )
            cur.execute(f"SELECT setval(pg_get_serial_sequence('{TABLE}', 'id'), %s)", [n])
            cur.execute(f"ANALYZE {TABLE}")
        else:
            cur.execute(
                f"WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < %s) "
                f"INSERT INTO {TABLE} (id, label, value, counter) "
                "SELECT i, 'row ' || i, NULL, 0 FROM s",
                [n],
            )


def _env_float(name: str, default: float | None) -> float | None:
    value = os.environ.get(name)
    return float(value) if value else default


def _dir() -> Path:
    return Path(os.environ.get("WORKER_TEST_DIR", "."))


@feishu_inbox.backfill(
    "test.fill",
    Row,
    batch_size=int(os.environ.get("BACKFILL_TEST_BATCH", "500")),
    rows_per_second=_env_float("BACKFILL_TEST_RATE", None),
    stall_seconds=_env_float("BACKFILL_TEST_STALL", None),
)
def fill(batch: Any) -> None:
    """value = id * 2, counter + 1."""
    batch.update(value=F("id") * 2, counter=F("counter") + 1)


@feishu_inbox.backfill("test.hang", Row, batch_size=100, stall_seconds=2.0, takes="pks")
def hang(keys: list[int]) -> None:
    """Counts its batch, but waits while the ``hold`` file exists (a batch that never ends)."""
    while (_dir() / "hold").exists():
        (_dir() / "holding").touch()
        time.sleep(0.05)  # a stuck batch function, by design
    Row.objects.filter(pk__in=keys).update(counter=F("counter") + 1)


@feishu_inbox.backfill("test.write_then_hang", Row, batch_size=100, takes="pks")
def write_then_hang(keys: list[int]) -> None:
    """Writes its batch, then, from row 301 on, waits while the ``hold`` file exists: a worker
    killed there dies with the batch's writes made and not committed."""
    Row.objects.filter(pk__in=keys).update(value=F("id") * 2, counter=F("counter") + 1)
    while keys[0] > 300 and (_dir() / "hold").exists():
        (_dir() / "holding").touch()
        time.sleep(0.05)  # a batch stuck after its writes, by design


@feishu_inbox.backfill("test.only_staging", Row, environments=["staging"])
def only_staging(batch: Any) -> None:
    batch.update(counter=F("counter") + 1)


@feishu_inbox.backfill("test.after_future", Row, after="demo.9999_not_yet")
def after_future(batch: Any) -> None:
    batch.update(counter=F("counter") + 1)


@feishu_inbox.backfill("test.explodes", Row, batch_size=10, takes="rows")
def explodes(rows: list[Row]) -> None:
    """Counts its rows, then raises at the row whose label is ``boom``: the batch rolls back."""
    for row in rows:
        Row.objects.filter(pk=row.pk).update(counter=F("counter") + 1)
        if row.label == "boom":
            raise ValueError(f"row {row.pk} is boom")
