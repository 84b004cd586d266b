"""Backfills in one process (SPEC §9i, invariant 12): declared, started, paced into batches
whose writes and cursor commit together, paused, resumed, cancelled, run again, refused with
their codes; the deploy gate's list; progress and stalls. Their worker processes, SIGKILLed,
are in ``test_backfill_workers.py``; ``migrate``'s refusal in ``test_migrate_gate.py``."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.db.models import F
from django.test import override_settings
from django.utils import timezone

from feishu_inbox import backfills
from feishu_inbox.backfills import control, running
from feishu_inbox.backfills.declared import BackfillSpec
from feishu_inbox.backfills.refusals import REFUSALS
from feishu_inbox.errors import CATALOGUE, ConfigurationError
from feishu_inbox.models import EventJob
from feishu_inbox.tables.backfills import Backfill
from tests.support import backfill_jobs
from tests.support.backfill_jobs import Row

pytestmark = pytest.mark.django_db(transaction=True)


def burst() -> None:
    call_command("runworker", "--burst", "--concurrency", "1", "-v", "0")


def counters() -> Counter[int]:
    return Counter(Row.objects.values_list("counter", flat=True))


def row_of(name: str) -> Backfill:
    return Backfill.objects.get(name=name)


def test_every_refusal_has_a_catalogued_code_and_fix() -> None:
    for cls in REFUSALS:
        meaning, fix = CATALOGUE[cls.code]
        assert meaning.endswith(".") and fix, cls.code
    codes = {cls.code for cls in REFUSALS}
    assert {
        "backfill_pending",
        "backfill_running",
        "backfill_applied",
        "backfill_stalled",
        "backfill_unknown",
        "backfill_migration_pending",
        "backfill_environment",
        "export_row_invalid",
        "export_part_too_large",
    } <= codes


def test_a_declaration_names_each_of_its_problems() -> None:
    with pytest.raises(ConfigurationError) as caught:
        BackfillSpec("x", Row, work=lambda b: None, batch_size=0, rows_per_second=-1, takes="all")
    text = str(caught.value)
    assert "batch_size" in text and "rate" in text and "takes" in text
    with pytest.raises(ConfigurationError, match="not both"):
        BackfillSpec("x", Row, work=lambda b: None, rows_per_second=1, batches_per_second=1)
    with pytest.raises(ConfigurationError, match="app_label"):
        backfills.backfill("x", Row, after="no-dot")(lambda b: None)


def test_a_backfill_fills_every_row_once_in_keyset_batches(table: Any) -> None:
    backfill_jobs.fill_table(2345)
    started = backfills.start("test.fill")
    assert started.state == "running" and started.total_estimate is not None
    assert abs(started.total_estimate - 2345) <= 2345 * 0.5  # the planner's, on PostgreSQL
    burst()
    assert counters() == {1: 2345}
    assert not Row.objects.exclude(value=F("id") * 2).exists()
    done = row_of("test.fill")
    assert (done.state, done.rows_done, done.batches, done.cursor) == ("applied", 2345, 5, 2345)
    p = control.status("test.fill")
    assert p.total_estimate == 2345 and p.eta_seconds is None and not p.stalled
    job = EventJob.objects.get(pk=done.job_id)
    assert (job.status, job.event_type, job.partition_key) == (
        "completed",
        "backfill:test.fill",
        "backfill:test.fill",
    )


def test_a_second_start_is_refused_and_an_applied_one_runs_again_only_when_forced(
    table: Any,
) -> None:
    backfill_jobs.fill_table(100)
    backfills.start("test.fill")
    with pytest.raises(backfills.BackfillRunning) as running_error:
        backfills.start("test.fill")
    assert running_error.value.described().startswith("[backfill_running]")
    burst()
    with pytest.raises(backfills.BackfillApplied):
        backfills.start("test.fill")
    assert counters() == {1: 100}
    again = backfills.start("test.fill", force=True)
    assert again.run == 2 and again.rows_done == 0
    burst()
    assert counters() == {2: 100}
    assert row_of("test.fill").forced


def test_a_backfill_waits_for_the_migration_it_needs_and_its_environment(table: Any) -> None:
    with pytest.raises(backfills.BackfillMigrationPending, match=r"demo\.9999_not_yet"):
        backfills.start("test.after_future")
    with pytest.raises(backfills.BackfillUnknown):
        backfills.start("test.never_declared")
    production = override_settings(FEISHU_INBOX={"ENVIRONMENT": "production"})
    with production, pytest.raises(backfills.BackfillEnvironment, match="staging"):
        backfills.start("test.only_staging")
    assert not Backfill.objects.exists()  # nothing changed
    with override_settings(FEISHU_INBOX={"ENVIRONMENT": "staging"}):
        backfills.start("test.fill")
        backfills.pause("test.fill")
    production = override_settings(FEISHU_INBOX={"ENVIRONMENT": "production"})
    with production, pytest.raises(backfills.BackfillEnvironment, match="started in 'staging'"):
        backfills.resume("test.fill")
    assert row_of("test.fill").state == "paused"


def test_pause_holds_at_the_cursor_and_resume_goes_on_from_it(table: Any) -> None:
    backfill_jobs.fill_table(1200)
    backfills.start("test.fill")
    # Two batches commit, as a worker would run them; then the pause.
    spec = backfills.get("test.fill")
    assert spec is not None
    for _ in range(2):
        assert running.run_batch(spec, row_of("test.fill")).rows == 500
    backfills.pause("test.fill")
    burst()  # the job finds it paused: it stops before a batch
    paused = row_of("test.fill")
    assert (paused.state, paused.rows_done, paused.cursor) == ("paused", 1000, 1000)
    assert counters() == {1: 1000, 0: 200}
    with pytest.raises(backfills.BackfillRunning):
        backfills.start("test.fill")
    backfills.resume("test.fill")
    burst()
    assert counters() == {1: 1200}
    assert row_of("test.fill").state == "applied"
    assert EventJob.objects.filter(event_type="backfill:test.fill").count() == 2


def test_a_batch_that_raises_rolls_back_whole_and_resume_goes_on_once_it_is_fixed(
    table: Any,
) -> None:
    backfill_jobs.fill_table(50)
    Row.objects.filter(pk=25).update(label="boom")
    backfills.start("test.explodes")
    burst()
    failed = row_of("test.explodes")
    assert (failed.state, failed.rows_done, failed.cursor) == ("failed", 20, 20)
    assert "row 25 is boom" in failed.error
    # Rows 21..24 were counted inside the batch that raised: rolled back with it.
    assert counters() == {1: 20, 0: 30}
    job = EventJob.objects.get(pk=failed.job_id)
    assert (job.status, job.error_type) == ("completed", "BackfillFailed")
    Row.objects.filter(pk=25).update(label="fixed")
    backfills.resume("test.explodes")
    burst()
    assert counters() == {1: 50}
    assert row_of("test.explodes").state == "applied"


def test_a_batch_read_from_a_stale_cursor_lands_nothing(table: Any) -> None:
    """Two runners of one batch (a zombie worker whose lease was taken over): the cursor's
    compare-and-set lets one commit; the other's writes roll back with it."""
    backfill_jobs.fill_table(1000)
    backfills.start("test.fill")
    spec = backfills.get("test.fill")
    assert spec is not None
    stale = row_of("test.fill")
    assert running.run_batch(spec, stale).rows == 500
    assert running.run_batch(spec, stale).stopped
    assert counters() == {1: 500, 0: 500}
    assert row_of("test.fill").rows_done == 500


