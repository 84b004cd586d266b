"""The django.tasks backend's contract (SPEC §9), as the django-tasks backport tests its
database backend: enqueue, get_result, run_after, priority, queues, errors, async, context.

On Django 6 these run against ``django.tasks``, on Django 5.2 against the backport; on SQLite
and PostgreSQL alike. Tasks run in a real worker (``runworker --burst``, in this process).
"""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from feishu_inbox import ledger
from feishu_inbox.errors import InboxError
from feishu_inbox.models import Attempt, EventJob, Partition, Step
from feishu_inbox.store import store
from feishu_inbox.tasks import InvalidLedgerTask, LedgerBackend, ordering_key, retry
from feishu_inbox.tasks import jobs as task_jobs
from feishu_inbox.tasks.framework import framework
from tests.support import worker_handlers
from tests.support import worker_tasks as t
from tests.support.processes import wait_for

fw = framework()
Status = fw.TaskResultStatus

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _log_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tasks' log (worker_handlers.record) goes to the test's directory."""
    monkeypatch.setattr(worker_handlers, "DIR", tmp_path)


def run_worker(*args: str) -> None:
    """Run every due job in a real worker (this process), then return."""
    call_command("runworker", "--burst", "-v", "0", *args)


def job_of(result: Any) -> EventJob:
    return EventJob.objects.get(app=task_jobs.APP, event_id=result.id)


# --- enqueue ------------------------------------------------------------------------------


def test_the_backend_is_the_ledger_and_says_what_it_supports() -> None:
    backend = fw.task_backends["default"]
    assert isinstance(backend, LedgerBackend)
    assert backend.supports_defer and backend.supports_async_task and backend.supports_get_result
    assert backend.supports_priority
    assert fw.package == ("django.tasks" if _django6() else "django_tasks")


def test_enqueue_stores_a_ready_job_with_its_arguments() -> None:
    result = t.echo.enqueue(1, "two", [3], key={"four": 4})
    assert result.status == Status.READY and not result.is_finished
    assert result.args == [1, "two", [3]] and result.kwargs == {"key": {"four": 4}}
    assert result.backend == "default" and result.errors == [] and result.worker_ids == []
    assert result.enqueued_at is not None and result.started_at is None
    job = job_of(result)
    assert job.status == "queued" and job.event_type == "task:tests.support.worker_tasks.echo"
    assert job.partition_key == f"task:default:~{result.id}"  # a partition of its own
    assert job.payload["args"] == [1, "two", [3]] and job.max_attempts == 1
    with pytest.raises(ValueError, match="not finished"):
        result.return_value  # noqa: B018


def test_aenqueue_and_aget_result() -> None:
    async def go() -> tuple[Any, Any]:
        result = await t.add.aenqueue(2, 3)
        return result, await t.add.aget_result(result.id)

    result, again = asyncio.run(go())
    assert again.id == result.id and again.status == Status.READY
    run_worker()
    assert asyncio.run(fw.task_backends["default"].aget_result(result.id)).return_value == 5


def test_get_result_of_a_missing_or_foreign_id() -> None:
    backend = fw.task_backends["default"]
    with pytest.raises(fw.TaskResultDoesNotExist):
        backend.get_result("no-such-id")
    result = t.add.enqueue(1, 1)
    with pytest.raises(Exception, match="Task does not match"):
        t.echo.get_result(result.id)
    assert t.add.get_result(result.id).id == result.id


# --- running ------------------------------------------------------------------------------


def test_a_task_runs_and_its_result_is_read_from_the_ledger() -> None:
    result = t.add.enqueue(40, 2)
    run_worker()
    result.refresh()
    assert result.status == Status.SUCCESSFUL and result.is_finished
    assert result.return_value == 42
    assert result.attempts == 1 and len(result.worker_ids) == 1
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    assert Step.objects.get(job_id=job_of(result).pk).name == task_jobs.RETURN_STEP


def test_none_is_returned_without_a_step_and_json_comes_back_normalized() -> None:
    none, tupled = t.noop.enqueue(), t.echo.enqueue((1, 2))
    run_worker()
    assert t.noop.get_result(none.id).return_value is None
    assert not Step.objects.filter(job_id=job_of(none).pk).exists()  # no write for None
    assert t.echo.get_result(tupled.id).return_value == {"args": [[1, 2]], "kwargs": {}}


def test_a_failing_task_is_failed_with_its_error_class_and_traceback() -> None:
    result = t.fail.enqueue("kaboom")
    run_worker()
    result.refresh()
    assert result.status == Status.FAILED and result.is_finished
    [error] = result.errors
    assert error.exception_class is ValueError
    assert "kaboom" in error.traceback and "Traceback" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert job_of(result).status == "failed"  # one attempt, by default


def test_a_result_that_is_not_json_fails_the_task() -> None:
    result = t.returns_object.enqueue()
    run_worker()
    result.refresh()
    assert result.status == Status.FAILED
    assert result.errors[0].exception_class is TypeError


def test_async_tasks_and_context() -> None:
    added, ctx = t.async_add.enqueue(1, 2), t.with_context.enqueue("x")
    run_worker()
    assert t.async_add.get_result(added.id).return_value == 3
    assert t.with_context.get_result(ctx.id).return_value == {
        "label": "x",
        "attempt": 1,
        "id": ctx.id,
    }


# --- run_after, priority, queues ------------------------------------------------------------


def test_run_after_holds_a_task_until_then() -> None:
    later = timezone.now() + timedelta(hours=1)
    result = t.add.using(run_after=later).enqueue(1, 2)
    job = job_of(result)
    assert job.available_at == later
    assert Partition.objects.get(key=job.partition_key).head_due_at == later
    assert store().next_wakeup() == later
    run_worker()
    assert t.add.get_result(result.id).status == Status.READY
    assert t.add.get_result(result.id).task.run_after == later


def test_a_task_runs_once_its_run_after_has_passed() -> None:
    result = t.add.using(run_after=timezone.now() + timedelta(seconds=0.5)).enqueue(2, 2)
    run_worker()  # too early: nothing is due
    assert t.add.get_result(result.id).status == Status.READY

    def ran() -> bool:
        run_worker()
        return bool(t.add.get_result(result.id).status == Status.SUCCESSFUL)

    wait_for(ran, 15, "the deferred task to run")
    got = t.add.get_result(result.id)
    assert got.started_at >= got.task.run_after


def claim_order(*args: str) -> list[str]:
    """The result ids, in the order a worker of one slot claims (and finishes) them."""
    order = []
    while claimed := ledger.claim("w", keys=ledger.KeyFilter(args)):
        [job] = claimed
        order.append(job.event_id)
        ledger.finish(job.lease)
    return order


def test_the_claim_takes_higher_priority_first_then_enqueue_order() -> None:
    low = t.add.using(priority=-10).enqueue(1, 1)
    first, second = t.add.enqueue(1, 2), t.add.enqueue(1, 3)
    high = t.add.using(priority=50).enqueue(1, 4)
    top = t.add.using(priority=fw.TASK_MAX_PRIORITY).enqueue(1, 5)
    assert job_of(high).priority == 50 and job_of(first).priority == 0
    assert Partition.objects.get(key=job_of(high).partition_key).head_priority == 50
    assert t.add.get_result(high.id).task.priority == 50
    assert claim_order() == [top.id, high.id, first.id, second.id, low.id]
    # Done, each partition is idle again, and an idle partition's priority is 0.
    assert set(Partition.objects.values_list("head_state", "head_priority")) == {("idle", 0)}


def test_a_real_worker_of_one_slot_runs_tasks_by_priority() -> None:
    results = [t.send_email.using(priority=p).enqueue(f"{p}@x") for p in (0, -5, 20, 5)]
    run_worker("--concurrency", "1")
    log = (worker_handlers.DIR / "events.log").read_text().splitlines()
    assert [line.split()[1] for line in log] == ["20@x", "5@x", "0@x", "-5@x"]
    assert all(t.send_email.get_result(r.id).status == Status.SUCCESSFUL for r in results)


def test_a_priority_never_reorders_the_tasks_of_one_ordering_key() -> None:
    """Ordering is a promise, priority a preference: within a key, enqueue order wins; the
    key's place among other work is its head's priority, read again as each head moves."""
    with ordering_key("user:1"):
        slow = t.add.using(priority=-50).enqueue(1, 0)
        urgent = t.add.using(priority=90).enqueue(2, 0)
    middle = t.add.using(priority=10).enqueue(3, 0)
    key = job_of(slow).partition_key
    assert Partition.objects.get(key=key).head_priority == -50  # its head's, not the key's max
    [first] = ledger.claim("w")
    assert first.event_id == middle.id
    ledger.finish(first.lease)
    [second] = ledger.claim("w")
    assert second.event_id == slow.id  # urgent waits for the task before it
    later = t.add.using(priority=60).enqueue(4, 0)
    ledger.finish(second.lease)
    assert Partition.objects.get(key=key).head_priority == 90  # the new head's
    assert claim_order() == [urgent.id, later.id]


def test_priority_survives_a_retry_and_an_operator_requeue_and_waits_for_run_after() -> None:
    flaky = t.flaky.using(priority=30).enqueue("p", 1)
    normal = t.add.enqueue(1, 1)
    deferred = t.add.using(priority=100, run_after=timezone.now() + timedelta(hours=1)).enqueue(
        2, 2
    )
    [job] = ledger.claim("w")
    assert job.event_id == flaky.id  # 100 is not due: priority never runs work early
    assert ledger.fail(job.lease, error_type="RuntimeError", retry_in=0) == "retry_wait"
    part = Partition.objects.get(key=job_of(flaky).partition_key)
    assert (part.head_state, part.head_priority) == ("retry_wait", 30)
    [again] = ledger.claim("w")
    assert again.event_id == flaky.id
    assert ledger.fail(again.lease, error_type="RuntimeError", final=True) == "failed"
    assert ledger.requeue([job_of(flaky).pk]).done
    assert Partition.objects.get(key=job_of(flaky).partition_key).head_priority == 30
    assert claim_order() == [flaky.id, normal.id]
    assert job_of(deferred).status == "queued"


def test_a_priority_outside_the_frameworks_range_is_refused() -> None:
    for bad in (fw.TASK_MAX_PRIORITY + 1, fw.TASK_MIN_PRIORITY - 1):
        with pytest.raises(fw.InvalidTask, match="priority"):
            t.add.using(priority=bad)
    assert not EventJob.objects.exists()


def test_priority_orders_the_claim_of_a_queue_filtered_worker() -> None:
    emails = [t.send_email.using(priority=p).enqueue(f"{p}@x") for p in (1, 7, -3)]
    t.add.using(priority=99).enqueue(1, 1)  # another queue: not this worker's
    prefixes = task_jobs.queue_prefix("emails")
    assert claim_order(prefixes) == [emails[1].id, emails[0].id, emails[2].id]


def test_queues_are_checked_and_partition_the_claim() -> None:
    with pytest.raises(fw.InvalidTask, match="not valid"):
        t.add.using(queue_name="nope")
    email = t.send_email.enqueue("a@example.com")
    default = t.add.enqueue(1, 1)
    event = ledger.enqueue(
        event_id="ev-1", event_type="test.steps", partition_key="chat:1", payload={}
    ).job_id
    prefixes = ledger.KeyFilter((task_jobs.queue_prefix("emails"),))
    assert store().next_wakeup(prefixes) is not None
    [claimed] = ledger.claim("w-emails", keys=prefixes, limit=10)
    assert claimed.event_id == email.id
    assert ledger.claim("w-emails", keys=prefixes, limit=10) == []
    others = ledger.claim("w-all", limit=10)
    assert {j.id for j in others} == {job_of(default).pk, event}


def test_runworker_queue_runs_only_that_queue() -> None:
    email, default = t.send_email.enqueue("b@example.com"), t.add.enqueue(1, 1)
    run_worker("--queue", "emails")
    assert t.send_email.get_result(email.id).return_value == "sent to b@example.com"
    assert t.add.get_result(default.id).status == Status.READY


def test_a_claim_excluding_queues_takes_everything_else() -> None:
    """``runworker --exclude-queues``: every claim path (claim, finish and claim, finishes
    together) and the wake-up time leave the excluded queues' tasks alone and take events,
    schedules' jobs and every other queue's tasks, in priority order as ever."""
    emails = [t.send_email.using(priority=90).enqueue(f"{n}@x") for n in range(3)]
    default = [t.add.using(priority=p).enqueue(1, p) for p in (1, 5)]
    events = [
        ledger.enqueue(
            event_id=f"ev-{n}", event_type="test.steps", partition_key=f"chat:{n}", payload={}
        ).job_id
        for n in range(3)
    ]
    keys = ledger.KeyFilter((task_jobs.queue_prefix("emails"),), excluding=True)
    [first] = ledger.claim("w", keys=keys)
    [second] = ledger.claim("w", keys=keys)
    assert [first.id, second.id] == [job_of(default[1]).pk, job_of(default[0]).pk]  # not 90s
    _, [next_one] = ledger.finish_and_claim(first.lease, limit=1, keys=keys)
    ended = ledger.finish_together(
        [(second.lease, "", "t2"), (next_one.lease, "", "t3")], keys=keys
    )
    claimed = [next_one.id] + [jobs[0].id for _, jobs in ended]
    assert sorted(claimed) == sorted(events)  # then the events, never an email
    for job in (j for _, jobs in ended for j in jobs):
        ledger.finish(job.lease)
    assert ledger.claim("w", keys=keys, limit=10) == []
    assert store().next_wakeup(keys) is None  # nothing due but emails: sleep
    assert store().next_wakeup(ledger.KeyFilter(keys.prefixes)) is not None
    assert {j.event_id for j in ledger.claim("w-emails", limit=10)} == {e.id for e in emails}


def test_runworker_exclude_queues_runs_every_job_but_those_queues() -> None:
    email, default = t.send_email.enqueue("c@example.com"), t.add.enqueue(2, 2)
    event = ledger.enqueue(
        event_id="ev-x", event_type="test.steps", partition_key="chat:x", payload={}
    ).job_id
    run_worker("--exclude-queues", "emails,reports", "--exclude-queues", "emails")
    assert t.add.get_result(default.id).return_value == 4
    assert EventJob.objects.get(id=event).status == "completed"
    assert t.send_email.get_result(email.id).status == Status.READY
    assert job_of(email).attempt == 0  # never claimed


def test_runworker_refuses_bad_or_conflicting_queue_flags() -> None:
    t.add.enqueue(1, 1)
    for args, says in (
        (("--queue", "emails", "--exclude-queues", "default"), "cannot be combined"),
        (("--exclude-queues", "a:b"), "--exclude-queues 'a:b'"),
        (("--exclude-queues", "emails,"), "--exclude-queues ''"),
    ):
        with pytest.raises(CommandError, match=says):
            run_worker(*args)
    assert EventJob.objects.get().status == "queued"  # a refused start runs nothing


# --- ordering keys --------------------------------------------------------------------------


def test_an_ordering_key_is_the_partition_and_holds_later_tasks() -> None:
    with ordering_key("user:7"):
        first, second = t.add.enqueue(1, 0), t.add.enqueue(2, 0)
    free = t.add.enqueue(3, 0)
    assert job_of(first).partition_key == job_of(second).partition_key == "task:default:user:7"
    claimed = ledger.claim("w", limit=10)
    assert {j.event_id for j in claimed} == {first.id, free.id}  # second waits for first
    for job in claimed:
        ledger.finish(job.lease)
    [then] = ledger.claim("w", limit=10)
    assert then.event_id == second.id


def test_a_failed_ordered_task_blocks_its_key_until_an_operator_acts() -> None:
    with ordering_key("acct:1"):
        failing, behind = t.fail.enqueue("x"), t.add.enqueue(1, 1)
    run_worker()
    assert t.fail.get_result(failing.id).status == Status.FAILED
    assert t.add.get_result(behind.id).status == Status.READY  # fail closed
    assert ledger.discard([job_of(failing).pk]).done
    run_worker()
    assert t.add.get_result(behind.id).return_value == 2


# --- bad input: a clear refusal, nothing stored --------------------------------------------------


def test_bad_input_is_refused_with_a_code_and_stores_nothing() -> None:
    with pytest.raises(InvalidLedgerTask) as refused:
        t.echo.enqueue(object())
    assert refused.value.code == "invalid_task" and "JSON" in str(refused.value)
    assert isinstance(refused.value, fw.InvalidTask) and isinstance(refused.value, InboxError)
    with pytest.raises(InvalidLedgerTask, match="too long"), ordering_key("k" * 300):
        t.add.enqueue(1, 1)
    with pytest.raises(InvalidLedgerTask, match="ordering key"), ordering_key(""):
        pass
    with pytest.raises(InboxError, match="retry policy"):
        retry(t.RetryPolicy(attempts=0))
    assert not EventJob.objects.exists() and not Partition.objects.exists()


def test_runworker_refuses_a_queue_name_the_ledger_cannot_hold() -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="without ':'"):
        run_worker("--queue", "a:b")


def test_the_framework_validates_the_task_function() -> None:
    def local() -> None: ...

    with pytest.raises(fw.InvalidTask, match="module level"):
        fw.Task(func=local)
    from feishu_inbox.checks import check_task_backends

    assert check_task_backends() == [] and fw.task_backends["default"].check() == []
    with override_settings(
        TASKS={"default": {"BACKEND": "feishu_inbox.tasks.LedgerBackend", "QUEUES": ["a:b", ""]}}
    ):
        [error] = check_task_backends()
        assert error.id == "feishu_inbox.E007" and "'a:b'" in error.msg


# --- transactions and retention -------------------------------------------------------------


def test_an_enqueue_that_rolls_back_never_existed() -> None:
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        rolled = t.add.enqueue(1, 2)
        with ordering_key("k"):
            t.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(3, 4)
        assert EventJob.objects.count() == 2  # visible inside the transaction only
        raise Abort
    assert not EventJob.objects.exists() and not Partition.objects.exists()
    with pytest.raises(fw.TaskResultDoesNotExist):
        t.add.get_result(rolled.id)
    with transaction.atomic():
        kept = t.add.enqueue(5, 6)
    assert t.add.get_result(kept.id).status == Status.READY


def test_results_are_kept_by_the_ledgers_retention() -> None:
    result = t.add.enqueue(1, 1)
    run_worker()
    job = job_of(result)
    assert store().purge_completed(3600, 100) == 0  # within retention: kept
    EventJob.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(days=8))
    assert store().purge_completed(7 * 86400, 100) == 1
    assert not Step.objects.filter(job_id=job.pk).exists()
    assert not Attempt.objects.filter(job_id=job.pk).exists()
    with pytest.raises(fw.TaskResultDoesNotExist):
        t.add.get_result(result.id)


def _django6() -> bool:
    import django

    return django.VERSION >= (6, 0)


# --- operators: admin and the inbox command -----------------------------------------------------


def test_admin_shows_tasks_beside_events_by_kind_and_queue_with_the_same_actions() -> None:
    from django.contrib.auth.models import User
    from django.test import Client
    from django.urls import reverse

    email, added = t.send_email.using(priority=42).enqueue("e@example.com"), t.add.enqueue(1, 1)
    event = ledger.enqueue(
        event_id="ev-admin", event_type="im.message.receive_v1", partition_key="chat:1", payload={}
    ).job_id
    User.objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(User.objects.get(username="root"))
    url = reverse("admin:feishu_inbox_eventjob_changelist")

    def listed(query: str) -> set[int]:
        page = client.get(f"{url}?{query}")
        assert page.status_code == 200
        return {job.pk for job in page.context["cl"].result_list}

    email_id, added_id = job_of(email).pk, job_of(added).pk
    assert listed("kind=task") == {email_id, added_id}
    assert listed("kind=event") == {event}
    assert listed("kind=task&queue=emails") == {email_id}
    page = client.get(url)
    assert "task queue" in page.content.decode() and "django.tasks tasks" in page.content.decode()
    detail = client.get(reverse("admin:feishu_inbox_eventjob_change", args=[email_id]))
    assert detail.status_code == 200 and "e@example.com" in detail.content.decode()
    assert re.search(r"Priority:</label>\s*<div class=\"readonly\">42<", detail.content.decode())
    client.post(url, {"action": "cancel_jobs", "_selected_action": [email_id], "confirmed": "yes"})
    got = t.send_email.get_result(email.id)
    assert got.status == Status.FAILED
    assert got.errors[0].exception_class_path == "feishu_inbox.errors.Cancelled"


def test_the_inbox_command_lists_shows_and_acts_on_tasks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    failing, email = t.fail.using(priority=-3).enqueue("cli"), t.send_email.enqueue("f@x.com")
    run_worker("--queue", "default")
    call_command("inbox", "list", "--kind", "task", "--queue", "default", "--json")
    [row] = json.loads(capsys.readouterr().out)
    assert row["event_id"] == failing.id and row["status"] == "failed"
    call_command("inbox", "show", failing.id, "--json")
    shown = json.loads(capsys.readouterr().out)
    assert shown["attempts"][0]["error_type"] == "builtins.ValueError"
    assert shown["priority"] == -3
    call_command("inbox", "requeue", str(row["id"]))
    assert "requeued" in capsys.readouterr().out
    assert t.fail.get_result(failing.id).status == Status.READY
    call_command("inbox", "list", "--kind", "task", "--queue", "emails", "--json")
    assert [r["event_id"] for r in json.loads(capsys.readouterr().out)] == [email.id]
