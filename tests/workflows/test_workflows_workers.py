"""Workflows on real ``runworker`` processes, killed with SIGKILL (SPEC §9f, invariant 9): a
parent's thousand children each run once and it resumes once with every result; batches fire
their callbacks once however their members' ends race; a chain survives a kill in each link;
a cancelled parent's running children stop at their next heartbeat."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter, defaultdict

import pytest
from django.db import transaction

import feishu_inbox
from feishu_inbox import ledger
from feishu_inbox.models import EventJob, Step
from feishu_inbox.tables.batches import Batch, BatchState
from feishu_inbox.waiting import Wait
from tests.support.processes import wait_for
from tests.support.worker_helpers import Workers

pytestmark = pytest.mark.django_db(transaction=True)

CHILDREN, BATCHES, MEMBERS, LINKS, RUNNING = 1000, 20, 1000, 5, 500


def statuses(**where: object) -> Counter[str]:
    return Counter(EventJob.objects.filter(**where).values_list("status", flat=True))


def distinct_keys(workers: Workers, kind: str) -> dict[str, set[str]]:
    """Each job's effect keys, from the handlers' log: one key per job means the remote side
    (which deduplicates by it) applied the effect once, however often it was sent."""
    keys: dict[str, set[str]] = defaultdict(set)
    for line in workers.lines(kind):
        keys[line[1]].add(line[2])
    return keys


def test_a_parent_fans_out_a_thousand_children_over_four_workers_killed_repeatedly(
    workers: Workers,
) -> None:
    parent = ledger.enqueue(
        event_id="fan", event_type="test.fanout", partition_key="chat-fan", payload={"n": CHILDREN}
    ).job_id
    args = ("--concurrency", "4", "--lease-seconds", "2")
    for _ in range(2):
        workers.start(*args)
    killable = [workers.start(*args), workers.start(*args)]

    def completed_children() -> int:
        return statuses(parent_id=parent)["completed"]

    kills, seen = 0, 0
    while statuses(id=parent)["completed"] == 0:
        wait_for(
            lambda seen=seen: (
                completed_children() >= seen + 150 or statuses(id=parent)["completed"]
            ),
            180,
            "150 more children to complete (or the parent)",
            seen=lambda: (statuses(parent_id=parent), statuses(id=parent)),
        )
        seen = completed_children()
        victim = killable[kills % 2]
        os.kill(victim.pid, signal.SIGKILL)  # killed wherever it is: claiming, running, folding
        victim.wait(10)
        killable[kills % 2] = workers.start(*args)
        kills += 1
    assert kills >= 4, kills

    children = list(EventJob.objects.filter(parent_id=parent).order_by("id"))
    assert len(children) == CHILDREN  # none spawned twice
    assert len({c.event_id for c in children}) == CHILDREN
    assert Counter(c.status for c in children) == {"completed": CHILDREN}
    # One memo per chunk of the fan-out, each recorded once.
    memos = list(
        Step.objects.filter(job_id=parent, name__startswith="spawn:").values_list("name", flat=True)
    )
    assert sorted(memos) == [f"spawn:0:1/{n}" for n in range(4)]
    # Every child's effect applied once (its key deduplicated by the remote side).
    effects = distinct_keys(workers, "child_effect")
    assert {c.event_id for c in children} == set(effects)
    assert all(len(keys) == 1 for keys in effects.values())
    # The parent resumed once, with every child's result, and its own effect once.
    [wait] = Wait.objects.filter(job_id=parent)
    assert wait.state == "delivered" and len(wait.payload) == CHILDREN
    assert [o["result"]["i"] for o in wait.payload] == list(range(CHILDREN))
    resumed = workers.lines("resumed", "fan")
    assert resumed and all(line[2:5] == [str(CHILDREN), str(CHILDREN), "1"] for line in resumed)
    assert len(distinct_keys(workers, "parent_effect")["fan"]) == 1
    assert Batch.objects.get(wait_id=wait.pk).state == BatchState.FIRED


def test_twenty_batches_of_a_thousand_fire_each_callback_once_whatever_the_race(
    workers: Workers,
) -> None:
    # Two processes of four slots: members of each batch end on both, at the same moments;
    # they start first, so the batches' members run while later batches are stored.
    for _ in range(2):
        workers.start("--concurrency", "4")
    handles = []
    for b in range(BATCHES):
        with transaction.atomic():
            handles.append(
                feishu_inbox.batch(
                    [feishu_inbox.job("test.steps", {"i": i}) for i in range(MEMBERS)],
                    on_success=feishu_inbox.job("test.wf_callback", {"which": "success"}),
                    on_complete=feishu_inbox.job("test.wf_callback", {"which": "complete"}),
                    description=f"batch {b}",
                )
            )
    wait_for(
        lambda: (
            len(workers.lines("callback")) >= 2 * BATCHES
            and statuses()["completed"] == BATCHES * (MEMBERS + 2)
        ),
        300,
        "every member and both callbacks of every batch",
        seen=lambda: (statuses(), len(workers.lines("callback"))),
    )
    ran = Counter((line[1], line[2]) for line in workers.lines("callback"))
    for handle in handles:
        assert ran[(str(handle.id), "success")] == 1
        assert ran[(str(handle.id), "complete")] == 1
        batch = Batch.objects.get(pk=handle.id)
        assert batch.state == BatchState.FIRED and batch.pending == 0
        assert len(batch.fired_jobs) == 2
        last_end = max(
            EventJob.objects.filter(batch_id=handle.id).values_list("finished_at", flat=True)
        )
        for callback in EventJob.objects.filter(pk__in=batch.fired_jobs):
            assert callback.received_at >= last_end  # after every member had ended
    for line in workers.lines("callback"):
        assert line[3:5] == [str(MEMBERS), f'{{"completed":{MEMBERS}}}']
    # Both worker processes ran members.
    assert len({line[2] for line in workers.lines("end")}) == 2


def link_started(workers: Workers, k: int, attempt: int) -> bool:
    """The chain's ``k``-th link (in the order links started) started its ``attempt``."""
    starts = workers.lines("child_start")
    links = list(dict.fromkeys(line[1] for line in starts))
    return len(links) > k and any(s[1] == links[k] and s[3] == str(attempt) for s in starts)


