"""``manage.py runworker`` as a real subprocess: crashes, signals, pauses, order, supersede."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from collections import defaultdict

import pytest

from feishu_inbox import ledger
from feishu_inbox.models import Attempt, EventJob
from tests.support.outages import frozen_outside_a_write
from tests.support.processes import ROOT, subprocess_env, wait_for
from tests.support.worker_helpers import Workers, enqueue, job, lease_expired

pytestmark = pytest.mark.django_db(transaction=True)


# --- crashes --------------------------------------------------------------------------------


def test_sigkill_before_the_first_effect_runs_the_job_again(workers: Workers) -> None:
    job_id = enqueue("a", ["gate:a", "effect"])
    first = workers.start("--lease-seconds", "2")
    wait_for(lambda: workers.lines("start", "a"), 30, "the handler to start")
    first.kill()
    first.wait(10)
    workers.open_gate("a")
    workers.start("--lease-seconds", "2")
    wait_for(lambda: job(job_id).status == "completed", 30, "the job to complete")
    starts = workers.lines("start", "a")
    assert len(starts) == 2 and starts[0][2] != starts[1][2]  # two processes
    assert len(workers.lines("effect", "a")) == 1
    assert job(job_id).attempt == 2
    assert list(Attempt.objects.filter(job_id=job_id).values_list("outcome", "error_type")) == [
        ("retry_wait", "LeaseExpired"),
        ("completed", ""),
    ]


def test_sigkill_inside_an_effect_ends_unknown_and_never_runs_again(workers: Workers) -> None:
    job_id = enqueue("b", ["effect_gate:b"])
    behind = enqueue("b2", [])  # same chat: held behind the unknown job
    other = enqueue("b3", [], partition="chat-2")
    first = workers.start("--lease-seconds", "2")
    wait_for(lambda: workers.lines("in_effect", "b"), 30, "the effect to start")
    first.kill()
    first.wait(10)
    workers.open_gate("b")
    workers.start("--lease-seconds", "2")
    wait_for(lambda: job(job_id).status == "unknown", 30, "lease expiry to recover the job")
    wait_for(lambda: job(other).status == "completed", 30, "the other chat to proceed")
    row = job(job_id)
    assert row.error_type == "LeaseExpiredAfterSideEffect"
    assert len(workers.lines("start", "b")) == 1
    assert job(behind).status == "queued"  # fail closed: the chat waits for an operator
    ledger.reconcile([job_id], applied=True)
    wait_for(lambda: job(behind).status == "completed", 30, "the chat to resume")
    assert len(workers.lines("start", "b")) == 1


# --- signals --------------------------------------------------------------------------------


def test_sigterm_lets_the_running_handler_finish(workers: Workers) -> None:
    job_id = enqueue("c", ["gate:c", "effect"])
    proc = workers.start("--grace-seconds", "60")
    wait_for(lambda: workers.lines("start", "c"), 30, "the handler to start")
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "finishing running jobs" in workers.stderr(proc), 10, "the drain to begin")
    workers.open_gate("c")
    assert proc.wait(30) == 0
    assert job(job_id).status == "completed"
    assert len(workers.lines("effect", "c")) == 1


def test_sigterm_hands_back_a_job_that_started_no_effect(workers: Workers) -> None:
    job_id = enqueue("d", ["gate:d", "effect"])
    proc = workers.start("--grace-seconds", "0.5", "--lease-seconds", "60")
    wait_for(lambda: workers.lines("start", "d"), 30, "the handler to start")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    row = job(job_id)
    assert (row.status, row.attempt, row.lease_until) == ("queued", 0, None)
    workers.open_gate("d")
    assert workers.start("--burst").wait(60) == 0
    assert job(job_id).status == "completed"
    assert len(workers.lines("effect", "d")) == 1  # nothing lost, nothing duplicated


def test_a_worker_whose_heartbeat_thread_dies_stops_and_hands_its_jobs_back(
    workers: Workers,
) -> None:
    """A bug kills the heartbeat thread inside a live worker: nothing would renew its leases
    any more. The worker must not claim on as if nothing happened: it logs the thread's
    traceback, hands its running job back (no effect started: no attempt spent) before the
    lease runs out, and exits non-zero. Another worker then runs the job once."""
    job_id = enqueue("hb", ["break_heartbeat", "gate:hb", "effect"])
    proc = workers.start("--lease-seconds", "10", "--grace-seconds", "60")
    wait_for(lambda: workers.lines("start", "hb"), 30, "the handler to start")
    assert proc.wait(60) == 1, workers.stderr(proc)
    stderr = workers.stderr(proc)
    assert "the worker's feishu-heartbeat thread died" in stderr
    assert "Traceback" in stderr and "RuntimeError: a bug in the heartbeat" in stderr
    assert "its feishu-heartbeat thread died" in stderr  # the command's own last word
    row = job(job_id)
    assert (row.status, row.attempt, row.lease_until) == ("queued", 0, None)
    workers.open_gate("hb")
    assert workers.start("--burst").wait(60) == 0
    assert job(job_id).status == "completed"
    assert len(workers.lines("effect", "hb")) == 1


def test_second_signal_exits_at_once(workers: Workers) -> None:
    enqueue("e", ["gate:e"])
    proc = workers.start("--grace-seconds", "60")
    wait_for(lambda: workers.lines("start", "e"), 30, "the handler to start")
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "finishing running jobs" in workers.stderr(proc), 10, "the drain to begin")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 1


#: A stop signal that comes while the main thread holds the lock of the worker's wake-up
#: event (its ``set``, ``clear`` and ``wait`` take it, many times a second).
SIGNAL_INSIDE_A_LOCK = """
import os, signal, django
django.setup()
from feishu_inbox.runtime.worker import Worker, WorkerOptions
worker = Worker(WorkerOptions())
worker.signals.install()
with worker.flags.wake._cond:
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(100_000):  # the handler runs at one of these bytecodes: inside the lock
        pass
