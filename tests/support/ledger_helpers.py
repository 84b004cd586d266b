"""Helpers for ledger tests: raw row snapshots and moving the database clock's view of a job."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from feishu_inbox.models import Attempt, EventJob, Partition


def snapshot(job_id: int) -> tuple[Any, ...]:
    """The job row, its partition row and its attempt rows, exactly as stored."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT * FROM {EventJob._meta.db_table} WHERE id = %s", [job_id])
        job = cur.fetchone()
        assert job is not None
        key = EventJob.objects.values_list("partition_key", flat=True).get(pk=job_id)
        cur.execute(f"SELECT * FROM {Partition._meta.db_table} WHERE key = %s", [key])
        part = cur.fetchone()
        cur.execute(
            f"SELECT * FROM {Attempt._meta.db_table} WHERE job_id = %s ORDER BY id", [job_id]
        )
        attempts = cur.fetchall()
    return (job, part, tuple(attempts))


@contextmanager
def one_snapshot() -> Iterator[None]:
    """The queries inside see the database as of one instant, as one statement would: a
    condition read in several queries while workers commit (a job ended, then its cleanup
    fired as a new job) must not pass on a mix of before and after. PostgreSQL: a REPEATABLE
    READ transaction; SQLite: a transaction reads one snapshot from its first read on."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield


def catalog_texts(sql: str, params: list[Any] | None = None) -> list[str]:
    """The first column of every row of a catalog query (a table's or a function's SQL, an
    index's definition), leaving out NULLs (SQLite's implicit indexes have no SQL)."""
    with connection.cursor() as cur:
        cur.execute(sql, params or [])
        return [row[0] for row in cur.fetchall() if row[0]]


def expire_lease(job_id: int) -> None:
    """Make a running job's lease lie in the past, as if its worker stopped renewing."""
    updated = EventJob.objects.filter(pk=job_id, status="running").update(
        lease_until=timezone.now() - timedelta(minutes=5)
    )
    assert updated == 1


def make_due(job_id: int) -> None:
    """Make a retry-waiting job due now (its backoff elapsed): a second before the database's
    now(), which on PostgreSQL is the start of the test's transaction (a test of the default
    django_db mark runs in one), not the host's clock at this line: under load, a test that
    took more than a second to get here made a job due after the claim's now()."""
    past = timezone.now() - timedelta(seconds=1)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT now() - interval '1 second'")
            past = min(past, cursor.fetchone()[0])
    EventJob.objects.filter(pk=job_id).update(available_at=past)
    Partition.objects.filter(head_id=job_id).update(head_due_at=past)


def status(job_id: int) -> str:
    return EventJob.objects.values_list("status", flat=True).get(pk=job_id)


def assert_mirror_consistent() -> None:
    """Every partition row points at its first non-completed job and mirrors its state,
    priority and tenant (0 and "" when idle). Two queries, whatever the number of partitions:
    the model test checks this after each of its ~2,400 steps."""
    heads: dict[str, Any] = {}
    running: dict[str, int] = {}
    for job in EventJob.objects.exclude(status="completed").order_by("id"):
        heads.setdefault(job.partition_key, job)
        running[job.partition_key] = running.get(job.partition_key, 0) + (job.status == "running")
    for part in Partition.objects.all():
        head = heads.get(part.key)
        if head is None:
            idle = (part.head_id, part.head_state, part.head_priority, part.head_tenant)
            assert idle == (None, "idle", 0, ""), part.key
        else:
            assert part.head_id == head.pk, part.key
            assert part.head_state == head.status, part.key
            assert part.head_priority == head.priority, part.key
            assert part.head_tenant == head.tenant, part.key
            if head.status in ("queued", "retry_wait"):
                assert part.head_due_at == head.available_at, part.key
        assert running.get(part.key, 0) <= 1, part.key
