"""The rows' own invariants (models.py constraints), held by the database on both.

SQLite enforces them as CHECK constraints; PostgreSQL, from migration 0014, as row triggers
with the same conditions and the same failure (check_violation under the constraint's name),
because it re-parses every CHECK for each statement that writes the table
(store/functions/0014_row_checks.sql). Each case writes a bad row, is refused with an
IntegrityError naming the broken rule, and leaves the row as it was.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models import CheckConstraint

from feishu_inbox import ledger
from feishu_inbox.models import EventJob, Partition, Status
from tests.support.ledger_helpers import catalog_texts

pytestmark = pytest.mark.django_db


def refused(model: type[Any], pk: Any, rule: str, **changes: Any) -> None:
    """Writing ``changes`` to the row is refused for breaking ``rule``; the row is unchanged."""
    before = model.objects.filter(pk=pk).values().get()
    with pytest.raises(IntegrityError) as caught, transaction.atomic():
        model.objects.filter(pk=pk).update(**changes)
    if connection.vendor == "postgresql":
        assert caught.value.__cause__.diag.constraint_name == rule  # type: ignore[union-attr]
    elif not rule.endswith("_check"):  # SQLite names only the named constraints
        assert rule in str(caught.value)
    assert model.objects.filter(pk=pk).values().get() == before


def _queued() -> int:
    return ledger.enqueue(event_id="e1", event_type="t", partition_key="c", payload={}).job_id


def test_a_job_status_must_be_one_of_the_statuses() -> None:
    job = _queued()
    refused(EventJob, job, "feishu_inbox_job_status_valid", status="done")
    refused(EventJob, job, "feishu_inbox_job_status_valid", status="")
    received = EventJob.objects.get(id=job).received_at
    for status in Status:  # every status the model knows (running needs a lease)
        if status == Status.RUNNING:
            lease = {"worker_id": "w", "lease_token": "t", "lease_until": received}
        else:
            lease = {"lease_token": "", "lease_until": None}
        EventJob.objects.filter(id=job).update(status=status, **lease)
        assert EventJob.objects.get(id=job).status == status


def test_the_database_checks_exactly_the_models_constraints() -> None:
    """Every CHECK of the job and the partition in Django's state is one the database holds
    (PostgreSQL: the 0014 trigger names it), and no other: a constraint changed on one side
    only fails here."""
    declared = set()
    for model in (EventJob, Partition):
        declared |= {c.name for c in model._meta.constraints if isinstance(c, CheckConstraint)}
        declared |= {
            f"{model._meta.db_table}_{f.column}_check"
            for f in model._meta.concrete_fields
            if f.db_parameters(connection)["check"]
        }
    if connection.vendor == "postgresql":  # the triggers' source names what they check
        source = " ".join(
            catalog_texts(
                "SELECT prosrc FROM pg_proc WHERE proname IN "
                "('feishu_inbox_job_check', 'feishu_inbox_partition_check')"
            )
        )
        held = set(re.findall(r"'(feishu_inbox_[a-z_]+)'", source))
    else:  # the tables' own SQL: named CHECKs, and Django's column checks
        source = " ".join(
            catalog_texts(
                "SELECT sql FROM sqlite_master WHERE name IN "
                "('feishu_inbox_eventjob', 'feishu_inbox_partition')"
            )
        )
        held = set(re.findall(r'CONSTRAINT "(feishu_inbox_[a-z_]+)" CHECK', source))
        held |= {
            f"{EventJob._meta.db_table}_{column}_check"
            for column in re.findall(r'CHECK \("([a-z_]+)" >= 0\)', source)
            + re.findall(r'CHECK \(\(JSON_VALID\("([a-z_]+)"\)', source)  # JSONField's
        }
    assert held == declared


def test_a_job_holds_a_lease_exactly_while_running() -> None:
    job = _queued()
    rule = "feishu_inbox_job_lease_iff_running"
    refused(EventJob, job, rule, status=Status.RUNNING)  # running without a lease
    refused(EventJob, job, rule, lease_token="t")  # a token while queued
    [claimed] = ledger.claim("w")
    assert claimed.id == job
    refused(EventJob, job, rule, worker_id="")  # running without a worker
    refused(EventJob, job, rule, lease_token="")  # ... without a token
    refused(EventJob, job, rule, lease_until=None)  # ... without an expiry
    refused(EventJob, job, rule, status=Status.QUEUED)  # a lease left on a queued job
    assert ledger.finish(claimed.lease) == "completed"  # the fenced end clears it together


@pytest.mark.parametrize("field", ["attempt", "effects_in_flight", "replays", "max_attempts"])
def test_a_job_count_is_never_negative(field: str) -> None:
    job = _queued()
    refused(EventJob, job, f"{EventJob._meta.db_table}_{field}_check", **{field: -1})
    EventJob.objects.filter(id=job).update(**{field: 0})
    if field == "max_attempts":
        EventJob.objects.filter(id=job).update(max_attempts=None)  # NULL passes, as in a CHECK


def test_a_partition_has_a_head_exactly_when_busy() -> None:
    _queued()
    rule = "feishu_inbox_partition_head_iff_busy"
    refused(Partition, "c", rule, head_id=None)  # queued without a head
    refused(Partition, "c", rule, head_state="idle")  # idle with a head
    with pytest.raises(IntegrityError), transaction.atomic():
        Partition.objects.create(key="new", head_state="idle", head_id=7)
    assert not Partition.objects.filter(key="new").exists()
    Partition.objects.create(key="new", head_state="idle", head_id=None)


def test_a_new_job_row_is_checked_too() -> None:
    """An insert is checked as an update is (a row written outside the ledger)."""
    job = EventJob.objects.get(id=_queued())
    fields = {
        f.attname: getattr(job, f.attname)
        for f in EventJob._meta.concrete_fields
        if not f.primary_key
    }
    with pytest.raises(IntegrityError), transaction.atomic():
        EventJob.objects.create(**{**fields, "dedupe_key": "other", "status": Status.RUNNING})
    assert EventJob.objects.count() == 1
