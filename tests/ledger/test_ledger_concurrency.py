"""Real concurrency on PostgreSQL: threads with their own connections race on the ledger."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, connections, transaction

from feishu_inbox import ledger
from feishu_inbox.ledger import retention
from feishu_inbox.models import Attempt, EventJob, Partition
from feishu_inbox.store.schema import JOB_TABLE, PARTITION_TABLE
from tests.support.ledger_helpers import assert_mirror_consistent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("postgres_only")]


def run_threads(target: Callable[[int], None], count: int, timeout: float = 120) -> None:
    """Run ``target(i)`` in ``count`` threads, each with its own connection; re-raise errors."""
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a thread did not finish in time"
    if errors:
        raise errors[0]


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.005)  # polling interval of a condition wait, not synchronisation


@contextmanager
def held_open(fn: Callable[[], Any]) -> Iterator[Any]:
    """Run ``fn`` in another thread inside a transaction, and keep that transaction open
    (its locks held) until the block ends; yields what ``fn`` returned."""
    holding, release = threading.Event(), threading.Event()
    result: list[Any] = []
    failed: list[BaseException] = []

    def body() -> None:
        try:
            with transaction.atomic():
                result.append(fn())
                holding.set()
                release.wait(10)
        except BaseException as exc:
            failed.append(exc)
            holding.set()
        finally:
            connections.close_all()

    thread = threading.Thread(target=body)
    thread.start()
    try:
        assert holding.wait(10), "the held transaction did not start"
        if failed:
            raise failed[0]
        yield result[0]
    finally:
        release.set()
        thread.join(10)


class InThread:
    """Run ``fn`` in another thread with its own connection; ``join()`` returns its result."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._result: list[Any] = []
        self._failed: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(fn,))
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._result.append(fn())
        except BaseException as exc:
            self._failed.append(exc)
        finally:
            connections.close_all()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float = 10) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the thread did not finish"
        if self._failed:
            raise self._failed[0]
        return self._result[0]


def backends_waiting_on_locks() -> int:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return int(cur.fetchone()[0])


def test_eight_claimers_complete_2000_jobs_exactly_once_in_partition_order() -> None:
    partitions = 50
    total = 2000
    ids_by_partition: dict[str, list[int]] = defaultdict(list)
    for i in range(total):
        key = f"chat-{i % partitions}"
        ids_by_partition[key].append(
            ledger.enqueue(
                event_id=f"e{i}", event_type="t", partition_key=key, payload={"i": i}
            ).job_id
        )
    connections.close_all()

    lock = threading.Lock()
    intervals: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    done = [0]

    def claimer(n: int) -> None:
        while True:
            with lock:
                if done[0] >= total:
                    return
            claimed = ledger.claim(f"w{n}", limit=random.choice((1, 2)))
            got = time.monotonic()
            for job in claimed:
                if random.random() < 0.02:  # a worker that lets go now and then
                    ledger.hand_back(job.lease)
                    continue
                ending = time.monotonic()
                assert ledger.finish(job.lease) == "completed"
                with lock:
                    intervals[job.lease.partition_key].append((job.id, got, ending))
                    done[0] += 1

    run_threads(claimer, 8)

    assert EventJob.objects.completed().count() == total
    finished = Attempt.objects.filter(outcome="completed")
    assert finished.count() == total  # every job completed exactly once
    assert len(set(finished.values_list("job_id", flat=True))) == total
    for key, recorded in intervals.items():
        # In the order they were claimed: a thread may append its job after the next one of
        # its chat was claimed and finished by another (it finished first, then lost the CPU).
        runs = sorted(recorded, key=lambda run: run[1])
        assert [job_id for job_id, _, _ in runs] == ids_by_partition[key], key
        for (_, _, prev_end), (_, next_start, _) in itertools.pairwise(runs):
            assert next_start > prev_end, f"two jobs of {key} ran at once"
    assert_mirror_consistent()


