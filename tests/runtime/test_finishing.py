"""Finishes that end together: one statement and one commit, each fenced on its own."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from feishu_inbox import ledger
from feishu_inbox.ledger import rules
from feishu_inbox.models import Attempt, EventJob, Partition
from feishu_inbox.runtime import finishing
from feishu_inbox.runtime.finishing import Finish, FinishGroup, finish_together
from tests.support.ledger_helpers import assert_mirror_consistent

pytestmark = pytest.mark.django_db


def _running(n: int, worker: str = "w") -> list[ledger.Lease]:
    """n running jobs of one worker, one per chat, each chat with a second job waiting."""
    for i in range(n):
        for j in range(2):
            ledger.enqueue(event_id=f"e{i}-{j}", event_type="t", partition_key=f"c{i}", payload={})
    return [job.lease for job in ledger.claim(worker, limit=n)]


def test_finishes_together_are_one_statement_each_fenced_and_each_claims_its_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b, c = _running(3)
    stale = ledger.Lease(b.job_id, b.worker_id, "not-the-token", b.partition_key, b.attempt)
    # The process's periodic lease-expiry sweep is not the finish: counted once, when it came
    # due on a slow machine between the claim and the finish (2 queries, not 1).
    monkeypatch.setattr(rules, "_last_sweep", [time.monotonic()])
    with CaptureQueriesContext(connection) as queries:
        ended = finish_together([(a, "", "ta"), (stale, "", "tb"), (c, "NoHandler", "")])
    if connection.vendor == "postgresql":
        assert len(queries) == 1  # one statement (in autocommit: one commit)
    (sa, ja), (sb, jb), (sc, jc) = ended
    assert (sa, sb, sc) == ("completed", None, "completed")
    # a's slot claimed its next job with its own token; c asked for none; b changed nothing.
    assert len(ja) == 1 and ja[0].lease.token == "ta" and jb == [] and jc == []
    assert EventJob.objects.get(id=b.job_id).status == "running"
    assert EventJob.objects.get(id=c.job_id).error_type == "NoHandler"
    assert not Attempt.objects.filter(job_id=b.job_id).exists()
    # b's lease still holds: it finishes alone later.
    assert ledger.finish(b) == "completed"
    assert_mirror_consistent()


def test_a_finish_together_whose_reply_was_lost_is_found_when_tried_alone() -> None:
    """The batch committed, its reply was lost: each slot retries alone and finds its own
    outcome and its own next job, without finishing or claiming twice."""
    a, b = _running(2)
    ended = finish_together([(a, "", "ta"), (b, "", "tb")])
    for lease, token, (status, jobs) in zip((a, b), ("ta", "tb"), ended, strict=True):
        again = ledger.finish_and_claim(lease, limit=1, token=token, retrying=True)
        assert again == (status, jobs)
    assert Attempt.objects.filter(job_id__in=[a.job_id, b.job_id]).count() == 2
    assert EventJob.objects.filter(status="running").count() == 2  # the two next jobs, once


def test_finishes_together_lock_partitions_in_key_order() -> None:
    """Finishes given in any order end in partition-key order (the lock order), and the
    partition heads move on."""
    leases = _running(3)
    ended = finish_together([(lease, "", "") for lease in reversed(leases)])
    assert [status for status, _ in ended] == ["completed"] * 3
    heads = dict(Partition.objects.values_list("key", "head_state"))
    assert heads == {"c0": "queued", "c1": "queued", "c2": "queued"}
    assert_mirror_consistent()


def test_finishes_together_of_a_queue_worker_claim_only_in_its_queues() -> None:
    """A `runworker --queue` worker's finishes go together too, and their claims take only
    partitions of its queues (the priority order holds there as everywhere)."""
    a, b = _running(2, "w")  # chats c0, c1, each with a second job waiting
    for name, priority in (("task:emails:x", 0), ("task:emails:y", 5), ("task:other:z", 9)):
        stored = ledger.enqueue(event_id=name, event_type="t", partition_key=name, payload={})
        EventJob.objects.filter(id=stored.job_id).update(priority=priority)
        Partition.objects.filter(key=name).update(head_priority=priority)
    ended = finish_together(
        [(a, "", "ta"), (b, "", "tb")], keys=ledger.KeyFilter(("task:emails:",))
    )
    claimed = [jobs[0].lease.partition_key for _, jobs in ended]
    assert claimed == ["task:emails:y", "task:emails:x"]  # by priority, never c0/c1 or other
    assert_mirror_consistent()


class _Recorder:
    """Stands in for finish_together: records each batch, optionally failing or blocking."""

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.fail = fail

    def __call__(self, finishes: Any, *, lease_seconds: float, keys: Any = None) -> Any:
        self.batches.append([lease.job_id for lease, _, _ in finishes])
        self.keys = keys
        if self.fail:
            raise OperationalError("the database blinked")
        return [("completed" if lease.job_id != 99 else None, []) for lease, _, _ in finishes]


def _finish(job_id: int, alone_calls: list[tuple[int, bool]]) -> Finish:
    lease = ledger.Lease(job_id, "w", "t", f"c{job_id}", 1)

    def alone(retrying: bool) -> tuple[str, list[ledger.ClaimedJob]]:
        alone_calls.append((job_id, retrying))
        return "alone", []

    return Finish(lease, "", "", alone)


def _gathered(group: FinishGroup, finishes: list[Finish]) -> dict[int, Any]:
    """Submit finishes while another batch is being written, then let that one end."""
    results: dict[int, Any] = {}
    with group._changed:
        group._writing = 1  # a batch in flight
    threads = [
        threading.Thread(target=lambda f=f: results.update({f.lease.job_id: group.finish(f)}))
        for f in finishes
    ]
    for t in threads:
        t.start()
    while True:
        with group._changed:
            if len(group._waiting) == len(finishes):
                group._writing = 0  # the batch in flight ends
                group._changed.notify_all()
                break
    for t in threads:
        t.join(10)
    return results


@pytest.mark.django_db(transaction=False)
def test_finishes_that_end_while_one_is_written_go_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = _Recorder()
    monkeypatch.setattr(finishing, "finish_together", recorder)
    alone: list[tuple[int, bool]] = []
    queues = ledger.KeyFilter(("task:emails:",))
    group = FinishGroup(60, keys=queues)  # a `runworker --queue` worker's
    results = _gathered(group, [_finish(i, alone) for i in (1, 2, 99)])
    assert [sorted(b) for b in recorder.batches] == [[1, 2, 99]]  # one statement for three
    assert recorder.keys == queues  # its claims keep the worker's queues
    assert results[1] == results[2] == ("completed", [])
    # 99's lease was lost: refused on its own, it finishes alone (not as a retry) to learn why.
    assert alone == [(99, False)] and results[99] == ("alone", [])


def test_a_finish_alone_never_waits_and_a_failed_batch_is_retried_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = _Recorder(fail=True)
    monkeypatch.setattr(finishing, "finish_together", recorder)
    alone: list[tuple[int, bool]] = []
    group = FinishGroup(60)
    assert group.finish(_finish(5, alone)) == ("alone", [])  # nothing in flight: alone, at once
    assert recorder.batches == [] and alone == [(5, False)]
    alone.clear()
    _gathered(group, [_finish(i, alone) for i in (1, 2)])
    assert len(recorder.batches) == 1
    assert sorted(alone) == [(1, True), (2, True)]  # the batch may have landed: retries


def test_finishes_gather_while_one_is_written_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A finish written alone counts as in flight: those that end meanwhile go together."""
    recorder = _Recorder()
    monkeypatch.setattr(finishing, "finish_together", recorder)
    group = FinishGroup(60)
    writing, release = threading.Event(), threading.Event()

    def slow_alone(retrying: bool) -> tuple[str, list[ledger.ClaimedJob]]:
        writing.set()
        release.wait(10)
        return "completed", []

    first = Finish(ledger.Lease(7, "w", "t", "c7", 1), "", "", slow_alone)
    leader = threading.Thread(target=group.finish, args=(first,))
    leader.start()
    writing.wait(10)
    alone: list[tuple[int, bool]] = []
    others = [threading.Thread(target=group.finish, args=(_finish(i, alone),)) for i in (1, 2)]
    for t in others:
        t.start()
    while True:
        with group._changed:
            if len(group._waiting) == 2:
                break
    release.set()
    for t in (leader, *others):
        t.join(10)
    assert [sorted(b) for b in recorder.batches] == [[1, 2]] and alone == []


