"""Durable waits (SPEC §9e) in the ledger: a handler's wait, its suspend, signals, timeouts,
chats given back or held, operators; on both databases. tests/runtime/test_waits_workers.py
proves the same on real workers, killed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction

import feishu_inbox
from feishu_inbox import ledger
from feishu_inbox.errors import (
    InvalidState,
    LedgerError,
    NoWaiter,
    Suspended,
    WaitRefused,
    WaitTimedOut,
)
from feishu_inbox.ledger import waits
from feishu_inbox.models import EventJob, Partition, Status
from feishu_inbox.runtime import attempts
from feishu_inbox.waiting import Signal, Wait
from tests.runtime.test_steps import InHandler
from tests.support.ledger_helpers import snapshot

pytestmark = pytest.mark.django_db


def enqueue(event_id: str, chat: str = "chat-1", event_type: str = "test.waits") -> int:
    return ledger.enqueue(
        event_id=event_id, event_type=event_type, partition_key=chat, payload={}
    ).job_id


def claim(worker: str = "w") -> ledger.ClaimedJob | None:
    found = ledger.claim(worker)
    return found[0] if found else None


def run_to_wait(claimed: ledger.ClaimedJob, wait: object) -> tuple[str, object]:
    """Run ``wait()`` as a handler would, and what the worker does with its end: the
    handler's value ("returned", value), or the job's state after a suspend."""
    with InHandler(claimed) as ctx:
        try:
            return "returned", wait()  # type: ignore[operator]
        except Suspended as suspended:
            return "suspended", attempts.suspend(ctx, suspended)


def test_a_wait_suspends_without_a_lease_and_a_signal_resumes_it_once() -> None:
    job_id = enqueue("e1")
    first = claim()
    assert first is not None
    how, state = run_to_wait(first, lambda: feishu_inbox.wait_for("pay:1", timeout=None))
    assert (how, state) == ("suspended", "waiting")
    job = EventJob.objects.get(pk=job_id)
    assert job.status == Status.WAITING
    assert (job.lease_until, job.lease_token, job.attempt) == (None, "", 0)
    assert claim() is None  # nothing to claim while it waits

    with transaction.atomic():
        sent = feishu_inbox.signal("pay:1", {"amount": 42})
    assert sent.job_id == job_id and not sent.kept
    assert EventJob.objects.get(pk=job_id).status == Status.QUEUED
    again = claim()
    assert again is not None and again.id == job_id
    assert run_to_wait(again, lambda: feishu_inbox.wait_for("pay:1", timeout=None)) == (
        "returned",
        {"amount": 42},
    )
    # A second signal of the key finds no waiter: it is kept, the delivered wait unchanged.
    assert feishu_inbox.signal("pay:1", "late").kept
    assert Wait.objects.get(job_id=job_id).payload == {"amount": 42}


def test_a_signal_sent_first_is_kept_and_taken_by_the_wait_at_once() -> None:
    assert feishu_inbox.signal("k", [1, 2], keep=timedelta(minutes=5)).kept
    job_id = enqueue("e1")
    claimed = claim()
    assert claimed is not None
    assert run_to_wait(claimed, lambda: feishu_inbox.wait_for("k", timeout=60)) == (
        "returned",
        [1, 2],
    )
    assert not Signal.objects.exists()  # taken
    assert Wait.objects.get(job_id=job_id).state == "delivered"


def test_keep_false_without_a_waiter_is_refused_and_changes_nothing() -> None:
    job_id = enqueue("e1")  # waits for another key
    claimed = claim()
    assert claimed is not None
    run_to_wait(claimed, lambda: feishu_inbox.wait_for("other", timeout=None))
    before = snapshot(job_id), list(Wait.objects.values())
    with pytest.raises(NoWaiter) as refused:
        feishu_inbox.signal("nobody", {"x": 1}, keep=False)
    assert refused.value.code == "no_waiter"
    assert (snapshot(job_id), list(Wait.objects.values())) == before
    assert not Signal.objects.exists()
    for bad in ("", "x" * 256, 7):
        with pytest.raises(LedgerError):
            feishu_inbox.signal(bad)  # type: ignore[arg-type]
    with pytest.raises(LedgerError):
        feishu_inbox.signal("k", {1, 2})  # not JSON data
    with pytest.raises(LedgerError):
        feishu_inbox.signal("k", keep=-1)
    assert not Signal.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_signal_in_a_transaction_that_rolls_back_delivers_nothing() -> None:
    job_id = enqueue("e1")
    claimed = claim()
    assert claimed is not None
    run_to_wait(claimed, lambda: feishu_inbox.wait_for("k", timeout=None))
    with pytest.raises(RuntimeError), transaction.atomic():
        feishu_inbox.signal("k", "paid")
        raise RuntimeError("the caller's transaction fails")
    assert EventJob.objects.get(pk=job_id).status == Status.WAITING
    assert Wait.objects.get(job_id=job_id).state == "open"


def test_a_waiting_job_gives_its_chat_back_unless_it_holds_it() -> None:
    waiter, later = enqueue("e1"), enqueue("e2")
    first = claim()
    assert first is not None and first.id == waiter
    run_to_wait(first, lambda: feishu_inbox.wait_for("k", timeout=None))
    nxt = claim()
    assert nxt is not None and nxt.id == later  # the chat's next message runs meanwhile

    # While the later job runs, the signal resumes the earlier one: it waits for the running
    # one to end (one job of a chat runs at a time), then runs before anything newer.
    newest = enqueue("e3")
    feishu_inbox.signal("k", "go")
    assert Partition.objects.get(key="chat-1").head_id == later
    assert claim() is None
    ledger.finish(nxt.lease)
    resumed = claim()
    assert resumed is not None and resumed.id == waiter
    ledger.finish(resumed.lease)
    last = claim()
    assert last is not None and last.id == newest

    held, behind = enqueue("h1", chat="chat-2"), enqueue("h2", chat="chat-2")
    holder = claim()
    assert holder is not None and holder.id == held
    wait = lambda: feishu_inbox.wait_for("h", timeout=None, hold_chat=True)  # noqa: E731
    run_to_wait(holder, wait)
    assert Partition.objects.get(key="chat-2").head_state == Status.WAITING
    assert claim() is None  # its chat waits behind it
    feishu_inbox.signal("h")
    again = claim()
    assert again is not None and again.id == held
    assert run_to_wait(again, wait) == ("returned", None)
    ledger.finish(again.lease)
    after = claim()
    assert after is not None and after.id == behind


def test_a_sleep_ends_by_its_time_and_a_wait_times_out() -> None:
    sleeper, waiter = enqueue("s1", chat="a"), enqueue("w1", chat="b")
    for job_id, wait in (
        (sleeper, lambda: feishu_inbox.sleep(0.05)),
        (waiter, lambda: feishu_inbox.wait_for("never", timeout=timedelta(milliseconds=50))),
    ):
        claimed = claim()
        assert claimed is not None and claimed.id == job_id
        assert run_to_wait(claimed, wait) == ("suspended", "waiting")
    # Due only once their time came: the workers' sweep (here, by hand) resolves them.
    Wait.objects.update(until=Wait.objects.first().created_at)  # type: ignore[union-attr]
    assert waits.time_out_due() == 2
    assert waits.time_out_due() == 0  # once
    by_id = {}
    for _ in range(2):
        claimed = claim()
        assert claimed is not None
        by_id[claimed.id] = claimed
    assert run_to_wait(by_id[sleeper], lambda: feishu_inbox.sleep(0.05)) == ("returned", None)
    with pytest.raises(WaitTimedOut):
        run_to_wait(by_id[waiter], lambda: feishu_inbox.wait_for("never", timeout=0.05))
    # a sleep whose time has passed is memoized without waiting
    third = enqueue("s2", chat="c")
    claimed = claim()
    assert claimed is not None and claimed.id == third
    assert run_to_wait(claimed, lambda: feishu_inbox.sleep(-1)) == ("returned", None)


def test_a_signal_and_a_timeout_race_and_one_wins() -> None:
    job_id = enqueue("e1")
    claimed = claim()
    assert claimed is not None
    run_to_wait(claimed, lambda: feishu_inbox.wait_for("k", timeout=30))
    wait = Wait.objects.get(job_id=job_id)
    Wait.objects.update(until=wait.created_at)
    assert waits.time_out_due() == 1
    assert feishu_inbox.signal("k", "late").kept  # the wait is resolved: nobody waits
    assert Wait.objects.get(job_id=job_id).state == "timed_out"


def test_a_signal_that_lands_before_the_suspend_resumes_the_job_at_once() -> None:
    job_id = enqueue("e1")
    claimed = claim()
    assert claimed is not None
    with InHandler(claimed) as ctx:
        with pytest.raises(Suspended) as stopped:
            feishu_inbox.wait_for("k", timeout=None)
        feishu_inbox.signal("k", "early")  # between the handler's stop and its suspend
        assert attempts.suspend(ctx, stopped.value) == "queued"
    again = claim()
    assert again is not None and again.id == job_id
    assert run_to_wait(again, lambda: feishu_inbox.wait_for("k", timeout=None)) == (
        "returned",
        "early",
    )


def test_waits_are_refused_where_they_would_break_a_promise() -> None:
    enqueue("e1")
    claimed = claim()
    assert claimed is not None
    with InHandler(claimed):
        with feishu_inbox.effect():
            pass
        with pytest.raises(WaitRefused) as refused:
            feishu_inbox.wait_for("k", timeout=None)
    assert "outside a step" in refused.value.message
    assert not Wait.objects.exists()

    enqueue("e2", chat="chat-2")
    claimed = claim()
    assert claimed is not None
    with InHandler(claimed) as ctx:
        feishu_inbox.step("send", lambda: _effect())  # an effect inside a step: allowed
        with pytest.raises(Suspended) as stopped:
            feishu_inbox.wait_for("k", timeout=None)
        assert attempts.suspend(ctx, stopped.value) == "waiting"
    feishu_inbox.signal("k")
    again = claim()
    assert again is not None
    with InHandler(again):
        feishu_inbox.step("send", lambda: pytest.fail("a memoized step ran again"))
        with pytest.raises(WaitRefused):  # the same wait's name, another key
            feishu_inbox.wait_for("other", timeout=None)

    task = enqueue("t1", chat="task:default:x", event_type="task:tests.do_it")
    claimed = claim()
    assert claimed is not None and claimed.id == task
    with InHandler(claimed), pytest.raises(WaitRefused) as refused:
        feishu_inbox.sleep(1)
    assert "django.tasks" in refused.value.message


def _effect() -> str:
    with feishu_inbox.effect():
        return "sent"


def test_a_job_with_an_open_effect_cannot_suspend() -> None:
    enqueue("e1")
    claimed = claim()
    assert claimed is not None
    with InHandler(claimed), pytest.raises(Suspended) as stopped:
        feishu_inbox.wait_for("k", timeout=None)
    ledger.begin_effect(claimed.lease)
    with pytest.raises(InvalidState):
        waits.suspend(claimed.lease, name=stopped.value.name, what="k")
    assert EventJob.objects.get(pk=claimed.id).status == Status.RUNNING


def test_operators_signal_time_out_and_cancel_a_waiting_job() -> None:
    a, b, c = enqueue("a", chat="1"), enqueue("b", chat="2"), enqueue("c", chat="3")
    for expected in (a, b, c):
        claimed = claim()
        assert claimed is not None and claimed.id == expected
        key = f"k{expected}"
        run_to_wait(claimed, lambda key=key: feishu_inbox.wait_for(key, timeout=None))
    assert waits.signal_job(a, {"by": "hand"})
    assert not waits.signal_job(a)  # resolved already: nothing moves
    assert waits.time_out_now(b)
    outcome = ledger.cancel([c])
    assert outcome.done == [c]
    job = EventJob.objects.get(pk=c)
    assert (job.status, job.error_type, job.partition_key) == (Status.COMPLETED, "Cancelled", "3")
    assert Wait.objects.get(job_id=c).state == "cancelled"
    assert feishu_inbox.signal(f"k{c}").kept  # the cancelled job's key waits for nobody
    views = waits.waits_of([a, b, c])
    assert {k: v.state for k, v in views.items()} == {
        a: "delivered",
        b: "timed_out",
        c: "cancelled",
    }
    assert views[a].chat == "1" and views[a].what == f"signal 'k{a}'"


def test_inbox_lists_shows_signals_times_out_and_cancels_waiting_jobs() -> None:
    import json
    from io import StringIO

    from django.core.management import CommandError, call_command

    def inbox(*args: str) -> str:
        out = StringIO()
        call_command("inbox", *args, stdout=out, stderr=StringIO())
        return out.getvalue()

    a, b, c = enqueue("a", chat="1"), enqueue("b", chat="2"), enqueue("c", chat="3")
    for expected, wait in (
        (a, lambda: feishu_inbox.wait_for("ka", timeout=None)),
        (b, lambda: feishu_inbox.sleep(3600, hold_chat=True)),
        (c, lambda: feishu_inbox.wait_for("kc", timeout=60)),
    ):
        claimed = claim()
        assert claimed is not None and claimed.id == expected
        run_to_wait(claimed, wait)
    listed = inbox("list", "--status", "waiting")
    assert f"{a}" in listed and "waits for signal 'ka' since" in listed
    assert "waits for a sleep since" in listed and " until " in listed
    rows = {r["id"]: r for r in json.loads(inbox("list", "--status", "waiting", "--json"))}
    assert rows[a]["partition_key"] == "1" and rows[a]["wait"]["holds_chat"] is False
    assert rows[b]["wait"]["holds_chat"] is True and rows[b]["wait"]["key"] == ""
    shown = json.loads(inbox("show", str(c), "--json"))
    assert shown["wait"]["key"] == "kc" and shown["wait"]["state"] == "open"

    with pytest.raises(CommandError):
        inbox("signal", str(a), "--payload", "{not json")
    assert inbox("signal", str(a), "--payload", '{"ok": true}') == f"job {a}: signalled\n"
    assert inbox("time-out", str(b)) == f"job {b}: timed out\n"
    assert inbox("cancel", str(c)) == f"job {c}: cancelled\n"
    with pytest.raises(CommandError, match="1 of 1 jobs refused"):
        inbox("signal", str(a))  # it waits no more
    assert Wait.objects.get(job_id=a).payload == {"ok": True}
    assert dict(EventJob.objects.values_list("id", "status")) == {
        a: "queued",
        b: "queued",
        c: "completed",
    }


@pytest.mark.django_db(transaction=True)  # the async form writes from another thread
def test_an_async_handler_awaits_its_waits() -> None:
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    job_id = enqueue("e1")
    feishu_inbox.signal("kept", {"early": True})
    claimed = claim()
    assert claimed is not None

    async def handler() -> object:
        # One database thread, whose connection is closed at the end, as a worker would.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        try:
            got = await feishu_inbox.wait_for("kept", timeout=60)  # a kept signal: at once
            await feishu_inbox.wait_for("later", timeout=None)  # suspends
            return got
        finally:
            await asyncio.to_thread(connections.close_all)

    with InHandler(claimed) as ctx, pytest.raises(Suspended) as stopped:
        asyncio.run(handler())
    assert stopped.value.name == "wait:2"
    assert attempts.suspend(ctx, stopped.value) == "waiting"
    assert dict(Wait.objects.filter(job_id=job_id).values_list("name", "state")) == {
        "wait:1": "delivered",
        "wait:2": "open",
    }


@pytest.mark.django_db(transaction=True)  # the foreign keys are checked at commit
def test_retention_keeps_waiting_jobs_and_replay_and_purge_carry_the_waits() -> None:
    from django.utils import timezone

    from feishu_inbox.ledger import retention

    done, waiting = enqueue("d1", chat="a"), enqueue("w1", chat="b")
    for expected, key in ((done, "kd"), (waiting, "kw")):
        claimed = claim()
        assert claimed is not None and claimed.id == expected
        run_to_wait(claimed, lambda key=key: feishu_inbox.wait_for(key, timeout=None))
    feishu_inbox.signal("kd", "go")
    claimed = claim()
    assert claimed is not None and claimed.id == done
    assert run_to_wait(claimed, lambda: feishu_inbox.wait_for("kd", timeout=None))[1] == "go"
    ledger.finish(claimed.lease)
    later = enqueue("d2", chat="a")  # runs after it: a replay then moves the job to a new id
    claimed = claim()
    assert claimed is not None and claimed.id == later
    ledger.finish(claimed.lease)

    replayed = ledger.replay([done])
    new_id = replayed.moved[done]
    assert list(Wait.objects.filter(job_id=new_id).values_list("state", "payload")) == [
        ("delivered", "go")
    ]
    claimed = claim()
    assert claimed is not None and claimed.id == new_id  # its wait memoized: no wait again
    assert run_to_wait(claimed, lambda: feishu_inbox.wait_for("kd", timeout=None)) == (
        "returned",
        "go",
    )
    ledger.finish(claimed.lease)

    long_ago = timezone.now() - timedelta(days=30)
    EventJob.objects.all().update(received_at=long_ago, finished_at=long_ago)
    Signal.objects.create(key="stale", sent_at=long_ago, expires_at=long_ago)
    purged = retention.purge()
    assert (purged.completed_deleted, purged.signals_deleted) == (2, 1)
    assert list(EventJob.objects.values_list("id", "status")) == [(waiting, "waiting")]
    assert list(Wait.objects.values_list("job_id", flat=True)) == [waiting]
