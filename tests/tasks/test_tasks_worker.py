"""django.tasks tasks on real ``runworker`` subprocesses (SPEC §9): beside Feishu events, by
queue, retried by their own policy, recovered by lease expiry after SIGKILL, woken by NOTIFY.
"""

from __future__ import annotations

import itertools
import json
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from feishu_inbox import ledger
from feishu_inbox.models import EventJob
from feishu_inbox.tasks import jobs as task_jobs
from feishu_inbox.tasks import ordering_key
from feishu_inbox.tasks.framework import framework
from tests.support import worker_tasks as t
from tests.support.processes import wait_for
from tests.support.worker_helpers import Workers, enqueue, job

fw = framework()
Status = fw.TaskResultStatus

pytestmark = pytest.mark.django_db(transaction=True)


def status(result: object) -> str:
    return str(fw.task_backends["default"].get_result(result.id).status)  # type: ignore[attr-defined]


def test_one_worker_runs_feishu_events_and_tasks(workers: Workers) -> None:
    event = enqueue("ev-a", [])
    added, email = t.add.enqueue(20, 22), t.send_email.enqueue("c@example.com")
    workers.start()
    wait_for(lambda: status(added) == status(email) == Status.SUCCESSFUL, 30, "the tasks")
    wait_for(lambda: job(event).status == "completed", 30, "the event")
    assert t.add.get_result(added.id).return_value == 42
    assert workers.lines("email", "c@example.com")
    # `inbox show` of a task shows its return value, as the admin does (issue 55).
    out = StringIO()
    call_command("inbox", "show", added.id, "--json", stdout=out)
    assert json.loads(out.getvalue())["return_value"] == 42


def test_a_queue_worker_leaves_other_queues_and_events_alone(workers: Workers) -> None:
    event = enqueue("ev-b", [])
    added, email = t.add.enqueue(1, 2), t.send_email.enqueue("d@example.com")
    proc = workers.start("--queue", "emails")
    wait_for(lambda: status(email) == Status.SUCCESSFUL, 30, "the emails task")
    wait_for(lambda: "only tasks of queues emails" in workers.stderr(proc), 10, "the start line")
    assert status(added) == Status.READY and job(event).status == "queued"
    workers.start("--queue", "default")
    wait_for(lambda: status(added) == Status.SUCCESSFUL, 30, "the default task")
    assert job(event).status == "queued"  # Feishu events need a worker without --queue


def test_tasks_of_one_ordering_key_run_one_at_a_time_in_enqueue_order(
    workers: Workers,
) -> None:
    with ordering_key("user:1"):
        ordered = [t.logged.enqueue(f"o{i}", 0.05) for i in range(6)]
    free = [t.logged.enqueue(f"f{i}", 0.05) for i in range(6)]
    workers.start("--concurrency", "4")
    wait_for(lambda: all(status(r) == Status.SUCCESSFUL for r in ordered + free), 60, "every task")
    starts = {line[1]: int(line[3]) for line in workers.lines("task_start")}
    ends = {line[1]: int(line[3]) for line in workers.lines("task_end")}
    names = [f"o{i}" for i in range(6)]
    for earlier, later in itertools.pairwise(names):
        assert ends[earlier] <= starts[later], (earlier, later)  # one at a time, in order


def test_a_task_is_retried_by_its_own_policy(workers: Workers) -> None:
    result = t.flaky.enqueue("f", 2)  # fails twice; its policy allows 3 attempts
    assert job(EventJob.objects.get(event_id=result.id).pk).max_attempts == 3
    workers.start()
    wait_for(lambda: status(result) == Status.SUCCESSFUL, 30, "the third attempt")
    got = t.flaky.get_result(result.id)
    assert got.return_value == "f after 3" and got.attempts == 3
    assert [e.exception_class for e in got.errors] == [RuntimeError, RuntimeError]


def test_a_task_past_its_timeout_is_stopped_and_fails(workers: Workers) -> None:
    result = t.hangs.enqueue(60)
    workers.start(FEISHU_INBOX_POLL_INTERVAL="0.1")
    wait_for(lambda: status(result) == Status.FAILED, 60, "the task to be stopped")
    row = EventJob.objects.get(event_id=result.id)
    assert row.error_type.endswith("TimedOut") and "timeout of 1.5s" in row.error_message
    # The promise: stopped at its timeout (1.5 s) and a second of grace, about 2.5 s idle; not
    # stopped, it would run its 60 s. The bound is three times the idle figure.
    assert (row.finished_at - row.claimed_at).total_seconds() < 8