print("stopping" if worker.flags.stop.wait(20) else "still claiming", flush=True)
worker.signals.restore()
"""


def test_a_signal_that_comes_while_the_main_thread_holds_a_lock_stops_the_worker() -> None:
    """Python runs a signal handler on the main thread wherever it is, inside a ``with lock:``
    too. The handler used to set the worker's events itself: when the signal came while the
    main thread held one of their (not reentrant) locks, it waited for itself for ever, and
    the worker neither claimed nor exited (CI once saw a SIGTERMed worker still there 30 s
    later). Now a thread acts on it: the worker stops, and its process exits."""
    done = subprocess.run(
        [sys.executable, "-c", SIGNAL_INSIDE_A_LOCK],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopping"
    assert "SIGTERM received, finishing running jobs" in done.stderr


# --- a paused worker ----------------------------------------------------------------------------


def test_paused_worker_whose_job_was_taken_over_cannot_touch_it(workers: Workers) -> None:
    job_id = enqueue("f", ["gate:f", "effect"])
    paused = workers.start("--lease-seconds", "2")
    wait_for(lambda: workers.lines("start", "f"), 30, "the first handler to start")
    frozen_outside_a_write(paused.pid)
    wait_for(lambda: lease_expired(job_id), 30, "the paused worker's lease to expire")
    taker = workers.start("--lease-seconds", "10")
    wait_for(lambda: len(workers.lines("start", "f")) == 2, 30, "the takeover")
    workers.open_gate("f")
    wait_for(lambda: job(job_id).status == "completed", 30, "the new owner to finish")
    os.kill(paused.pid, signal.SIGCONT)
    wait_for(lambda: "lost its lease" in workers.stderr(paused), 30, "the old worker to notice")
    effects = workers.lines("effect", "f")
    assert [line[2] for line in effects] == [str(taker.pid)]
    row = job(job_id)
    assert (row.status, row.attempt, row.effects_in_flight) == ("completed", 2, 0)


# --- order across processes ------------------------------------------------------------------


def test_two_workers_keep_each_chats_receipt_order(workers: Workers) -> None:
    chats = 20
    order: dict[str, list[str]] = defaultdict(list)
    for i in range(1000):
        chat = f"chat-{i % chats}"
        enqueue(f"o{i}", ["gate:go"], partition=chat)
        order[chat].append(f"o{i}")
    procs = [workers.start("--concurrency", "4", "--burst") for _ in range(2)]
    # Both processes fill their 4 slots before anything runs, so both take part.
    wait_for(lambda: len(workers.lines("start")) == 8, 60, "both workers to fill their slots")
    workers.open_gate("go")
    for proc in procs:
        assert proc.wait(180) == 0
    assert EventJob.objects.completed().count() == 1000
    starts = {line[1]: (int(line[3]), line[2]) for line in workers.lines("start")}
    ends = {line[1]: int(line[3]) for line in workers.lines("end")}
    assert len(starts) == 1000 and len(workers.lines("start")) == 1000  # each ran once
    assert len({pid for _, pid in starts.values()}) == 2  # both processes worked
    for chat, expected in order.items():
        assert sorted(expected, key=lambda e: starts[e][0]) == expected, chat
        for earlier, later in itertools.pairwise(expected):
            assert ends[earlier] < starts[later][0], f"{earlier} and {later} overlapped"


# --- supersede, retries, handler kinds --------------------------------------------------------


def test_newer_private_messages_supersede_at_the_checkpoint(workers: Workers) -> None:
    ids = [
        enqueue(f"p{i}", ["checkpoint", "effect"], partition="dm", private=True) for i in range(3)
    ]
    assert workers.start("--burst").wait(60) == 0
    assert [job(i).error_type for i in ids] == ["Superseded", "Superseded", ""]
    assert all(job(i).status == "completed" for i in ids)
    assert [line[1] for line in workers.lines("effect")] == ["p2"]


def test_a_message_arriving_while_running_supersedes_it(workers: Workers) -> None:
    first = enqueue("q1", ["until_superseded"], partition="dm", private=True)
    workers.start()
    wait_for(lambda: workers.lines("start", "q1"), 30, "the first handler to start")
    second = enqueue("q2", ["effect"], partition="dm", private=True)
    wait_for(lambda: job(second).status == "completed", 30, "the newer message to complete")
    assert job(first).error_type == "Superseded"
    assert [line[1] for line in workers.lines("effect")] == ["q2"]


def test_failures_retry_with_backoff_then_fail(workers: Workers) -> None:
    job_id = enqueue("r", ["fail:kaboom"])
    workers.start(FEISHU_INBOX_MAX_ATTEMPTS="3", FEISHU_INBOX_BACKOFF_BASE="0.2")
    wait_for(lambda: job(job_id).status == "failed", 60, "the retries to run out")
    row = job(job_id)
    assert (row.attempt, row.error_type, row.error_message) == (3, "ValueError", "kaboom")
    history = list(Attempt.objects.filter(job_id=job_id).order_by("number"))
    assert [a.outcome for a in history] == ["retry_wait", "retry_wait", "failed"]
    gaps = [(b.started_at - a.ended_at).total_seconds() for a, b in itertools.pairwise(history)]
    assert all(g >= 0.09 for g in gaps), gaps  # base 0.2 s, jitter takes at most half


def test_async_and_sync_handlers_and_no_handler(workers: Workers) -> None:
    sync_id = enqueue("s1", ["effect"], partition="a")
    async_id = enqueue("s2", [], partition="b", event_type="test.async")
    none_id = enqueue("s3", [], partition="c", event_type="nobody.handles.this")
    assert workers.start("--burst", "--concurrency", "3").wait(60) == 0
    assert job(sync_id).status == job(async_id).status == "completed"
    assert (job(none_id).status, job(none_id).error_type) == ("completed", "NoHandler")
    assert sorted(line[1] for line in workers.lines("effect")) == ["s1", "s2"]


def test_invalid_handlers_are_one_clear_error_at_start(workers: Workers) -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "runworker", "--burst"],
        cwd=ROOT,
        env=subprocess_env(FEISHU_INBOX_HANDLERS="tests.support.bad_handlers"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "2 handlers for 'test.twice'" in done.stderr
    assert "'test.not_callable' is not callable" in done.stderr


def test_max_jobs_stops_after_that_many(workers: Workers) -> None:
    ids = [enqueue(f"m{i}", [], partition=f"chat-{i}") for i in range(5)]
    assert workers.start("--max-jobs", "2", "--concurrency", "2").wait(60) == 0
    statuses = sorted(job(i).status for i in ids)
    assert statuses == ["completed", "completed", "queued", "queued", "queued"]


def test_worker_recovers_when_the_database_drops_its_connections(workers: Workers) -> None:
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL: a server restart drops every client connection")
    first = enqueue("x1", ["effect"], partition="chat-a")
    proc = workers.start("--lease-seconds", "2")
    wait_for(lambda: job(first).status == "completed", 30, "the first job")

    def worker_sessions() -> int:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return len(cur.fetchall())

    assert worker_sessions() >= 2  # its claim/handler and LISTEN connections, all dropped
    second = enqueue("x2", ["effect"], partition="chat-b")
    wait_for(lambda: job(second).status == "completed", 60, "the worker to reconnect")
    assert proc.poll() is None  # it kept running
    assert len(workers.lines("effect", "x2")) == 1


# --- the handler threads ------------------------------------------------------------------------


def test_a_handler_thread_busy_when_the_pool_shuts_down_ends_once_it_is_done() -> None:
    """A slot's thread frees its slot before it is back in the pool (it still counts and logs
    the job's end), so a worker may close while that thread is not idle. Told to end all the
    same, it ends once its task returns: a process that ran ``runworker --burst`` (a test's,
    a site's own) keeps no thread of it. CI's Django 6 run once found two left behind."""
    import threading

    from feishu_inbox.runtime.pools import HandlerPool

    pool, busy, go_on = HandlerPool(), threading.Event(), threading.Event()
    pool.submit(lambda: (busy.set(), go_on.wait(30)))
    assert busy.wait(30)
    (still_running,) = pool.shutdown(0.05)
    go_on.set()
    still_running.join(30)
    assert not still_running.is_alive()