def test_cancel_stops_it_and_a_start_begins_again_from_the_first_row(table: Any) -> None:
    backfill_jobs.fill_table(600)
    backfills.start("test.fill")
    spec = backfills.get("test.fill")
    assert spec is not None
    running.run_batch(spec, row_of("test.fill"))
    backfills.cancel("test.fill")
    burst()
    assert counters() == {1: 500, 0: 100}
    with pytest.raises(backfills.BackfillError, match="cancelled"):
        backfills.resume("test.fill")
    backfills.start("test.fill")
    burst()
    assert counters() == {2: 500, 1: 100}


def test_progress_eta_and_a_stall_past_its_window(table: Any) -> None:
    backfill_jobs.fill_table(10)
    backfills.start("test.fill")
    long_ago = timezone.now() - timedelta(seconds=700)
    Backfill.objects.filter(name="test.fill").update(
        rows_done=4,
        total_estimate=10,
        rate=2.0,
        last_batch_at=long_ago,
        started_at=long_ago,
        resumed_at=long_ago,
    )
    p = control.status("test.fill")
    assert (p.eta_seconds, p.stalled) == (3.0, True)  # 600 s by default
    found = {g.progress.name: g for g in backfills.pending()}
    error = found["test.fill"].error
    assert error is not None and error.code == "backfill_stalled"
    assert not found["test.fill"].blocks  # reported; holds back no migration to apply
    Backfill.objects.filter(name="test.fill").update(stall_seconds=800)
    assert not control.status("test.fill").stalled


