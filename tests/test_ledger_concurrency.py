"""Real concurrency on PostgreSQL: threads with their own connections race on the ledger."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections, transaction

from feishu_inbox import ledger
from feishu_inbox.models import Attempt, EventJob, Partition

from .ledger_helpers import assert_mirror_consistent

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
    for key, runs in intervals.items():
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
    b_ready, b_release = threading.Event(), threading.Event()
    ids: dict[str, int] = {}

    def enqueue_b() -> None:
        with transaction.atomic():
            ids["b"] = ledger.enqueue(
                event_id="b", event_type="t", partition_key="p", payload={}
            ).job_id
            b_ready.set()
            assert b_release.wait(10)

    def enqueue_a() -> None:
        assert b_ready.wait(10)
        ids["a"] = ledger.enqueue(event_id="a", event_type="t", partition_key="p", payload={})
        ids["a"] = ids["a"].job_id  # type: ignore[attr-defined]

    tb = threading.Thread(target=lambda: (enqueue_b(), connections.close_all()))
    ta = threading.Thread(target=lambda: (enqueue_a(), connections.close_all()))
    tb.start()
    ta.start()
    try:
        wait_for(lambda: backends_waiting_on_locks() >= 1, what="A to wait for B's lock")
        assert "a" not in ids
    finally:
        b_release.set()
        tb.join(10)
        ta.join(10)
    assert ids["b"] < ids["a"]
    assert [j.id for j in ledger.claim("w", limit=5)] == [ids["b"]]


def test_finish_racing_an_enqueue_never_orphans_the_new_job() -> None:
    """An enqueue commits while finish waits for the partition: the new job becomes the head."""
    ledger.enqueue(event_id="head", event_type="t", partition_key="p", payload={})
    lease = ledger.claim("w")[0].lease
    connections.close_all()
    holding, release = threading.Event(), threading.Event()
    result: dict[str, Any] = {}

    def enqueue_and_hold() -> None:
        with transaction.atomic():
            result["new"] = ledger.enqueue(
                event_id="new", event_type="t", partition_key="p", payload={}
            ).job_id
            holding.set()
            assert release.wait(10)

    def finish_head() -> None:
        assert holding.wait(10)
        result["finish"] = ledger.finish(lease)

    te = threading.Thread(target=lambda: (enqueue_and_hold(), connections.close_all()))
    tf = threading.Thread(target=lambda: (finish_head(), connections.close_all()))
    te.start()
    tf.start()
    try:
        wait_for(lambda: backends_waiting_on_locks() >= 1, what="finish to wait for enqueue")
    finally:
        release.set()
        te.join(10)
        tf.join(10)
    assert result["finish"] == "completed"
    part = Partition.objects.get(key="p")
    assert (part.head_id, part.head_state) == (result["new"], "queued")
    assert [j.id for j in ledger.claim("w2")] == [result["new"]]


def test_claimers_skip_locked_partitions_instead_of_waiting() -> None:
    for i in range(3):
        ledger.enqueue(event_id=f"e{i}", event_type="t", partition_key=f"p{i}", payload={})
    holding, release = threading.Event(), threading.Event()
    got: dict[str, list[int]] = {}

    def hold_first_claim() -> None:
        with transaction.atomic():
            got["first"] = [j.id for j in ledger.claim("w1")]
            holding.set()
            assert release.wait(10)

    t = threading.Thread(target=lambda: (hold_first_claim(), connections.close_all()))
    t.start()
    try:
        assert holding.wait(10)
        started = time.monotonic()
        got["second"] = [j.id for j in ledger.claim("w2", limit=5)]
        assert time.monotonic() - started < 5  # did not wait on the first claimer's locks
    finally:
        release.set()
        t.join(10)
    assert len(got["first"]) == 1
    assert set(got["first"]).isdisjoint(got["second"])
    assert len(got["second"]) == 2


def test_explain_claim_uses_the_partition_index_not_a_backlog_scan() -> None:
    for i in range(300):
        ledger.enqueue(event_id=f"e{i}", event_type="t", partition_key=f"p{i % 30}", payload={})
    with connection.cursor() as cur:
        cur.execute("ANALYZE")
        cur.execute("SET enable_seqscan = off")  # tiny tables: ask what the plan can use
        cur.execute(
            f"EXPLAIN SELECT key, head_id FROM {ledger.P} "
            f"WHERE head_state IN ('queued', 'retry_wait') AND head_due_at <= now() "
            "ORDER BY head_id LIMIT 1 FOR UPDATE SKIP LOCKED"
        )
        plan = "\n".join(r[0] for r in cur.fetchall())
        cur.execute("RESET enable_seqscan")
    assert "feishu_inbox_part_claimable" in plan, plan
    assert ledger.J not in plan  # the claim never reads the job backlog


def test_purge_skips_a_partition_an_enqueue_holds() -> None:
    Partition.objects.create(key="quiet", head_state="idle")  # a chat whose jobs were purged
    holding, release = threading.Event(), threading.Event()
    ids: dict[str, int] = {}

    def enqueue_and_hold() -> None:
        with transaction.atomic():
            ids["new"] = ledger.enqueue(
                event_id="n", event_type="t", partition_key="quiet", payload={}
            ).job_id
            holding.set()
            assert release.wait(10)

    t = threading.Thread(target=lambda: (enqueue_and_hold(), connections.close_all()))
    t.start()
    try:
        assert holding.wait(10)
        started = time.monotonic()
        assert ledger.purge().partitions_deleted == 0  # skipped, not waited for
        assert time.monotonic() - started < 5
    finally:
        release.set()
        t.join(10)
    assert [j.id for j in ledger.claim("w")] == [ids["new"]]
