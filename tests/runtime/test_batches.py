"""A worker's batches (runtime/batching.py): finishes written together, claims ahead of the slots.

The ledger's call on both databases, and real ``runworker`` processes: one killed with SIGKILL
between its handlers' return and their batch's commit loses no job, repeats no effect and keeps
each chat's order; a slow job never holds back another partition's finish.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from django.db import connection, connections

from feishu_inbox import ledger
from feishu_inbox.models import Attempt, EventJob
from feishu_inbox.runtime.batching import BUFFER_PATIENCE, Batch, Ended
from feishu_inbox.tracing import NOTHING
from tests.support.outages import sqlite_locked
from tests.support.processes import wait_for
from tests.support.worker_helpers import Workers, enqueue, job

pytestmark = pytest.mark.django_db(transaction=True)


def _claim_all(limit: int) -> list[ledger.ClaimedJob]:
    return ledger.claim("w1", limit=limit, lease_seconds=30)


def test_a_batch_finishes_each_fenced_and_claims_the_freed_heads_in_one_call() -> None:
    ids = {p: [enqueue(f"{p}-{i}", [], partition=p) for i in range(2)] for p in "abc"}
    first = _claim_all(3)
    assert sorted(j.id for j in first) == sorted(ids[p][0] for p in "abc")
    taken_over = next(j for j in first if j.id == ids["c"][0])
    EventJob.objects.filter(pk=taken_over.id).update(lease_token="someone-else")
    ended, claimed = ledger.finish_batch(
        "w1",
        [(j.lease, "") for j in first],
        limit=5,
        token=ledger.new_token(),
        lease_seconds=30,
    )
    by_id = dict(zip([j.id for j in first], ended, strict=True))
    assert by_id == {ids["a"][0]: "completed", ids["b"][0]: "completed", ids["c"][0]: None}
    # The finished partitions' next jobs, claimed in the same commit; c's head still runs.
    assert sorted(j.id for j in claimed) == [ids["a"][1], ids["b"][1]]
    assert job(ids["c"][0]).status == "running"
    # A batch sent again after its reply was lost: each finish is found fenced out, and
    # ledger.finish(retrying=True) finds it had landed.
    again, more = ledger.finish_batch(
        "w1",
        [(j.lease, "") for j in first[:2]],
        limit=0,
        token=ledger.new_token(),
    )
    assert again == [None, None] and more == []
    assert [ledger.finish(j.lease, retrying=True) for j in first[:2]] == ["completed"] * 2


def test_a_batch_with_one_job_twice_fences_each_finish_at_its_own_place() -> None:
    """A worker whose lease expired may claim the same job again before its batch goes: the
    stale finish and the live one of the same job meet in one batch. Each is fenced by its
    own token, in either order: the stale one ends None (its slot learns that its lease was
    lost), the live one completes with one history row."""
    for stale_first in (True, False):
        job_id = enqueue(f"twice-{stale_first}", [], partition=f"p-{stale_first}")
        [claimed] = _claim_all(1)
        stale = claimed.lease
        EventJob.objects.filter(pk=job_id).update(lease_token="t-again", attempt=2)
        live = dataclasses.replace(stale, token="t-again", attempt=2)
        order = [stale, live] if stale_first else [live, stale]
        ended, _ = ledger.finish_batch(
            "w1", [(lease, "") for lease in order], limit=0, token=ledger.new_token()
        )
        assert ended == ([None, "completed"] if stale_first else ["completed", None])
        assert job(job_id).status == "completed"
        tokens = Attempt.objects.filter(job_id=job_id).values_list("lease_token", flat=True)
        assert list(tokens) == ["t-again"]


def test_a_batch_claims_no_more_than_its_limit_and_none_for_a_limit_of_zero() -> None:
    for i in range(6):
        enqueue(f"e{i}", [], partition=f"p{i}")
    [one] = _claim_all(1)
    ended, claimed = ledger.finish_batch("w1", [(one.lease, "")], limit=2, token=ledger.new_token())
    assert ended == ["completed"] and len(claimed) == 2
    assert [j.lease.partition_key for j in claimed] == ["p1", "p2"]  # receipt order
    assert ledger.finish_batch("w1", [], limit=0, token=ledger.new_token()) == ([], [])


def test_a_batch_takes_any_partition_key_and_error_type() -> None:
    """PostgreSQL gets a batch's lists as array literals: quotes, backslashes, commas, braces,
    spaces and non-ASCII in a key reach the ledger as they were."""
    keys = ['chat "q"', "back\\slash", "a,b", "{braces}", " spaced ", "é中", "NULL"]
    ids = [enqueue(f"k{i}", [], partition=key) for i, key in enumerate(keys)]
    claimed = _claim_all(len(keys))
    assert sorted(j.id for j in claimed) == ids
    ended, _ = ledger.finish_batch(
        "w1", [(j.lease, 'Note "odd", \\ {x}') for j in claimed], limit=0, token="t"
    )
    assert ended == ["completed"] * len(keys)
    rows = EventJob.objects.filter(pk__in=ids).values_list("partition_key", "error_type")
    assert sorted(rows) == sorted((key, 'Note "odd", \\ {x}') for key in keys)


def test_a_claim_in_flight_saves_the_wake_up_look_but_not_the_short_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a slot's own batch holds the worker's room, the main thread, woken (a notice of
    a new job, say), neither asks the database when work is due (the claim in flight answers
    that: busy workers asked hundreds of times a run) nor sleeps its long listening sleep:
    that claim may bring its slot's next job, which wakes nobody, while another slot is free
    and the new job waits. It looks again within MIN_SLEEP, as when work is due."""
    from feishu_inbox.runtime import chores
    from feishu_inbox.runtime import worker as runtime_worker

    looked: list[str] = []
    monkeypatch.setattr(runtime_worker, "seconds_until_wakeup", lambda keys: looked.append("x"))
    worker = runtime_worker.Worker(runtime_worker.WorkerOptions(lease_seconds=30))
    worker.listener.listening = True  # its longest sleep: LISTEN_MAX_SLEEP
    assert chores.LISTEN_MAX_SLEEP >= 10 * runtime_worker.MIN_SLEEP
    started = time.monotonic()
    worker.sleep(True, room_held=True)
    assert time.monotonic() - started < chores.LISTEN_MAX_SLEEP / 2
    assert looked == []
    worker.flags.wake.set()  # with room to claim, it looks (and a wake-up ends the sleep)
    worker.sleep(True)
    assert looked == ["x"]


