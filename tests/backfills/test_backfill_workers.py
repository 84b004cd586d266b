"""Backfills on real ``runworker`` processes (SPEC §9i, invariant 12): 200,000 rows with the
worker SIGKILLed five times end with every row written exactly once (each batch adds one to
the row's counter), at the configured rate ±10%, in bounded memory; a pause holds on a live
worker and a resume goes on from the cursor; a stuck batch is reported stalled within its
window, and the report clears when batches commit again."""

from __future__ import annotations

import os
import signal
import statistics
import time
from collections import Counter
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db.models import F
from django.utils import timezone

from feishu_inbox import backfills
from feishu_inbox.models import EventJob
from feishu_inbox.monitoring import ledger_metrics
from feishu_inbox.tables.backfills import Backfill
from tests.support import backfill_jobs
from tests.support.backfill_helpers import rss, start_worker
from tests.support.backfill_jobs import Row
from tests.support.processes import wait_for
from tests.support.worker_helpers import Workers

pytestmark = pytest.mark.django_db(transaction=True)

ROWS, KILLS = 200_000, 5
#: 4 batches a second: a pace a worker keeps on a shared 2-core machine under CI's load (at 10
#: a second, 5,000 rows/s, two of five CI runs measured medians of 2,925 and 3,971 rows/s: the
#: CPU the worker got, not its pacing, set them; at 20 a second, with a load average of 12,
#: likewise).
RATE, BATCH = 2_000, 500
#: The last worker's pace, after the five kills: the rest of the table at whatever speed the
#: machine gives (its memory is what is measured there, not its pace).
SURVIVOR_RATE = 100_000
#: The rows a rate is measured over, between two kills (5 s at the rate: 20 batches, so that
#: the bucket's burst of one batch early is 5% of a window, under the 10% allowed).
WINDOW = 10_000
#: How much a worker's memory may grow over its last 50,000+ rows (a batch holds 500 keys).
RSS_GROWTH = 8 * 1024 * 1024


def backfill(name: str = "test.fill") -> Backfill:
    """The row as the workers committed it (the test's connection is in autocommit: each
    read sees the latest commit, without the cost of a new connection per poll)."""
    return Backfill.objects.get(name=name)


def measure_rate(rows: int) -> float:
    """Rows per second over the next ``rows`` rows, from the moment a batch commits."""
    first = backfill().rows_done
    wait_for(lambda: backfill().rows_done > first, 60, "a batch to commit")
    start_rows, started = backfill().rows_done, time.monotonic()
    wait_for(lambda: backfill().rows_done >= start_rows + rows, 60, f"{rows} more rows")
    return (backfill().rows_done - start_rows) / (time.monotonic() - started)


@pytest.mark.timeout(600)
def test_200000_rows_through_five_sigkills_each_written_once_at_the_rate_in_bounded_memory(
    table: Any, workers: Workers
) -> None:
    backfill_jobs.fill_table(ROWS)
    env = {"BACKFILL_TEST_RATE": str(RATE), "BACKFILL_TEST_BATCH": str(BATCH)}
    backfills.start("test.fill")
    rates = []
    for _ in range(KILLS):
        worker = start_worker(workers, **env)
        rates.append(measure_rate(WINDOW))
        os.kill(worker.pid, signal.SIGKILL)  # wherever it is: between batches or inside one
        worker.wait(10)
    survivor = start_worker(workers, **{**env, "BACKFILL_TEST_RATE": str(SURVIVOR_RATE)})
    # Its memory from its tenth batch on (its start, imports and first claims are behind it).
    warm = backfill().rows_done + 10 * BATCH
    wait_for(lambda: backfill().rows_done >= warm, 60, "the survivor's first batches")
    samples = []
    while (now := backfill()).state == "running":
        assert survivor.poll() is None, workers.stderr(survivor)
        samples.append((now.rows_done, rss(survivor.pid)))
        time.sleep(0.05)  # the interval of the memory samples, not synchronisation
    baseline, peak = samples[0][1], max(m for _, m in samples)
    assert samples[-1][0] - samples[0][0] >= 50_000, samples  # sampled over half the table
    done = backfill()
    assert (done.state, done.rows_done) == ("applied", ROWS)
    # Every row written exactly once, through five kills.
    assert Counter(Row.objects.values_list("counter", flat=True)) == {1: ROWS}
    assert not Row.objects.exclude(value=F("id") * 2).exists()
    # At the configured rate, whichever worker ran it: never faster than it by more than 10%
    # in any window (the shared bucket's promise), and its median window within 10% of it (a
    # window can run slower only where the machine starved the worker of CPU).
    assert all(r <= RATE * 1.10 for r in rates), rates
    assert abs(statistics.median(rates) - RATE) <= RATE * 0.10, rates
    # Memory: flat over the survivor's rows (batches of keys, never the table).
    assert peak - baseline <= RSS_GROWTH, (baseline, peak)
    job = EventJob.objects.get(pk=done.job_id)
    assert job.status == "completed" and job.attempt >= KILLS + 1