def test_the_gate_lists_what_is_pending_and_exits_1_only_for_a_migration_to_apply_that_needs_it(
    table: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``check`` blocks a deploy only when ``migrate`` would apply a migration that needs a
    backfill not applied: the deploy that ships a backfill ahead of that migration passes."""
    call_command("inbox", "backfills", "check")  # none names a migration to apply
    out = capsys.readouterr().out
    assert "test.fill  pending" in out and "holds back no migration to apply" in out
    # A declaration whose ``before`` is on disk and not applied (as in the deploy that ships
    # the NOT NULL migration): the recorder is the truth migrate reads, and is put back.
    leaf = MigrationLoader(connection).graph.leaf_nodes("demo")[0]
    recorder = MigrationRecorder(connection)
    backfills.register(BackfillSpec("test.gate", Row, work=fill_counter, before=leaf))
    recorder.record_unapplied(*leaf)
    try:
        call_command("inbox", "backfills", "check")  # nothing to fill yet: migrate would pass
        assert "test.gate  pending" in capsys.readouterr().out
        backfill_jobs.fill_table(10)
        with pytest.raises(CommandError, match=rf"test\.gate \(for demo\.{leaf[1]}\)"):
            call_command("inbox", "backfills", "check")
        out = capsys.readouterr().out
        assert "[backfill_pending] Backfill 'test.gate' was never started; migration " in out
        with pytest.raises(CommandError):
            call_command("inbox", "backfills", "check", "--json")
        gated = {g["name"]: g for g in json.loads(capsys.readouterr().out)}
        assert gated["test.gate"]["blocks"] == ".".join(leaf)
        assert gated["test.fill"]["blocks"] is None
        call_command("inbox", "backfills", "start", "test.gate")
        burst()
        capsys.readouterr()
        call_command("inbox", "backfills", "check")
        out = capsys.readouterr().out
        assert "test.gate" not in out and "test.fill  pending" in out
    finally:
        recorder.record_applied(*leaf)
        backfills.unregister("test.gate")
    for name in [n for n in backfills.declared() if n != "test.fill"]:
        Backfill.objects.get_or_create(
            name=name, defaults={"state": "applied", "started_at": timezone.now()}
        )
    call_command("inbox", "backfills", "start", "test.fill")
    burst()
    call_command("inbox", "backfills", "check")
    assert "No backfill pending." in capsys.readouterr().out
    call_command("inbox", "backfills", "list", "--json")
    assert '"rows_done": 10' in capsys.readouterr().out
    with pytest.raises(CommandError, match=r"\[backfill_applied\]"):
        call_command("inbox", "backfills", "start", "test.fill")


def fill_counter(batch: Any) -> None:
    batch.update(counter=F("counter") + 1)


def test_a_batch_that_lands_under_the_running_job_does_not_end_it(
    table: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zombie's batch moved the cursor between the job's read of the row and its batch:
    the job's compare-and-set fails, and it goes on from the new cursor instead of ending
    with the backfill still running and no job to run it."""
    backfill_jobs.fill_table(1500)
    backfills.start("test.fill")
    spec = backfills.get("test.fill")
    assert spec is not None
    real = running.run_batch
    zombie_done = []

    def with_a_zombie(spec: Any, row: Backfill) -> running.Batch:
        if not zombie_done:
            zombie_done.append(real(spec, row_of("test.fill")))  # lands first, same cursor
        return real(spec, row)

    monkeypatch.setattr(running, "run_batch", with_a_zombie)
    burst()
    assert zombie_done[0].rows == 500
    assert counters() == {1: 1500}
    assert row_of("test.fill").state == "applied"