def test_a_chain_of_five_survives_a_kill_in_each_link(workers: Workers) -> None:
    handle = feishu_inbox.chain(
        *[
            feishu_inbox.job("test.wf_child", {"i": 0, "steps": [f"gate:link{k}"]})
            for k in range(LINKS)
        ]
    )
    args = ("--concurrency", "1", "--lease-seconds", "1")
    worker = workers.start(*args)
    for k in range(LINKS):
        wait_for(lambda k=k: link_started(workers, k, 1), 60, f"link {k} to start")
        os.kill(worker.pid, signal.SIGKILL)  # killed inside the link, before its effect
        worker.wait(10)
        worker = workers.start(*args)
        wait_for(lambda k=k: link_started(workers, k, 2), 60, f"link {k} to run again")
        workers.open_gate(f"link{k}")

    wait_for(
        lambda: Batch.objects.get(pk=handle.id).state == BatchState.FIRED,
        60,
        "the chain to end",
        seen=lambda: Batch.objects.get(pk=handle.id),
    )
    chain = Batch.objects.get(pk=handle.id)
    links = [EventJob.objects.get(pk=job_id) for job_id in chain.fired_jobs]
    assert len(links) == LINKS and all(link.status == "completed" for link in links)
    # Each link got its predecessor's result: i counts up through the chain.
    assert [link.payload.get("previous", {}).get("i") for link in links] == [None, 0, 1, 2, 3]
    effects = distinct_keys(workers, "child_effect")
    assert {link.event_id for link in links} == set(effects)
    assert all(len(keys) == 1 for keys in effects.values())


def test_cancelling_a_parent_stops_its_five_hundred_running_children(workers: Workers) -> None:
    parent = ledger.enqueue(
        event_id="tree",
        event_type="test.fanout",
        partition_key="chat-tree",
        payload={"n": RUNNING, "steps": ["checkpoints:300"]},
    ).job_id
    for _ in range(2):
        workers.start("--concurrency", str(RUNNING // 2 + 1))
    wait_for(
        lambda: (
            statuses(parent_id=parent)["running"] == RUNNING and statuses(id=parent)["waiting"] == 1
        ),
        180,
        "every child to run while the parent waits",
        seen=lambda: (statuses(parent_id=parent), statuses(id=parent)),
    )
    asked = time.monotonic()
    outcome = ledger.cancel([parent])
    children = set(EventJob.objects.filter(parent_id=parent).values_list("id", flat=True))
    # Each child cancelled: asked to stop if it runs, at once if it was between attempts (a
    # child whose lease the loaded machine let lapse is back in the queue a moment).
    assert parent in outcome.done
    assert set(outcome.pending) | (set(outcome.done) - {parent}) == children
    wait_for(
        lambda: statuses(parent_id=parent)["running"] == 0,
        60,
        "no child running",
        seen=lambda: statuses(parent_id=parent),
    )
    took = time.monotonic() - asked
    children = EventJob.objects.filter(parent_id=parent)
    assert Counter(children.values_list("status", "error_type")) == {
        ("completed", "Cancelled"): RUNNING
    }
    assert not workers.lines("child_effect")  # none reached its effect
    assert EventJob.objects.get(pk=parent).status == "completed"
    print(
        f"{len(outcome.pending)} running children (of {RUNNING}) stopped {took:.2f}s after "
        "their parent's cancel"
    )


def test_tasks_as_children_batch_members_callbacks_and_chain_links(workers: Workers) -> None:
    from tests.support import worker_tasks as t

    parent = ledger.enqueue(
        event_id="tp", event_type="test.task_parent", partition_key="chat-tp", payload={"n": 20}
    ).job_id
    with transaction.atomic():
        handle = feishu_inbox.batch(
            [feishu_inbox.job(t.add, [i, i]) for i in range(10)],
            on_complete=feishu_inbox.job(t.collect, {"tag": "done"}),
        )
        chain = feishu_inbox.chain(
            feishu_inbox.job(t.add, [1, 2]), feishu_inbox.job(t.add, [10]), t.echo
        )
    workers.start("--concurrency", "4")
    wait_for(
        lambda: (
            workers.lines("task_sum")
            and workers.lines("collected")
            and (Batch.objects.get(pk=chain.id).state == BatchState.FIRED)
        ),
        120,
        "the task parent, the batch's callback and the chain",
        seen=lambda: (statuses(), workers.lines("task_sum"), workers.lines("collected")),
    )
    # The parent summed its 20 task children's return values: sum(i + 100).
    assert workers.lines("task_sum") == [["task_sum", "tp", str(sum(range(20)) + 2000)]]
    assert statuses(parent_id=parent) == {"completed": 20}
    # The callback task got the summary as its `batch` keyword argument, once.
    [collected] = workers.lines("collected")
    assert collected[1:4] == ["done", str(handle.id), "10"]
    # Each link's result was the next one's first argument: add(1, 2) = 3, add(3, 10) = 13,
    # echo(13) = {"args": [13], …}.
    links = Batch.objects.get(pk=chain.id).fired_jobs
    echoed = Step.objects.get(job_id=links[-1], name="django.tasks:return_value").result
    assert echoed == {"args": [13], "kwargs": {}}
