"""Backfills at their edges, in one process: a batch that meets the database away (SPEC §9k:
tried again, never the backfill's failure), a zombie's error that must not fail the live run,
a table keyed by UUID, and a router that sends the table's reads to a replica that lags (the
batches read their keys where they write)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import models
from django.test import override_settings
from django.utils import timezone

from feishu_inbox import backfills
from feishu_inbox.backfills import running
from feishu_inbox.backfills.declared import BackfillSpec
from feishu_inbox.models import EventJob
from feishu_inbox.tables.backfills import Backfill
from tests.conftest import is_postgres
from tests.support import backfill_cases, backfill_jobs, ledger_helpers
from tests.support.backfill_cases import BLINKS, UuidRow
from tests.support.backfill_jobs import Row

pytestmark = pytest.mark.django_db(transaction=True)


def burst() -> None:
    call_command("runworker", "--burst", "--concurrency", "1", "-v", "0")


def counters(model: type[models.Model] = Row) -> Counter[int]:
    return Counter(model._default_manager.values_list("counter", flat=True))


def row_of(name: str) -> Backfill:
    return Backfill.objects.get(name=name)


@pytest.fixture
def blinks() -> Iterator[list[str]]:
    BLINKS.clear()
    yield BLINKS
    BLINKS.clear()


@pytest.mark.parametrize("blink", ["read_only", "drop"])
def test_a_batch_that_meets_the_database_away_is_tried_again_and_the_run_goes_on(
    table: Any, blinks: list[str], blink: str
) -> None:
    if blink == "drop" and not is_postgres():
        pytest.skip("a server that kills a connection: PostgreSQL")
    backfill_jobs.fill_table(450)
    blinks[:] = [blink, blink]  # the first two batches: after their writes, the database away
    backfills.start("test.blinks")
    burst()
    assert not blinks
    done = row_of("test.blinks")
    assert (done.state, done.rows_done, done.error) == ("applied", 450, "")
    assert counters() == {1: 450}  # the batches that met it rolled back whole: each row once
    job = EventJob.objects.get(pk=done.job_id)
    assert (job.status, job.attempt, job.error_type) == ("completed", 1, "")


def test_a_database_away_past_the_lease_fails_the_attempt_and_the_backfill_stays_running(
    table: Any, blinks: list[str]
) -> None:
    backfill_jobs.fill_table(250)
    blinks[:] = ["read_only"] * 1000  # every batch, until the test says otherwise
    short_lease = {**settings.FEISHU_INBOX, "LEASE_SECONDS": 3.0}
    backfills.start("test.blinks")
    with override_settings(FEISHU_INBOX=short_lease):
        burst()
    assert len(blinks) < 1000
    waiting = row_of("test.blinks")
    assert (waiting.state, waiting.rows_done, waiting.error) == ("running", 0, "")
    job = EventJob.objects.get(pk=waiting.job_id)
    assert (job.status, job.attempt) == ("retry_wait", 1)
    assert "read" in job.error_message.lower(), job.error_message  # read-only, readonly
    assert job.available_at <= timezone.now() + timedelta(seconds=running.POLICY.max_delay)
    blinks.clear()  # the database is back; the retry is made due now rather than waited for
    ledger_helpers.make_due(job.pk)
    burst()
    assert row_of("test.blinks").state == "applied"
    assert counters() == {1: 250}


def test_a_stale_batch_that_raises_does_not_fail_the_run_another_worker_moved_on(
    table: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zombie's batch raised after another worker's batch landed: its failure is fenced on
    the batch count it read, as its claim is, so the live run is not failed; it goes on."""
    backfill_jobs.fill_table(1500)
    backfills.start("test.fill")
    real = running.run_batch
    raised: list[Exception] = []

    def stale_then_raises(spec: Any, row: Backfill) -> running.Batch:
        if not raised:
            assert real(spec, row_of("test.fill")).rows == 500  # another worker's batch
            raised.append(ValueError("the stale batch's own error"))
            raise raised[0]
        return real(spec, row)

    monkeypatch.setattr(running, "run_batch", stale_then_raises)
    burst()
    assert raised
    done = row_of("test.fill")
    assert (done.state, done.error, done.rows_done) == ("applied", "", 1500)
    assert counters() == {1: 1500}


def test_a_table_keyed_by_uuid_is_walked_in_keyset_batches(table: Any) -> None:
    backfill_cases.make_uuid_table()
    UuidRow.objects.bulk_create([UuidRow() for _ in range(130)])
    backfills.start("test.fill_uuid")
    burst()
    done = row_of("test.fill_uuid")
    assert (done.state, done.rows_done, done.batches, done.error) == ("applied", 130, 4, "")
    assert counters(UuidRow) == {1: 130}
    assert done.cursor == str(max(UuidRow.objects.values_list("pk", flat=True)))


class RowReadsToTheReplica:
    """A site's router: reads of the backfilled table go to the replica."""

    def __init__(self, replica: str) -> None:
        self.replica = replica

    def db_for_read(self, model: type[models.Model], **hints: Any) -> str | None:
        return self.replica if model is Row else None


@pytest.fixture
def lagging_replica(other_database: str) -> Iterator[str]:
    """``other_database`` as a replica that has not caught up (its table empty), the router
    sending the table's reads to it."""
    with override_settings(DATABASE_ROUTERS=[RowReadsToTheReplica(other_database)]):
        yield other_database


@pytest.mark.parametrize("name", ["test.fill", "test.explodes"])  # a queryset; model rows
def test_a_batch_reads_its_keys_and_rows_where_it_writes_not_from_a_lagging_replica(
    lagging_replica: str, name: str
) -> None:
    backfill_jobs.fill_table(1200)
    assert not Row.objects.exists()  # the router's reads: the replica, behind
    backfills.start(name)
    spec = backfills.get(name)
    assert spec is not None
    while running.run_batch(spec, row_of(name)).rows:  # the test's thread: its connections
        pass
    assert row_of(name).rows_done == 1200
    assert Counter(Row.objects.using("default").values_list("counter", flat=True)) == {1: 1200}
    assert spec.write_alias() == "default"
    pinned = BackfillSpec("x", Row.objects.using(lagging_replica), work=lambda batch: None)
    assert pinned.write_alias() == lagging_replica  # a source's own .using() is kept