def test_the_buffer_follows_the_handlers_speed_and_gives_back_what_waits() -> None:
    batch = Batch(0.005, 32, threading.Event())
    assert batch.ahead(4) == 0  # nothing known: only the free slots are claimed
    fast = Ended(ctx=None, span=NOTHING, took=0.0001)  # type: ignore[arg-type]
    assert batch.ended(fast, take_next=True) is None
    assert batch.ahead(1) == 50  # fast handlers: what one slot runs in a window (50 jobs)
    assert batch.ahead(4) == 64  # at most two batches: one run while the next is claimed
    slow = Batch(0.005, 32, threading.Event())
    slow.ended(Ended(ctx=None, span=NOTHING, took=2.0), take_next=True)  # type: ignore[arg-type]
    assert slow.ahead(4) == 0  # an LLM call: nothing waits behind it
    jobs = [
        (_job_stub(1), 100.0),
        (_job_stub(2), 100.0 + BUFFER_PATIENCE / 2),
    ]
    batch.buffer(jobs)  # type: ignore[arg-type]
    assert [j.id for j, _ in batch.stale(now=100.0 + BUFFER_PATIENCE)] == [1]
    assert batch.buffered() == 1


def test_a_buffer_of_several_tenants_serves_the_one_with_fewest_first() -> None:
    """The claim shared the slots between the tenants; the buffer keeps it so: a light
    tenant's job is the next slot's, not behind the heavy tenant's buffered ones, and each
    tenant's jobs keep their claim's order (SPEC §9j)."""
    batch = Batch(1.0, 32, threading.Event())
    heavy = [(_job_stub(n, "a"), 100.0) for n in (1, 2, 3, 4)]
    batch.buffer([*heavy[:3], (_job_stub(9, "b"), 100.0), heavy[3]])  # type: ignore[list-item]
    taken = [batch.next_buffered() for _ in range(5)]
    assert [(j.id, j.tenant) for j, _ in taken] == [  # type: ignore[union-attr]
        (9, "b"),
        (1, "a"),
        (2, "a"),
        (3, "a"),
        (4, "a"),
    ]
    one = Batch(1.0, 32, threading.Event())  # one tenant: the claim's order, as it was
    one.buffer([(_job_stub(n), 100.0) for n in (5, 6, 7)])  # type: ignore[misc]
    assert [one.next_buffered()[0].id for _ in range(3)] == [5, 6, 7]  # type: ignore[index]