def test_racing_enqueues_into_one_partition_are_claimed_in_commit_order() -> None:
    writers, per_writer = 8, 60
    total = writers * per_writer
    claimed_order: list[int] = []
    stop = threading.Event()

    def writer(n: int) -> None:
        for i in range(per_writer):
            ledger.enqueue(event_id=f"w{n}-{i}", event_type="t", partition_key="hot", payload={})

    def claimer() -> None:
        try:
            while len(claimed_order) < total and not stop.is_set():
                for job in ledger.claim("c"):
                    claimed_order.append(job.id)
                    ledger.finish(job.lease)
        finally:
            connections.close_all()

    consumer = threading.Thread(target=claimer)
    consumer.start()
    try:
        run_threads(writer, writers)
        consumer.join(60)
    finally:
        stop.set()
        consumer.join(5)
    # Sequence order = commit order: a job whose id is lower but committed later would have
    # been skipped by the claimer, which then claims ids out of order.
    assert claimed_order == sorted(claimed_order)
    assert len(claimed_order) == total


def test_an_enqueue_that_takes_its_sequence_first_commits_first() -> None:
    """B holds the partition; A must wait for B's commit before taking a sequence."""

    def enqueue(name: str) -> int:
        return ledger.enqueue(event_id=name, event_type="t", partition_key="p", payload={}).job_id

    with held_open(lambda: enqueue("b")) as b:
        a = InThread(lambda: enqueue("a"))
        wait_for(lambda: backends_waiting_on_locks() >= 1, what="A to wait for B's lock")
        assert not a.done()
    assert b < a.join()
    assert [j.id for j in ledger.claim("w", limit=5)] == [b]


def test_finish_racing_an_enqueue_never_orphans_the_new_job() -> None:
    """An enqueue commits while finish waits for the partition: the new job becomes the head."""
    ledger.enqueue(event_id="head", event_type="t", partition_key="p", payload={})
    lease = ledger.claim("w")[0].lease
    connections.close_all()
    with held_open(
        lambda: ledger.enqueue(event_id="new", event_type="t", partition_key="p", payload={})
    ) as enqueued:
        finishing = InThread(lambda: ledger.finish(lease))
        wait_for(lambda: backends_waiting_on_locks() >= 1, what="finish to wait for enqueue")
    assert finishing.join() == "completed"
    part = Partition.objects.get(key="p")
    assert (part.head_id, part.head_state) == (enqueued.job_id, "queued")
    assert [j.id for j in ledger.claim("w2")] == [enqueued.job_id]


def test_claimers_skip_locked_partitions_instead_of_waiting() -> None:
    for i in range(3):
        ledger.enqueue(event_id=f"e{i}", event_type="t", partition_key=f"p{i}", payload={})
    with held_open(lambda: [j.id for j in ledger.claim("w1")]) as first:
        started = time.monotonic()
        second = [j.id for j in ledger.claim("w2", limit=5)]
        # did not wait on the first claimer's locks (held until this block ends: waiting on
        # them would never return); milliseconds idle
        assert time.monotonic() - started < 5
    assert len(first) == 1 and len(second) == 2
    assert set(first).isdisjoint(second)


def test_explain_claim_uses_the_partition_index_not_a_backlog_scan() -> None:
    for i in range(300):
        ledger.enqueue(event_id=f"e{i}", event_type="t", partition_key=f"p{i % 30}", payload={})
    with connection.cursor() as cur:
        cur.execute("ANALYZE")
        cur.execute("SET enable_seqscan = off")  # tiny tables: ask what the plan can use
        cur.execute(
            f"EXPLAIN SELECT key, head_id FROM {PARTITION_TABLE} "
            f"WHERE head_state IN ('queued', 'retry_wait') AND head_tenant = '' "
            "AND head_due_at <= now() "
            # the claim's order since 0013 (feishu_inbox_claim): by head_id alone, the index's
            # order did not serve it, and on some statistics a sort of the due heads won; of
            # the one claimable tenant since 0039
            "ORDER BY head_priority DESC, head_id LIMIT 1 FOR UPDATE SKIP LOCKED"
        )
        plan = "\n".join(r[0] for r in cur.fetchall())
        cur.execute("RESET enable_seqscan")
    assert "feishu_inbox_part_claimable" in plan, plan
    assert JOB_TABLE not in plan  # the claim never reads the job backlog


def test_purge_skips_a_partition_an_enqueue_holds() -> None:
    Partition.objects.create(key="quiet", head_state="idle")  # a chat whose jobs were purged
    with held_open(
        lambda: ledger.enqueue(event_id="n", event_type="t", partition_key="quiet", payload={})
    ) as enqueued:
        started = time.monotonic()
        assert retention.purge().partitions_deleted == 0  # skipped, not waited for
        assert time.monotonic() - started < 5  # as above: a wait would never return
    assert [j.id for j in ledger.claim("w")] == [enqueued.job_id]
