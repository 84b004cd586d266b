"""Handler timeouts (SPEC §9c): real ``runworker`` processes and ``test.timed`` jobs, whose
handler has a timeout of 1.5 s. A job that hangs leaves ``running`` within its timeout and a
second; the thread it leaves behind can change nothing; a cooperative handler stops at its
checkpoint; an effect in flight makes it ``unknown``; stuck threads make the worker restart."""

from __future__ import annotations

import time

import pytest

from feishu_inbox.models import Attempt, EventJob
from tests.support.processes import wait_for
from tests.support.worker_helpers import Workers, enqueue, job

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"FEISHU_INBOX_BACKOFF_BASE": "0.1", "FEISHU_INBOX_POLL_INTERVAL": "0.1"}


def attempts(job_id: int) -> list[Attempt]:
    return list(Attempt.objects.filter(job_id=job_id).order_by("number"))


def test_a_hung_handler_is_stopped_at_its_timeout_and_its_thread_changes_nothing(
    workers: Workers,
) -> None:
    hung = enqueue("hung", ["gate:late", "effect"], partition="chat-a", event_type="test.timed")
    quick = [enqueue(f"q{i}", ["work:0.05"], partition="chat-b") for i in range(5)]
    proc = workers.start("--concurrency", "2", FEISHU_INBOX_MAX_ATTEMPTS="1", **FAST)
    wait_for(lambda: workers.lines("start", "hung"), 20, "the hung job to start")
    started = time.monotonic()
    wait_for(lambda: job(hung).status != "running", 10, "the hung job to leave running")
    took = time.monotonic() - started
    # The promise: stopped at its timeout (1.5 s) and a second of grace, noticed at a heartbeat's
    # tick: about 2.5 s on an idle machine. Not stopped, it would run until its lease (60 s)
    # expired: the bound is three times the idle figure, and far from that.
    assert took < 8, took
    assert job(hung).status == "failed"
    (attempt,) = attempts(hung)
    assert attempt.error_type == "TimedOut"
    assert "timeout of 1.5s and was stopped by the worker" in attempt.error_message
    wait_for(lambda: all(job(q).status == "completed" for q in quick), 20, "the other chat")
    # the abandoned thread wakes up and tries its effect: fenced, nothing happens
    workers.open_gate("late")
    wait_for(lambda: "lease_lost" in workers.stderr(proc), 10, "the old thread to be refused")
    assert workers.lines("effect", "hung") == []
    assert job(hung).status == "failed" and len(attempts(hung)) == 1


def test_a_cooperative_handler_stops_at_its_checkpoint_and_is_retried(workers: Workers) -> None:
    job_id = enqueue("coop", ["checkpoints:30"], event_type="test.timed")
    workers.start("--concurrency", "1", FEISHU_INBOX_MAX_ATTEMPTS="2", **FAST)
    wait_for(lambda: job(job_id).status == "failed", 20, "two timed-out attempts")
    first, second = attempts(job_id)
    for a in (first, second):
        assert a.error_type == "TimedOut"
        assert a.error_message.endswith("ran past its handler's timeout of 1.5s.")
        # The promise: it stops at the first checkpoint past its 1.5 s (one each 0.02 s): about
        # 1.55 s idle; its work would take 30 s. The upper bound is three times the idle figure.
        assert 1.4 < (a.ended_at - a.started_at).total_seconds() < 5


def test_an_effect_in_flight_at_the_timeout_makes_the_job_unknown(workers: Workers) -> None:
    job_id = enqueue("in-effect", ["effect_gate:never"], event_type="test.timed")
    workers.start("--concurrency", "1", **FAST)
    wait_for(lambda: job(job_id).status == "unknown", 20, "the job to be unknown")
    assert attempts(job_id)[0].error_type == "TimedOut"


def test_stuck_threads_make_the_worker_start_again(workers: Workers) -> None:
    stuck = [
        enqueue(f"stuck{i}", ["work:120"], partition=f"chat-{i}", event_type="test.timed")
        for i in range(2)
    ]
    proc = workers.start("--concurrency", "2", FEISHU_INBOX_MAX_ATTEMPTS="1", **FAST)
    wait_for(lambda: all(job(j).status == "failed" for j in stuck), 20, "both timed out")
    wait_for(lambda: "starting again (os.execv)" in workers.stderr(proc), 20, "a restart")
    after = enqueue("after", ["work:0"], partition="chat-z")
    wait_for(lambda: job(after).status == "completed", 30, "a job run by the new image")
    assert proc.poll() is None  # the same process (a supervisor saw no exit)
    assert workers.stderr(proc).count(" started: concurrency 2") == 2
    assert EventJob.objects.filter(status="running").count() == 0


def test_timed_out_async_handlers_are_cancelled_not_left_stuck(workers: Workers) -> None:
    stuck = [
        enqueue(f"async{i}", [], partition=f"chat-a{i}", event_type="test.async_timed")
        for i in range(2)
    ]
    proc = workers.start("--concurrency", "2", FEISHU_INBOX_MAX_ATTEMPTS="1", **FAST)
    wait_for(lambda: all(job(j).status == "failed" for j in stuck), 20, "both timed out")
    wait_for(lambda: len(workers.lines("cancelled")) == 2, 10, "both coroutines cancelled")
    assert workers.lines("end") == []  # cancelled at their await, not run to the end
    after = enqueue("after", ["work:0"], partition="chat-z")
    wait_for(lambda: job(after).status == "completed", 20, "the worker to go on")
    # Two stuck sync threads restart the worker; cancelled coroutines leave nothing stuck.
    assert "starting again (os.execv)" not in workers.stderr(proc)
    assert workers.stderr(proc).count(" started: concurrency 2") == 1
    assert all(attempts(j)[0].error_type == "TimedOut" for j in stuck)