def test_a_half_run_buffer_sends_the_batch_and_fast_jobs_keep_to_the_busy_slots() -> None:
    wake = threading.Event()
    batch = Batch(1.0, 32, wake)  # a window no run of this test outlasts
    batch.buffer([(_job_stub(n), time.monotonic()) for n in range(20)])  # type: ignore[misc]
    fast = Ended(ctx=None, span=NOTHING, took=0.0001)  # type: ignore[arg-type]
    while batch.waiting() < batch.buffered():  # the slot runs the buffer: 20 in, 0 ended
        assert batch.ended(fast, take_next=True) is not None
        assert batch.due(slot_idle=False) is (batch.waiting() == 10)
    # as many ended as are left (and at least 8): the batch goes now, its claims arriving
    # while the slot runs the other half; the main thread was woken for it once
    assert (batch.waiting(), batch.buffered()) == (10, 10)
    assert batch.due(slot_idle=False)
    wake.clear()
    batch.ended(fast, take_next=True)
    assert not wake.is_set()  # asked once per batch
    assert len(batch.take_ended()) == 11 and not batch.due(slot_idle=False)
    # one busy slot runs 9 fast jobs well within a window: no other slot is woken for them...
    assert not batch.needs_slot(1)
    assert batch.needs_slot(0)
    # ...but a slow handler's jobs, or a buffer no slot took from for a window (the busy
    # slots are stuck in slow jobs), get one
    slow = Batch(0.005, 32, threading.Event())
    slow.ended(Ended(ctx=None, span=NOTHING, took=2.0), take_next=False)  # type: ignore[arg-type]
    slow.buffer([(_job_stub(1), time.monotonic())])  # type: ignore[list-item]
    assert slow.needs_slot(1)
    stuck = Batch(1.0, 32, threading.Event())
    stuck.ended(fast, take_next=False)
    stuck.buffer([(_job_stub(1), time.monotonic())])  # type: ignore[list-item]
    assert not stuck.needs_slot(3)
    stuck._progress -= 1.0  # a window passed with no slot taking a job (no test waits 1 s)
    assert stuck.needs_slot(3)
    assert stuck.deadline() is not None and stuck.deadline() <= time.monotonic()


