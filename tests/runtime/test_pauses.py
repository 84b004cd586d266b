"""Operator pauses (SPEC §9c): real ``runworker`` processes; ``manage.py inbox pause`` and
``resume``. Paused work is not claimed, running work finishes, a paused chat keeps its order,
work stored while paused is held as it arrives, and a worker that claims paused work anyway
hands it back without spending an attempt."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.core.management import call_command
from django.utils import timezone

from feishu_inbox.ledger import pauses
from feishu_inbox.models import EventJob, Pause
from tests.support.processes import wait_for
from tests.support.worker_helpers import Workers, enqueue, job

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"FEISHU_INBOX_POLL_INTERVAL": "0.1"}


def inbox(*args: str) -> str:
    out = StringIO()
    call_command("inbox", *args, stdout=out)
    return out.getvalue()


def ran(workers: Workers) -> list[str]:
    return [line[1] for line in workers.lines("start")]


def test_a_paused_chat_runs_nothing_until_resumed_then_runs_in_order(workers: Workers) -> None:
    User.objects.create_user("ops")
    running = enqueue("p0", ["gate:p0"], partition="chat-p")
    held = [enqueue(f"p{i}", ["work:0"], partition="chat-p") for i in range(1, 4)]
    other = enqueue("q0", ["work:0"], partition="chat-q")
    workers.start("--concurrency", "2", **FAST)
    wait_for(lambda: "p0" in ran(workers), 20, "p0 to start")
    out = json.loads(
        inbox("pause", "--partition", "chat-p", "--user", "ops", "--reason", "bad deploy", "--json")
    )
    assert (out["changed"], out["jobs"], out["by"]) == (True, 3, "ops")
    late = enqueue("p4", ["work:0"], partition="chat-p")  # stored while paused: held at once
    workers.open_gate("p0")  # the running job finishes
    wait_for(lambda: job(running).status == "completed" and job(other).status == "completed", 20)
    for job_id in [*held, late]:
        row = job(job_id)
        assert row.status == "queued" and row.available_at >= pauses.HELD_FROM
    assert ran(workers) == ["p0", "q0"] or ran(workers) == ["q0", "p0"]
    assert "chat-p" in inbox("pauses") and "bad deploy" in inbox("pauses")
    assert LogEntry.objects.filter(object_repr__contains="chat-p").count() == 1

    assert "3 waiting jobs" not in inbox("resume", "--partition", "chat-p")  # 4 now
    wait_for(lambda: EventJob.objects.completed().count() == 6, 20, "the chat to run")
    assert [e for e in ran(workers) if e.startswith("p")] == ["p0", "p1", "p2", "p3", "p4"]
    assert set(EventJob.objects.values_list("attempt", flat=True)) == {1}
    assert not Pause.objects.exists()


def test_an_app_and_an_event_type_pause_hold_new_work_too(workers: Workers) -> None:
    inbox("pause", "--event-type", "test.timed")
    a = enqueue("t0", ["work:0"], partition="chat-1", event_type="test.timed")
    b = enqueue("s0", ["work:0"], partition="chat-2")
    workers.start("--concurrency", "2", **FAST)
    wait_for(lambda: job(b).status == "completed", 20)
    assert job(a).status == "queued" and "t0" not in ran(workers)
    out = inbox("resume", "--event-type", "test.timed")
    assert "1 waiting jobs due again" in out
    wait_for(lambda: job(a).status == "completed", 20)
    with pytest.raises(Exception, match="pause_not_found"):
        inbox("resume", "--event-type", "test.timed")


def test_a_worker_that_claims_paused_work_hands_it_back_without_an_attempt(
    workers: Workers,
) -> None:
    queued = enqueue("r0", ["work:0"], partition="chat-r")
    # a pause the worker learns of only when it claims (no hold of the waiting jobs)
    Pause.objects.create(kind="partition", value="chat-r", since=timezone.now(), by="test")
    workers.start("--concurrency", "1", **FAST)
    wait_for(lambda: job(queued).error_type == "Paused", 20, "the job to be handed back")
    row = job(queued)
    assert (row.status, row.attempt) == ("queued", 0) and row.available_at >= pauses.HELD_FROM
    assert ran(workers) == []
    inbox("resume", "--partition", "chat-r")
    wait_for(lambda: job(queued).status == "completed", 20)


def test_a_refused_pause_says_why_and_changes_nothing() -> None:
    with pytest.raises(Exception, match="one of the arguments --partition --app"):
        inbox("pause")
    with pytest.raises(Exception, match="must be 1 to 255 characters"):
        pauses.pause("partition", "")
    with pytest.raises(Exception, match="There is no user 'nobody'"):
        inbox("pause", "--app", "default", "--user", "nobody")
    assert not Pause.objects.exists()


def test_many_threads_that_find_the_view_stale_read_the_pauses_once_and_keep_no_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker's handler threads each look at the pauses as they start a job. At the view's
    expiry, one of them reads (the others take the last view meanwhile), and a thread that had
    no connection keeps none: a worker of 251 threads once asked for 251 connections at once,
    past the server's max_connections."""
    import threading

    from django.db import connection

    pauses.pause("partition", "chat-x")
    pauses.active()  # a view, then stale
    monkeypatch.setattr(pauses, "CACHE_SECONDS", 0.0)
    reads, inside, release = [], threading.Event(), threading.Event()
    real = pauses.Pause.objects.all

    def slow_all() -> object:  # the first read holds until every other thread has looked
        reads.append(threading.get_ident())
        inside.set()
        release.wait(30)
        return real()

    monkeypatch.setattr(pauses.Pause.objects, "all", slow_all)
    seen: dict[int, object] = {}
    kept: dict[int, bool] = {}

    def look(n: int) -> None:
        seen[n] = pauses.active()
        kept[n] = connection.connection is not None

    first = threading.Thread(target=look, args=(0,))
    first.start()
    assert inside.wait(30)
    others = [threading.Thread(target=look, args=(n,)) for n in range(1, 40)]
    for t in others:
        t.start()
    for t in others:
        t.join(30)
    release.set()
    first.join(30)
    assert len(reads) == 1  # one read; 39 threads took the last view
    assert all(s and s[0].value == "chat-x" for s in seen.values()), seen  # type: ignore[index]
    assert kept == dict.fromkeys(range(40), False)  # no thread kept a connection
