"""Workflows (SPEC §9f) in the ledger, on both databases: spawns memoized, a parent's wait for
its children, batches whose callbacks are enqueued once, chains, cancel of a tree, refusals.
tests/workflows/test_workflows_workers.py proves the same on real workers, killed."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

import feishu_inbox
from feishu_inbox import ledger
from feishu_inbox.errors import ChildFailed, Suspended, WaitTimedOut, WorkflowRefused
from feishu_inbox.ledger import rules
from feishu_inbox.ledger.kinds import RESULT_STEP
from feishu_inbox.models import EventJob, Status
from feishu_inbox.runtime import attempts
from feishu_inbox.tables.batches import Batch, BatchEvent, BatchState
from tests.runtime.test_steps import InHandler

pytestmark = pytest.mark.django_db


def enqueue(event_id: str, chat: str = "chat-1", event_type: str = "test.parent") -> int:
    return ledger.enqueue(
        event_id=event_id, event_type=event_type, partition_key=chat, payload={}
    ).job_id


def claim_job(job_id: int) -> ledger.ClaimedJob:
    """Claim until ``job_id`` comes (other jobs claimed meanwhile are handed back)."""
    others = []
    try:
        for _ in range(200):
            found = ledger.claim("w", limit=1)
            assert found, f"job {job_id} never became claimable"
            if found[0].id == job_id:
                return found[0]
            others.append(found[0])
        raise AssertionError(f"job {job_id} never claimed")
    finally:
        for other in others:
            ledger.hand_back(other.lease)


def run(claimed: ledger.ClaimedJob, body: Any) -> tuple[str, Any]:
    """Run ``body()`` as the claimed job's handler: ("returned", value), or the state after
    the worker suspended it."""
    with InHandler(claimed) as ctx:
        try:
            return "returned", body()
        except Suspended as suspended:
            return "suspended", attempts.suspend(ctx, suspended)


def complete(job_id: int, result: Any = None) -> None:
    """Run a member to completion, its handler returning ``result`` (recorded as a workflow
    job's result is)."""
    claimed = claim_job(job_id)
    if result is not None:
        ledger.record_step(claimed.lease, name=RESULT_STEP, result=_json(result), took=0)
    ledger.finish(claimed.lease)


def fail(job_id: int) -> None:
    claimed = claim_job(job_id)
    ledger.fail(claimed.lease, error_type="Boom", message="it broke", final=True)


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


def fire() -> int:
    return rules.fire_batches()


def status(job_id: int) -> str:
    return EventJob.objects.get(pk=job_id).status


# --- spawn -------------------------------------------------------------------------------------


def test_a_retried_parent_gets_its_children_back_and_spawns_none() -> None:
    parent = enqueue("p1")
    first = claim_job(parent)
    how, kids = run(first, lambda: feishu_inbox.spawn_many("test.child", [{"n": 1}, {"n": 2}]))
    assert how == "returned" and len(kids) == 2
    ledger.fail(first.lease, error_type="Crash", retry_in=0)
    EventJob.objects.filter(pk=parent).update(
        available_at=EventJob.objects.get(pk=parent).received_at
    )
    again = claim_job(parent)
    how, same = run(again, lambda: feishu_inbox.spawn_many("test.child", [{"n": 1}, {"n": 2}]))
    assert same == kids
    children = EventJob.objects.filter(parent_id=parent).order_by("id")
    assert [c.pk for c in children] == [k.job_id for k in kids]
    assert [c.payload for c in children] == [{"n": 1}, {"n": 2}]
    # each in a partition of its own, not the parent's chat
    assert len({c.partition_key for c in children}) == 2
    assert all(c.partition_key != "chat-1" for c in children)


def test_an_ordered_child_runs_in_its_parents_chat_behind_it() -> None:
    parent = enqueue("p1")
    claimed = claim_job(parent)
    _, child = run(claimed, lambda: feishu_inbox.spawn("test.child", {"x": 1}, ordered=True))
    assert EventJob.objects.get(pk=child.job_id).partition_key == "chat-1"
    assert ledger.claim("w") == []  # behind its running parent
    ledger.finish(claimed.lease)
    assert [c.id for c in ledger.claim("w")] == [child.job_id]


def test_a_cancelled_job_spawns_nothing() -> None:
    parent = enqueue("p1")
    claimed = claim_job(parent)
    feishu_inbox.ledger.cancel([parent])
    with pytest.raises(WorkflowRefused, match="cancelled"):
        run(claimed, lambda: feishu_inbox.spawn("test.child"))
    assert not EventJob.objects.filter(parent_id=parent).exists()


# --- waiting for children ------------------------------------------------------------------------


def test_a_parent_waits_without_a_lease_and_resumes_once_with_every_result() -> None:
    parent = enqueue("p1")

    def body() -> Any:
        kids = feishu_inbox.spawn_many("test.child", [{"n": i} for i in range(3)])
        return feishu_inbox.wait_all(kids)

    how, state = run(claim_job(parent), body)
    assert (how, state) == ("suspended", "waiting")
    kids = list(
        EventJob.objects.filter(parent_id=parent).order_by("id").values_list("id", flat=True)
    )
    complete(kids[0], {"r": 0})
    fail(kids[1])
    assert fire() >= 1 and status(parent) == Status.WAITING  # one still runs
    complete(kids[2], {"r": 2})
    fire()
    assert status(parent) == Status.QUEUED
    how, results = run(claim_job(parent), body)
    assert how == "returned"
    assert [(r.job_id, r.state, r.result) for r in results] == [
        (kids[0], "completed", {"r": 0}),
        (kids[1], "failed", None),
        (kids[2], "completed", {"r": 2}),
    ]
    assert results[1].error_type == "Boom" and not results[1].ok
    with pytest.raises(ChildFailed, match="failed"):
        _ = results[1].value
    assert results[2].value == {"r": 2}
    # Fired once: more folds change nothing.
    assert fire() == 0
    assert Batch.objects.get(parent_id=parent).state == BatchState.FIRED


def test_children_that_ended_before_the_wait_resolve_it_at_once() -> None:
    parent = enqueue("p1")
    first = claim_job(parent)
    _, kids = run(first, lambda: feishu_inbox.spawn_many("test.child", [{}, {}]))
    ledger.hand_back(first.lease)
    for kid in kids:
        complete(kid.job_id, "done")
    how, results = run(
        claim_job(parent),
        lambda: (
            feishu_inbox.spawn_many("test.child", [{}, {}]),
            feishu_inbox.wait_all(kids),
        )[1],
    )
    assert how == "returned" and [r.result for r in results] == ["done", "done"]


def test_wait_any_resumes_at_the_first_end_and_the_rest_can_be_awaited_after() -> None:
    parent = enqueue("p1")

    def body() -> Any:
        kids = feishu_inbox.spawn_many("test.child", [{}, {}, {}])
        first = feishu_inbox.wait_any(kids)
        rest = [k for k in kids if k.job_id not in {o.job_id for o in first}]
        return first, feishu_inbox.wait_all(rest)

    assert run(claim_job(parent), body) == ("suspended", "waiting")
    kids = list(
        EventJob.objects.filter(parent_id=parent).order_by("id").values_list("id", flat=True)
    )
    complete(kids[1], 1)
    fire()
    assert run(claim_job(parent), body) == ("suspended", "waiting")  # now on the other two
    complete(kids[0], 0)
    fire()
    assert status(parent) == Status.WAITING
    complete(kids[2], 2)
    fire()
    _, (first, rest) = run(claim_job(parent), body)
    assert [o.job_id for o in first] == [kids[1]]
    assert [o.result for o in rest] == [0, 2]


def test_a_wait_for_children_times_out() -> None:
    parent = enqueue("p1")

    def body() -> Any:
        kid = feishu_inbox.spawn("test.child")
        return feishu_inbox.wait_all([kid], timeout=0.0)

    with pytest.raises(WaitTimedOut):
        run(claim_job(parent), body)


def test_only_ones_own_children_can_be_awaited() -> None:
    stranger = enqueue("s1", chat="other")
    parent = enqueue("p1")
    with pytest.raises(WorkflowRefused, match="own children"):
        run(claim_job(parent), lambda: feishu_inbox.wait_all([stranger]))


# --- batches -----------------------------------------------------------------------------------


def test_a_batchs_callbacks_are_enqueued_once_when_every_member_ended() -> None:
    with transaction.atomic():
        handle = feishu_inbox.batch(
            [feishu_inbox.job("test.member", {"n": i}) for i in range(3)],
            on_success=feishu_inbox.job("test.done", {"tag": "ok"}),
            on_failure="test.failed",
            on_complete="test.always",
        )
    members = list(handle.job_ids)
    assert EventJob.objects.filter(batch_id=handle.id).count() == 3
    complete(members[0], "a")
    complete(members[1], "b")
    fire()
    assert not EventJob.objects.filter(event_type__in=["test.done", "test.always"]).exists()
    complete(members[2], "c")
    fire()
    fire()
    done = EventJob.objects.get(event_type="test.done")
    assert done.payload["tag"] == "ok"
    assert done.payload["batch"] == {
        "id": handle.id,
        "total": 3,
        "counts": {"completed": 3},
        "failed": [],
    }
    assert EventJob.objects.filter(event_type="test.always").count() == 1
    assert not EventJob.objects.filter(event_type="test.failed").exists()
    assert [o.result for o in handle.outcomes()] == ["a", "b", "c"]


def test_a_failed_member_ends_the_batch_with_its_failure_callback() -> None:
    handle = feishu_inbox.batch(
        ["test.member", "test.member"], on_success="test.done", on_failure="test.failed"
    )
    complete(handle.job_ids[0])
    fail(handle.job_ids[1])
    fire()
    failed = EventJob.objects.get(event_type="test.failed")
    assert failed.payload["batch"]["failed"] == [handle.job_ids[1]]
    assert not EventJob.objects.filter(event_type="test.done").exists()


def test_an_unknown_member_holds_the_batch_until_reconciled() -> None:
    handle = feishu_inbox.batch(["test.member"], on_complete="test.always")
    claimed = claim_job(handle.job_ids[0])
    ledger.begin_effect(claimed.lease)
    ledger.finish(claimed.lease)  # an effect in flight: unknown
    assert status(handle.job_ids[0]) == Status.UNKNOWN
    fire()
    assert not EventJob.objects.filter(event_type="test.always").exists()
    ledger.reconcile([handle.job_ids[0]], applied=True)
    fire()
    assert EventJob.objects.filter(event_type="test.always").count() == 1


def test_a_batch_rolled_back_with_its_caller_leaves_nothing() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        feishu_inbox.batch(["test.member"], on_complete="test.always")
        raise RuntimeError("the caller's transaction fails")
    assert not Batch.objects.exists() and not EventJob.objects.exists()


def test_an_open_batch_takes_members_until_closed_and_fires_only_then() -> None:
    handle = feishu_inbox.batch([], open=True, on_complete="test.always")
    [first] = handle.add(["test.member"])
    complete(first)
    fire()
    assert not EventJob.objects.filter(event_type="test.always").exists()  # still open
    [second] = handle.add([feishu_inbox.job("test.member", {"n": 2})])
    assert handle.close() and not handle.close()
    with pytest.raises(WorkflowRefused, match="closed"):
        handle.add(["test.member"])
    fire()
    assert not EventJob.objects.filter(event_type="test.always").exists()
    complete(second)
    fire()
    always = EventJob.objects.get(event_type="test.always")
    assert always.payload["batch"]["total"] == 2


def test_closing_a_batch_whose_members_all_ended_fires_it() -> None:
    handle = feishu_inbox.batch(["test.member"], open=True, on_complete="test.always")
    complete(handle.job_ids[0])
    fire()
    handle.close()
    fire()
    assert EventJob.objects.filter(event_type="test.always").count() == 1


def test_a_member_requeued_after_its_batch_fired_runs_without_firing_it_again() -> None:
    handle = feishu_inbox.batch(["test.member"], on_complete="test.always")
    fail(handle.job_ids[0])
    fire()
    ledger.requeue([handle.job_ids[0]])
    complete(handle.job_ids[0])
    fire()
    assert EventJob.objects.filter(event_type="test.always").count() == 1


# --- chains ------------------------------------------------------------------------------------


def test_a_chain_runs_each_link_after_the_last_with_its_result() -> None:
    handle = feishu_inbox.chain(
        feishu_inbox.job("test.charge", {"amount": 5}), "test.ship", "test.notify"
    )
    [charge] = handle.job_ids
    assert EventJob.objects.filter(event_type__in=["test.ship", "test.notify"]).count() == 0
    complete(charge, {"receipt": "r1"})
    fire()
    ship = EventJob.objects.get(event_type="test.ship")
    assert ship.payload == {"previous": {"receipt": "r1"}}
    complete(ship.pk, "tracking-9")
    fire()
    notify = EventJob.objects.get(event_type="test.notify")
    assert notify.payload == {"previous": "tracking-9"}
    complete(notify.pk)
    fire()
    chain = Batch.objects.get(pk=handle.id)
    assert chain.state == BatchState.FIRED
    assert chain.fired_jobs == [charge, ship.pk, notify.pk]


def test_a_failed_link_stops_the_chain_until_it_is_requeued() -> None:
    handle = feishu_inbox.chain("test.charge", "test.ship")
    fail(handle.job_ids[0])
    fire()
    assert Batch.objects.get(pk=handle.id).state == BatchState.STOPPED
    assert not EventJob.objects.filter(event_type="test.ship").exists()
    ledger.requeue([handle.job_ids[0]])
    complete(handle.job_ids[0], 1)  # before any worker folded the requeue
    fire()
    assert EventJob.objects.get(event_type="test.ship").payload == {"previous": 1}


# --- cancel a tree; refusals ------------------------------------------------------------------


def test_cancelling_a_waiting_parent_cancels_its_children_and_ends_its_wait() -> None:
    parent = enqueue("p1")

    def body() -> Any:
        kids = feishu_inbox.spawn_many("test.child", [{}, {}, {}])
        grandchild_holder = kids[0]
        return feishu_inbox.wait_all(kids), grandchild_holder

    run(claim_job(parent), body)
    kids = list(
        EventJob.objects.filter(parent_id=parent).order_by("id").values_list("id", flat=True)
    )
    running = claim_job(kids[0])  # one child runs: it is asked to stop
    _, grandchild = run(running, lambda: feishu_inbox.spawn("test.grandchild"))
    complete(kids[1])
    outcome = ledger.cancel([parent])
    assert parent in outcome.done
    assert kids[0] in outcome.pending and kids[2] in outcome.done
    assert grandchild.job_id in outcome.done
    assert status(kids[2]) == Status.COMPLETED
    assert EventJob.objects.get(pk=kids[0]).cancel_requested
    assert status(parent) == Status.COMPLETED


def test_bad_specs_are_refused_with_a_fix() -> None:
    with pytest.raises(WorkflowRefused, match="handler's event type"):
        feishu_inbox.job("task:some.path")
    with pytest.raises(WorkflowRefused, match="dict payload"):
        feishu_inbox.job("test.member", [1, 2])
    with pytest.raises(WorkflowRefused, match="not int"):
        feishu_inbox.batch([42])
    with pytest.raises(WorkflowRefused, match="at least one member"):
        feishu_inbox.batch([])
    assert not EventJob.objects.exists() and not Batch.objects.exists()
    assert not BatchEvent.objects.exists()


def test_a_replayed_parent_spawns_a_new_generation_and_keeps_the_old_as_history() -> None:
    parent = enqueue("p1")

    def body() -> Any:
        kids = feishu_inbox.spawn_many("test.child", [{}, {}])
        return [r.result for r in feishu_inbox.wait_all(kids)]

    run(claim_job(parent), body)
    first = list(EventJob.objects.filter(parent_id=parent).values_list("id", flat=True))
    for kid in first:
        complete(kid, "old")
    fire()
    claimed = claim_job(parent)
    assert run(claimed, body) == ("returned", ["old", "old"])
    ledger.finish(claimed.lease)
    outcome = ledger.replay([parent])
    replayed = outcome.moved.get(parent, parent)
    assert run(claim_job(replayed), body) == ("suspended", "waiting")
    children = list(EventJob.objects.filter(parent_id=replayed).order_by("id"))
    assert len(children) == 4  # two generations; the first stays as history
    new = [c.pk for c in children if c.pk not in first]
    for kid in new:
        complete(kid, "new")
    fire()
    assert run(claim_job(replayed), body) == ("returned", ["new", "new"])


def test_a_batch_whose_firing_breaks_is_marked_broken_and_the_others_still_fire() -> None:
    from feishu_inbox.ledger import trees

    broken = feishu_inbox.batch(["test.member"], on_complete="test.always")
    healthy = feishu_inbox.batch(["test.member"], on_complete="test.always")
    # What its firing enqueues can no longer be (a callback's task renamed by a deploy).
    Batch.objects.filter(pk=broken.id).update(
        callbacks={
            "complete": {
                "target": "gone.task",
                "task": True,
                "payload": {},
                "args": [],
                "key": None,
                "app": None,
            }
        }
    )
    complete(broken.job_ids[0])
    complete(healthy.job_ids[0])
    fire()
    assert Batch.objects.get(pk=broken.id).state == BatchState.BROKEN
    assert "gone" in Batch.objects.get(pk=broken.id).error
    assert Batch.objects.get(pk=healthy.id).state == BatchState.FIRED
    assert EventJob.objects.filter(event_type="test.always").count() == 1
    # Fixed (here: the callback made a handler's again), an operator fires it again.
    Batch.objects.filter(pk=broken.id).update(
        callbacks={"complete": feishu_inbox.job("test.always").as_dict()}
    )
    assert trees.fire_again([broken.id, healthy.id]) == 1
    fire()
    assert Batch.objects.get(pk=broken.id).state == BatchState.FIRED
    assert EventJob.objects.filter(event_type="test.always").count() == 2


def test_cancelling_an_ended_parent_again_reaches_its_unfinished_children() -> None:
    parent = enqueue("p1")
    claimed = claim_job(parent)
    _, kids = run(claimed, lambda: feishu_inbox.spawn_many("test.child", [{}, {}]))
    ledger.finish(claimed.lease)  # fire and forget: the parent ended, its children did not
    outcome = ledger.cancel([parent])
    assert parent in outcome.refused
    assert sorted(outcome.done) == sorted(k.job_id for k in kids)
    assert {status(k.job_id) for k in kids} == {Status.COMPLETED}


def test_a_replayed_parent_waits_afresh_under_its_waits_own_name() -> None:
    parent = enqueue("p1")

    def body() -> Any:
        kids = feishu_inbox.spawn_many("test.child", [{}])
        return [r.result for r in feishu_inbox.wait_all(kids, name="tools")]

    run(claim_job(parent), body)
    [first] = EventJob.objects.filter(parent_id=parent).values_list("id", flat=True)
    complete(first, "old")
    fire()
    claimed = claim_job(parent)
    assert run(claimed, body) == ("returned", ["old"])
    ledger.finish(claimed.lease)
    replayed = ledger.replay([parent]).moved.get(parent, parent)
    assert run(claim_job(replayed), body) == ("suspended", "waiting")
    [new] = (
        EventJob.objects.filter(parent_id=replayed).exclude(pk=first).values_list("id", flat=True)
    )
    complete(new, "new")
    fire()
    assert run(claim_job(replayed), body) == ("returned", ["new"])


def test_completed_members_of_a_batch_not_fired_are_kept_past_retention() -> None:
    from datetime import timedelta

    from django.utils import timezone

    from feishu_inbox.ledger.retention import purge

    handle = feishu_inbox.batch(["test.member", "test.member"], on_complete="test.always")
    complete(handle.job_ids[0], "kept")
    claimed = claim_job(handle.job_ids[1])
    ledger.begin_effect(claimed.lease)
    ledger.finish(claimed.lease)  # unknown: it holds the batch
    loner = enqueue("loner", chat="c2")
    complete(loner)
    fire()
    long_ago = timezone.now() - timedelta(days=30)
    EventJob.objects.filter(status="completed").update(finished_at=long_ago)
    purge()
    assert EventJob.objects.filter(pk=handle.job_ids[0]).exists()  # its batch has not fired
    assert not EventJob.objects.filter(pk=loner).exists()
    ledger.reconcile([handle.job_ids[1]], applied=True)
    fire()
    assert [o.result for o in handle.outcomes()] == ["kept", None]
    Batch.objects.filter(pk=handle.id).update(fired_at=long_ago)
    EventJob.objects.filter(status="completed").update(finished_at=long_ago)
    result = purge()
    assert result.batches_deleted == 1 and not Batch.objects.filter(pk=handle.id).exists()


def test_a_workflow_jobs_result_that_is_not_json_is_logged_not_recorded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from feishu_inbox.runtime import steps

    handle = feishu_inbox.batch(["test.member"])
    claimed = claim_job(handle.job_ids[0])
    with InHandler(claimed) as ctx:
        steps.record_result(ctx, RESULT_STEP, object())  # a handler returned an object
        steps.record_result(ctx, RESULT_STEP, {"first": 1})
        steps.record_result(ctx, RESULT_STEP, {"second": 2})  # the first recorded stays
    assert "not JSON data" in caplog.text
    ledger.finish(claimed.lease)
    assert [o.result for o in handle.outcomes()] == [{"first": 1}]