@pytest.mark.parametrize("earlier", ["retry_wait", "failed", "unknown", "queued", "cancelled"])
def test_the_new_head_is_the_first_unresolved_job_whatever_came_before(earlier: str) -> None:
    """The end of an attempt finds the partition's new head by the first non-completed job of
    the whole partition, not the first after the job that ended: it needs no proof that every
    earlier job is completed. Forced here: a job runs while an earlier one is unresolved (or
    cancelled, that is completed); when it finishes, the head is that earlier job (or, after a
    cancelled one, the next)."""
    for name in ("a", "b", "c"):
        ledger.enqueue(event_id=name, event_type="t", partition_key="p", payload={})
    a, b, c = EventJob.objects.order_by("id")
    if earlier == "cancelled":
        EventJob.objects.filter(id=a.id).update(status="completed", error_type="Cancelled")
    else:
        EventJob.objects.filter(id=a.id).update(status=earlier)
    Partition.objects.filter(key="p").update(head_id=b.id)  # as if b were the head
    [job] = ledger.claim("w")
    assert job.id == b.id
    assert ledger.finish(job.lease) == "completed"
    part = Partition.objects.get(key="p")
    if earlier == "cancelled":
        assert (part.head_id, part.head_state) == (c.id, "queued")
    else:
        assert (part.head_id, part.head_state) == (a.id, earlier)
    assert_mirror_consistent()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("together", [True, False], ids=["FINISH_TOGETHER", "apart"])
def test_a_real_worker_finishes_every_job_once_together_or_apart(
    together: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FINISH_TOGETHER on: a worker's finishes that coincide share a statement (when they
    coincide is the machine's business); off (the default): every slot writes its own and no
    group ever forms. Either way each job runs and ends once, and the heads stay right."""
    from django.core.management import call_command
    from django.test import override_settings

    from tests.support import worker_tasks

    results = [worker_tasks.noop.enqueue() for _ in range(40)]
    grouped: list[int] = []
    real = finishing.finish_together

    def counted(finishes: Any, **kwargs: Any) -> Any:
        grouped.append(len(finishes))
        return real(finishes, **kwargs)

    monkeypatch.setattr(finishing, "finish_together", counted)
    with override_settings(FEISHU_INBOX={"FINISH_TOGETHER": together}):
        call_command("runworker", "--burst", "--concurrency", "4", "-v", "0")
    assert EventJob.objects.filter(status="completed").count() == len(results)
    assert Attempt.objects.count() == len(results)  # each ran once
    assert all(n >= 2 for n in grouped)  # a group is two finishes or more, else alone
    if not together:
        assert grouped == []
    assert_mirror_consistent()