@pytest.mark.timeout(300)
def test_pause_holds_on_a_live_worker_and_resume_goes_on_from_the_cursor(
    table: Any, workers: Workers
) -> None:
    backfill_jobs.fill_table(20_000)
    start_worker(workers, BACKFILL_TEST_RATE="2000", BACKFILL_TEST_BATCH="100")
    first = backfills.start("test.fill")
    wait_for(lambda: backfill().rows_done >= 4000, 60, "4,000 rows")
    backfills.pause("test.fill")
    job = EventJob.objects.get(pk=first_job(first))
    wait_for(lambda: EventJob.objects.get(pk=job.pk).status == "completed", 30, "its job to stop")
    paused = backfill()
    assert paused.state == "paused" and 4000 <= paused.rows_done < 20_000
    assert paused.cursor == paused.rows_done  # ids 1..n: the cursor is the last row done
    held_until = time.monotonic() + 1.0  # a second of a live worker at 20 batches a second
    while time.monotonic() < held_until:
        assert backfill().rows_done == paused.rows_done
        time.sleep(0.05)  # the interval of the observation, not synchronisation
    assert Row.objects.filter(counter=1).count() == paused.rows_done
    assert not Row.objects.filter(pk__gt=paused.cursor, counter__gt=0).exists()
    backfills.resume("test.fill")
    wait_for(lambda: backfill().state == "applied", 60, "the resumed backfill to finish")
    assert Counter(Row.objects.values_list("counter", flat=True)) == {1: 20_000}
    assert backfill().batches == 200  # the resumed job began at the cursor, not row 1


def first_job(progress: Any) -> int:
    return int(Backfill.objects.get(name=progress.name).job_id)


def stalled_gauge(name: str) -> float | None:
    collector = ledger_metrics()
    collector.cache_seconds = 0.0
    for family in collector.collect():
        if family.name == "feishu_inbox_backfill_stalled":
            for sample in family.samples:
                if sample.labels.get("backfill") == name:
                    return float(sample.value)
    return None


@pytest.mark.timeout(300)
def test_a_stuck_batch_is_reported_stalled_within_its_window(
    table: Any, workers: Workers, tmp_path: Path
) -> None:
    backfill_jobs.fill_table(1000)
    hold = tmp_path / "hold"
    hold.touch()  # test.hang's batches wait while it exists (stall window: 2 s)
    start_worker(workers, lease="30")
    backfills.start("test.hang")
    wait_for((tmp_path / "holding").exists, 30, "a batch to begin, and hang")

    def check() -> str:
        """What the deploy gate says of it: reported stalled, though it blocks no deploy
        (no migration to apply needs it)."""
        out = StringIO()
        call_command("inbox", "backfills", "check", stdout=out)
        line = next(line for line in out.getvalue().splitlines() if "test.hang" in line)
        return "stalled" if "STALLED" in line and "[backfill_stalled]" in out.getvalue() else ""

    def stalled_since() -> tuple[bool, float]:
        """Whether it reads stalled, and the seconds since its start after the read (read
        before it, the seconds can be a few milliseconds short of what the read saw)."""
        stalled = backfills.status("test.hang").stalled
        return stalled, (timezone.now() - backfill("test.hang").started_at).total_seconds()

    found, since = stalled_since()
    assert not found or since >= 2.0, since  # never before its 2 s window
    wait_for(lambda: stalled_since()[0], 30, "the stall to be reported")
    # Within its window: not before 2 s without a batch, and from then on to every reader (the
    # stall is read from the row: the CLI, the admin, the metrics agree). How soon after 2 s
    # a reader looks is the test's polling, not the ledger's: no upper bound here.
    found, since = stalled_since()
    assert found and since >= 2.0, since
    assert check() == "stalled" and stalled_gauge("test.hang") == 1.0
    hold.unlink()
    wait_for(lambda: backfill("test.hang").state == "applied", 60, "the batches to go on")
    assert not backfills.status("test.hang").stalled and stalled_gauge("test.hang") == 0.0
    assert Counter(Row.objects.values_list("counter", flat=True)) == {1: 1000}


@pytest.mark.timeout(300)
def test_a_worker_killed_after_its_batchs_writes_leaves_neither_them_nor_the_cursor(
    table: Any, workers: Workers, tmp_path: Path
) -> None:
    """Invariant 12: the batch's writes and the cursor's move are one commit."""
    backfill_jobs.fill_table(1000)
    hold = tmp_path / "hold"
    hold.touch()  # three batches commit; the fourth writes its 100 rows, then waits
    worker = start_worker(workers)
    backfills.start("test.write_then_hang")
    wait_for((tmp_path / "holding").exists, 30, "the fourth batch to write and hang")
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(10)
    killed = backfill("test.write_then_hang")
    assert (killed.cursor, killed.rows_done, killed.state) == (300, 300, "running")
    counted = Counter(Row.objects.values_list("counter", flat=True))
    assert counted == {1: killed.rows_done, 0: 1000 - killed.rows_done}  # its writes: gone
    hold.unlink()
    start_worker(workers)
    wait_for(lambda: backfill("test.write_then_hang").state == "applied", 60, "the rest")
    assert Counter(Row.objects.values_list("counter", flat=True)) == {1: 1000}
    assert not Row.objects.exclude(value=F("id") * 2).exists()