@pytest.mark.parametrize("landed", [False, True], ids=["not-landed", "landed-reply-lost"])
def test_a_stale_job_whose_hand_back_fails_is_tried_again_and_never_started(
    monkeypatch: pytest.MonkeyPatch, landed: bool
) -> None:
    """Every slot is in a slow job and the database is away: a buffered job's hand back
    fails (before it landed, or after, its reply lost). The job is not dropped to wait out
    its lease and run on a second attempt (CI saw that once under a PostgreSQL restart), nor
    put where a slot could start it (a landed hand back queued it for anyone): the next
    tick hands it back again, as a retry, and it is queued once, no attempt spent."""
    from django.db import OperationalError

    from feishu_inbox.ledger import rules
    from feishu_inbox.runtime import worker as runtime_worker

    first = enqueue("stale-1", [], partition="p1")
    second = enqueue("stale-2", [], partition="p2")
    worker = runtime_worker.Worker(runtime_worker.WorkerOptions(lease_seconds=30))
    assert worker.claimer.batch is not None
    claimed = ledger.claim(worker.worker_id, limit=2, lease_seconds=30, token="t-stale")
    assert sorted(j.id for j in claimed) == [first, second]
    long_ago = time.monotonic() - 10 * BUFFER_PATIENCE
    worker.claimer.batch.buffer([(j, long_ago) for j in claimed])
    real, refused = ledger.hand_back, []

    def hand_back(lease: ledger.Lease, **kwargs: object) -> str:
        if lease.job_id == first and not refused:
            refused.append(lease.job_id)
            if landed:
                real(lease, **kwargs)  # type: ignore[arg-type]
            raise OperationalError("server closed the connection unexpectedly")
        return real(lease, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(rules, "hand_back", hand_back)
    worker.claimer.hand_back_stale()
    assert refused == [first]
    assert job(first).status == ("queued" if landed else "running")
    assert job(second).status == "queued"
    batch = worker.claimer.batch
    assert batch.buffered() == 0 and batch.next_buffered() is None  # no slot's
    assert [j.id for j, _ in worker.claimer.pending()[1]] == [first]
    worker.claimer.hand_back_stale()
    assert worker.claimer.pending()[1] == []
    rows = EventJob.objects.filter(pk__in=[first, second]).values_list("status", "attempt")
    assert sorted(rows) == [("queued", 0), ("queued", 0)]
    assert Attempt.objects.filter(job_id=first).count() == 1  # handed back once


def test_a_stale_job_the_database_is_away_for_past_its_lease_is_left_to_the_ledger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Away past the job's lease by the worker's clock: the worker stops trying (the ledger
    gives the job to the next claim once its lease has expired) and never starts it."""
    from django.db import OperationalError

    from feishu_inbox.ledger import rules
    from feishu_inbox.runtime import worker as runtime_worker

    late_id = enqueue("stale-late", [], partition="p3")
    worker = runtime_worker.Worker(runtime_worker.WorkerOptions(lease_seconds=30))
    assert worker.claimer.batch is not None
    (late,) = ledger.claim(worker.worker_id, limit=1, lease_seconds=30, token="t-late")
    worker.claimer.batch.buffer([(late, time.monotonic() - 31)])

    def refuse(lease: ledger.Lease, **kwargs: object) -> str:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(rules, "hand_back", refuse)
    worker.claimer.hand_back_stale()
    assert worker.claimer.pending()[1] == [] and worker.claimer.batch.buffered() == 0
    assert job(late_id).status == "running"  # until its lease expires


def _job_stub(job_id: int, of: str = "") -> object:
    class Stub:
        id = job_id
        tenant = of

    return Stub()


# --- on real runworker processes ----------------------------------------------------------------


@contextmanager
def finishes_held(
    partitions: list[str],
) -> Iterator[tuple[Callable[[], bool], Callable[[], None]]]:
    """Hold back every commit that would finish a job of these partitions: PostgreSQL, their
    partition rows locked by another session (a batch locks them first); SQLite, the file's
    write lock held by another process. Yields whether a batch waits on them (PostgreSQL:
    seen waiting on the lock; SQLite: its transaction cannot begin, so as good as sent), and
    what cuts the worker's waiting session off once the worker is killed: PostgreSQL would
    otherwise run the statement it was sent as soon as the lock goes, its client dead or not
    (as it does for a single finish)."""
    if connection.vendor != "postgresql":
        with sqlite_locked():
            yield (lambda: True), (lambda: None)  # the killed process's never began
        return
    other = connections.create_connection("default")

    def waiting(query: str) -> list[int]:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")  # a fresh read: the transaction
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE %s",
                [f"%{query}%"],
            )
            return [pid for (pid,) in cursor.fetchall()]

    def sessions() -> set[int]:
        """The database's sessions but this test's own two."""
        ours = {connection.connection.info.backend_pid} if connection.connection else set()
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")  # would keep its first one
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
            return {pid for (pid,) in cursor.fetchall()} - ours

    def cut_off() -> None:
        assert waiting("feishu_inbox_finish_batch"), "no batch was waiting on the held partitions"
        # Every session of the killed worker, not only the batch seen waiting: with two claims
        # in flight, a second batch sent just before the kill may not have reached the lock
        # yet, and would commit once the lock goes (seen once).
        dead = sessions()
        with other.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", [list(dead)]
            )
        wait_for(lambda: not dead & sessions(), 10, "the killed worker's sessions to end")

    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            cursor.execute(
                "SELECT key FROM feishu_inbox_partition WHERE key = ANY(%s) FOR UPDATE",
                [partitions],
            )
            assert len(cursor.fetchall()) == len(partitions)
        yield (lambda: bool(waiting("feishu_inbox_finish_batch"))), cut_off
    finally:
        other.rollback()
        other.close()


def test_a_worker_killed_between_its_handlers_return_and_their_batch_commit(
    workers: Workers,
) -> None:
    """Four heads run at once and wait on a gate; their partitions' finishes are held back;
    the gate opens and all four handlers return; the worker is killed before any of their
    finishes commits. The next worker runs the three effect-free ones again and every later
    job after them, in order; the one whose effect had started ends ``unknown`` (its effect
    is not repeated), as after a crash before a single finish."""
    chats = [f"chat-{i}" for i in range(4)]
    order: dict[str, list[str]] = defaultdict(list)
    heads = {}
    for i, chat in enumerate(chats):
        steps = ["effect", "gate:g"] if i == 0 else ["gate:g"]
        heads[chat] = enqueue(f"{chat}-0", steps, partition=chat)
        order[chat].append(f"{chat}-0")
    for n in (1, 2):
        for chat in chats[1:]:
            enqueue(f"{chat}-{n}", [], partition=chat)
            order[chat].append(f"{chat}-{n}")
    first = workers.start("--concurrency", "4", "--lease-seconds", "2")
    wait_for(lambda: len(workers.lines("start")) == 4, 30, "the four heads to start")
    wait_for(lambda: workers.lines("effect"), 30, "chat-0's effect")
    with finishes_held(chats) as (batch_waiting, cut_off):
        workers.open_gate("g")
        wait_for(lambda: len(workers.lines("end")) == 4, 30, "the four handlers to return")
        # the handlers' finishes go out in the worker's next batch (its flush window, later
        # on a loaded machine): the kill lands once it waits on the held partitions
        wait_for(batch_waiting, 30, "the finishing batch to wait on the held partitions")
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        cut_off()
    # Not one finish committed: the kill came between the handlers' return and the batch.
    assert {job(heads[c]).status for c in chats} == {"running"}
    workers.start("--concurrency", "4", "--lease-seconds", "2")

    def settled() -> bool:
        return EventJob.objects.filter(status__in=["running", "queued", "retry_wait"]).count() == 0

    wait_for(settled, 60, "every job to end")
    statuses = dict(EventJob.objects.values_list("event_id", "status"))
    assert statuses.pop("chat-0-0") == "unknown"
    assert job(heads["chat-0"]).error_type == "LeaseExpiredAfterSideEffect"
    assert set(statuses.values()) == {"completed"} and len(statuses) == 9
    assert len(workers.lines("effect")) == 1  # never repeated
    starts = workers.lines("start")
    for chat in chats[1:]:
        assert [line[4] for line in starts if line[1] == f"{chat}-0"] == ["1", "2"]  # again
    # Each chat's order: a job starts only after the one before it ended for the last time.
    ends: dict[str, int] = {}
    for line in workers.lines("end"):
        ends[line[1]] = max(ends.get(line[1], 0), int(line[3]))
    for chat in chats[1:]:
        for before, after in zip(order[chat], order[chat][1:], strict=False):
            started = [int(line[3]) for line in starts if line[1] == after]
            assert started and min(started) > ends[before], (chat, before, after)


def test_a_slow_job_never_holds_back_another_partitions_finish(workers: Workers) -> None:
    """With a window of a whole second, a quick job beside a stuck one still completes at
    once: its slot has nothing else to run, so its batch goes without waiting."""
    enqueue("slow", ["gate:slow"], partition="chat-slow")
    workers.start("--concurrency", "2", FEISHU_INBOX_BATCH_WINDOW="1")
    wait_for(lambda: workers.lines("start", "slow"), 30, "the slow job to start")
    quick = enqueue("quick", [], partition="chat-quick")
    wait_for(lambda: job(quick).status == "completed", 5, "the quick job's finish")
    assert job(EventJob.objects.get(event_id="slow").pk).status == "running"
    workers.open_gate("slow")


def _quick_jobs(n: int) -> None:
    for i in range(n):
        enqueue(f"q{i}", [], partition=f"chat-{i}")


def test_a_stopped_worker_leaves_no_claimed_job_behind(workers: Workers) -> None:
    """SIGTERM while fast jobs run from the buffer: the worker hands back what it had claimed
    ahead and writes the finishes that waited, so nothing stays ``running`` after it."""
    _quick_jobs(400)
    proc = workers.start("--concurrency", "2")
    wait_for(lambda: len(workers.lines("end")) >= 60, 30, "the buffer to be in use")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    connection.close()
    statuses = set(EventJob.objects.values_list("status", flat=True))
    assert statuses <= {"completed", "queued"}, statuses
    ran = [line[1] for line in workers.lines("start")]
    assert len(ran) == len(set(ran))  # none ran twice
    assert EventJob.objects.filter(status="completed").count() == len(ran)


def test_max_jobs_runs_exactly_that_many_with_the_buffer(workers: Workers) -> None:
    _quick_jobs(300)
    proc = workers.start("--concurrency", "2", "--max-jobs", "150")
    assert proc.wait(60) == 0
    connection.close()
    assert EventJob.objects.filter(status="completed").count() == 150
    assert not EventJob.objects.filter(status="running").exists()


def test_a_worker_stopping_in_a_blink_hands_back_what_lost_replies_and_failed_hand_backs_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A claim commits and loses its reply, and a buffered job's hand back failed; the worker
    is told to stop before any later claim or tick tries again, and the database is still
    away for its first looks. It tries again as it stops, and hands every one of them back:
    none waits out its lease, none spends an attempt."""
    from django.db import OperationalError

    from feishu_inbox.ledger import rules
    from feishu_inbox.runtime import worker as runtime_worker

    ids = [enqueue(f"lost-{n}", [], partition=f"lost-{n}") for n in range(4)]
    worker = runtime_worker.Worker(runtime_worker.WorkerOptions(lease_seconds=30))
    lost = ledger.claim(worker.worker_id, limit=3, lease_seconds=30, token="t-lost")
    (unreturned,) = ledger.claim(worker.worker_id, limit=1, lease_seconds=30, token="t-un")
    assert sorted(j.id for j in [*lost, unreturned]) == ids
    worker.claimer.keep(lost_tokens=["t-lost"], unreturned=[(unreturned, time.monotonic())])
    real, away = ledger.claimed_with, [1, 2]

    def claimed_with(*args: object) -> list[ledger.ClaimedJob]:
        if away:
            away.pop()
            raise OperationalError("server closed the connection unexpectedly")
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(rules, "claimed_with", claimed_with)
    worker.stop()
    worker.drain()
    assert away == []
    rows = EventJob.objects.filter(pk__in=ids).values_list("status", "attempt")
    assert sorted(rows) == [("queued", 0)] * 4
    assert worker.claimer.pending() == ([], [])


def test_a_lost_claims_job_whose_lease_expired_meanwhile_is_not_found_again() -> None:
    """A claim's reply was lost, and the database stayed away past the lease: the job is no
    longer the worker's to run (the lease sweep gives it to the next claim), so looking for
    it by the claim's token finds nothing, though no sweep ran yet."""
    from datetime import timedelta

    from django.utils import timezone

    live, late = enqueue("live", [], partition="live"), enqueue("late", [], partition="late")
    assert len(ledger.claim("w1", limit=2, lease_seconds=30, token="t-lost")) == 2
    EventJob.objects.filter(pk=late).update(lease_until=timezone.now() - timedelta(seconds=1))
    assert [j.id for j in ledger.claimed_with("w1", "t-lost")] == [live]


@pytest.mark.parametrize("error", ["OperationalError", "InterfaceError"])
def test_claims_whose_replies_were_lost_are_found_again_by_their_tokens(
    monkeypatch: pytest.MonkeyPatch, error: str
) -> None:
    """Two claims in a row commit and lose their replies (the connection drops after the
    statement): the worker keeps both tokens, and its next claim finds their jobs and runs
    them. Every job runs once, on its first attempt, and nothing stays running. Django's
    InterfaceError (a connection the driver found closed) is no DatabaseError: the same."""
    from django import db
    from django.core.management import call_command

    dropped: type[Exception] = getattr(db, error)

    from feishu_inbox.ledger import rules
    from feishu_inbox.runtime import state
    from tests.support import worker_tasks

    results = [worker_tasks.noop.enqueue() for _ in range(30)]
    real_claim, real_batch = ledger.claim, ledger.finish_batch
    lost: list[str] = []

    def claim(*args: object, **kwargs: object) -> list[ledger.ClaimedJob]:
        jobs = real_claim(*args, **kwargs)  # type: ignore[arg-type]
        if jobs and len(lost) < 2:
            lost.append(str(kwargs["token"]))
            raise dropped("server closed the connection unexpectedly")
        return jobs

    def finish_batch(*args: object, **kwargs: object) -> object:
        statuses, jobs = real_batch(*args, **kwargs)  # type: ignore[arg-type]
        if jobs and len(lost) < 2:
            lost.append(str(kwargs["token"]))
            raise dropped("server closed the connection unexpectedly")
        return statuses, jobs

    monkeypatch.setattr(rules, "claim", claim)
    monkeypatch.setattr(rules, "finish_batch", finish_batch)
    monkeypatch.setattr(state, "CLAIM_RETRY_FIRST_DELAY", 0.01)
    call_command("runworker", "--burst", "--concurrency", "2", "-v", "0")
    assert len(lost) == 2 and len(set(lost)) == 2
    assert EventJob.objects.filter(status="completed").count() == len(results)
    assert set(EventJob.objects.values_list("attempt", flat=True)) == {1}