def test_a_task_killed_mid_run_is_recovered_by_lease_expiry(workers: Workers) -> None:
    result = t.gated.enqueue("g")  # two attempts
    first = workers.start("--lease-seconds", "2")
    wait_for(lambda: workers.lines("task_start", "g"), 30, "the task to start")
    assert status(result) == Status.RUNNING
    first.kill()  # SIGKILL: no hand back, no finish
    first.wait(10)
    workers.open_gate("g")
    workers.start("--lease-seconds", "2")
    wait_for(lambda: status(result) == Status.SUCCESSFUL, 30, "lease expiry and a second run")
    got = t.gated.get_result(result.id)
    assert got.attempts == 2 and got.worker_ids[0] != got.worker_ids[1]
    assert [e.exception_class_path for e in got.errors] == ["feishu_inbox.task_jobs.LeaseExpired"]
    assert got.errors[0].exception_class is task_jobs.LeaseExpired
    starts = workers.lines("task_start", "g")
    assert len(starts) == 2 and starts[0][2] != starts[1][2]


def test_a_task_killed_on_its_last_attempt_ends_failed_not_running(workers: Workers) -> None:
    result = t.logged.enqueue("k", 60.0)  # one attempt; it runs a minute
    first = workers.start("--lease-seconds", "2")
    wait_for(lambda: workers.lines("task_start", "k"), 30, "the task to start")
    first.kill()
    first.wait(10)
    workers.start("--lease-seconds", "2")
    wait_for(lambda: status(result) == Status.FAILED, 30, "lease expiry")
    [error] = t.logged.get_result(result.id).errors
    assert error.exception_class is task_jobs.WorkerCrashed
    assert "stopped renewing its lease" in error.traceback


def test_a_task_killed_inside_an_effect_is_unknown_for_an_operator(workers: Workers) -> None:
    result = t.gated_effect.enqueue("e")
    first = workers.start("--lease-seconds", "2")
    wait_for(lambda: workers.lines("in_effect", "e"), 30, "the effect to start")
    first.kill()
    first.wait(10)
    workers.open_gate("e")
    workers.start("--lease-seconds", "2")
    job_id = EventJob.objects.get(event_id=result.id).pk
    wait_for(lambda: job(job_id).status == "unknown", 30, "lease expiry")
    assert status(result) == Status.FAILED  # it will not run again by itself
    assert ledger.reconcile([job_id], applied=True).done
    assert status(result) == Status.SUCCESSFUL


def test_a_committed_enqueue_wakes_an_idle_worker_at_once(
    workers: Workers, postgres_only: None
) -> None:
    """NOTIFY is delivered at commit: the worker, asleep on LISTEN (and told to poll only every
    30 s), starts the task well within that; before the commit nobody can see it."""
    proc = workers.start(FEISHU_INBOX_POLL_INTERVAL="30")
    wait_for(_worker_listens, 30, "the worker to LISTEN")
    warm = t.add.enqueue(0, 0)
    wait_for(lambda: status(warm) == Status.SUCCESSFUL, 30, "the first task")
    latencies = []
    for _ in range(5):
        with transaction.atomic():
            result = t.stamp.enqueue()
            assert _claimable_elsewhere() == 0  # uncommitted: invisible to other connections
            started = time.monotonic_ns()
        wait_for(lambda r=result: status(r) == Status.SUCCESSFUL, 10, "the woken worker")
        stamp = int(workers.lines("stamp")[-1][2])
        latencies.append((stamp - started) / 1e9)
    assert proc.poll() is None
    # The median: NOTIFY wakes the worker at commit, tens of milliseconds idle; polling would
    # take up to 30 s. 2 s is far from both, and room for a machine whose every core is busy.
    assert sorted(latencies)[2] < 2.0, latencies


def _worker_listens() -> bool:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE 'LISTEN %%'"
        )
        return bool(cur.fetchone()[0])


def _claimable_elsewhere() -> int:
    """Queued tasks another connection sees (a fresh connection, outside this transaction)."""
    import psycopg

    params = connection.get_connection_params()
    params = {k: v for k, v in params.items() if k in ("dbname", "user", "host", "port")}
    with psycopg.connect(**params) as other:
        row = other.execute(
            "SELECT count(*) FROM feishu_inbox_eventjob WHERE app = %s AND status = 'queued'",
            [task_jobs.APP],
        ).fetchone()
    return int(row[0]) if row else 0
