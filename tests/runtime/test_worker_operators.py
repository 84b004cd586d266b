"""Operators and retry policies against real ``runworker`` processes: cancel a running job,
replay jobs whose handler arrived late, RetryAt honoured to the second."""

from __future__ import annotations

import random
import subprocess
import sys
import time

import pytest

from feishu_inbox import ledger
from feishu_inbox.models import Attempt, EventJob
from tests.support.processes import ROOT, subprocess_env, wait_for
from tests.support.worker_helpers import Workers, enqueue, job

pytestmark = pytest.mark.django_db(transaction=True)


def test_cancel_stops_a_running_job_at_its_next_checkpoint_within_two_seconds(
    workers: Workers,
) -> None:
    running = enqueue("c1", ["checkpoints:30", "effect"])
    behind = enqueue("c2", [])  # same chat: runs once the cancelled job ends
    workers.start()
    wait_for(lambda: workers.lines("start", "c1"), 30, "the handler to start")
    asked = time.monotonic()
    assert ledger.cancel([running]).pending == [running]
    wait_for(lambda: job(running).status == "completed", 30, "the cancelled job to end")
    # The promise (docs/operating.md): the worker looks twice a second (at once on PostgreSQL)
    # and the handler checkpoints every 0.02 s: at most ~0.5 s idle, and 2 s is four times it.
    assert time.monotonic() - asked < 2.0
    row = job(running)
    assert (row.error_type, row.side_effect_started) == ("Cancelled", False)
    assert not workers.lines("effect", "c1")
    wait_for(lambda: job(behind).status == "completed", 10, "the chat to move on")
    assert Attempt.objects.filter(job_id=running).count() == 1  # never retried


def test_cancel_racing_the_jobs_own_finish_ends_in_exactly_one_outcome(workers: Workers) -> None:
    ids = [enqueue(f"r{i}", ["work:0.2", "checkpoint"], partition=f"chat-{i}") for i in range(12)]
    workers.start("--concurrency", "4")
    outcomes = {}
    for i, job_id in enumerate(ids):
        wait_for(lambda job_id=job_id: job(job_id).status != "queued", 30, f"r{i} to start")
        time.sleep(random.uniform(0, 0.35))  # a random moment around its end: the race
        outcomes[job_id] = ledger.cancel([job_id])
    wait_for(lambda: EventJob.objects.completed().count() == 12, 30, "every job to end")
    for job_id, outcome in outcomes.items():
        row = job(job_id)
        assert Attempt.objects.filter(job_id=job_id).count() == 1, job_id  # one end, one run
        if job_id in outcome.refused:  # it had finished: the cancel came too late
            assert outcome.refused[job_id].code == "invalid_state"
            assert row.error_type == ""
        else:  # asked to stop: it did, or finished first; never both, never again
            assert outcome.pending == [job_id]
            assert row.error_type in ("", "Cancelled")


def test_replay_runs_jobs_that_arrived_before_their_handler_once_in_order(
    workers: Workers,
) -> None:
    ids = [enqueue(f"l{i}", [], event_type="test.late") for i in range(3)]
    assert workers.start("--burst").wait(60) == 0
    assert {job(i).error_type for i in ids} == {"NoHandler"}
    assert "no handler for event type test.late" in workers.stderr(workers.procs[0])
    replay = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "inbox",
            "replay",
            "--error",
            "NoHandler",
            "--event-type",
            "test.late",
            "--since",
            "1h",
            "--json",
        ],
        cwd=ROOT,
        env=subprocess_env(FEISHU_INBOX_HANDLERS="tests.support.worker_handlers"),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert '"refused": []' in replay.stdout
    assert EventJob.objects.filter(event_type="test.late", status="queued").count() == 3
    proc = workers.start(
        "--burst", FEISHU_INBOX_HANDLERS="tests.support.worker_handlers,tests.support.late_handlers"
    )
    assert proc.wait(60) == 0
    ran = workers.lines("late")
    assert [line[1] for line in ran] == ["l0", "l1", "l2"]  # once each, in receipt order
    replayed = EventJob.objects.filter(event_type="test.late")
    assert set(replayed.values_list("status", "error_type", "resolution")) == {
        ("completed", "", "replayed")
    }
    assert Attempt.objects.filter(job__event_type="test.late").count() == 6  # histories kept


@pytest.mark.parametrize("step", ["retry_after:3", "retry_at:3"])
def test_retry_at_is_honoured_to_the_second(workers: Workers, step: str) -> None:
    job_id = enqueue("t", [step])
    workers.start()
    wait_for(lambda: job(job_id).status == "completed", 30, "the retried job")
    first, second = Attempt.objects.filter(job_id=job_id).order_by("number")
    assert (first.outcome, first.error_type) == (
        "retry_wait",
        step.split(":")[0].title().replace("_", ""),
    )
    gap = (second.started_at - first.ended_at).total_seconds()
    assert 2.0 <= gap <= 4.0, gap


def test_a_handlers_retry_policy_bounds_its_attempts(workers: Workers) -> None:
    job_id = enqueue("p", [], event_type="test.policy")  # stored knowing its policy…
    assert job(job_id).max_attempts is None  # …but this process has not loaded it
    EventJob.objects.filter(pk=job_id).update(max_attempts=2)  # as the webhook would store it
    workers.start(FEISHU_INBOX_HANDLERS="tests.support.worker_handlers,tests.support.late_handlers")
    wait_for(lambda: job(job_id).status == "failed", 30, "the attempts to run out")
    history = list(Attempt.objects.filter(job_id=job_id).order_by("number"))
    assert [a.outcome for a in history] == ["retry_wait", "failed"]
    gap = (history[1].started_at - history[0].ended_at).total_seconds()
    assert 0.09 <= gap < 2.0, gap  # the fixed 0.2 s delay, jittered down at most half
