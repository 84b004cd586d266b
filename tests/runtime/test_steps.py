"""Durable steps (SPEC §7): memoized, fenced, forgotten from a step by an operator."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connections
from django.test import override_settings
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import feishu_inbox
from feishu_inbox import ledger
from feishu_inbox.errors import DuplicateStep, LeaseLost, LedgerError
from feishu_inbox.models import EventJob, Partition, Step
from feishu_inbox.runtime import context
from feishu_inbox.runtime.steps import StepResultError
from tests.support.factories import EventJobFactory
from tests.support.ledger_helpers import expire_lease, make_due, snapshot
from tests.support.processes import wait_for
from tests.support.worker_helpers import Workers, enqueue, job

NAMES = ("a", "b", "c")


def running(claimed: ledger.ClaimedJob) -> context.JobContext:
    """The context a worker gives a handler, for calling step() as a handler would."""
    event = context.Event(
        job_id=claimed.id,
        event_id=claimed.event_id,
        event_type=claimed.event_type,
        app=claimed.app,
        payload=claimed.payload,
        partition_key=claimed.lease.partition_key,
        attempt=claimed.lease.attempt,
        private_message=claimed.private_message,
        received_at=claimed.received_at,
    )
    return context.JobContext(lease=claimed.lease, event=event, has_steps=claimed.has_steps)


class InHandler:
    """Run code as inside the handler of a claimed job."""

    def __init__(self, claimed: ledger.ClaimedJob) -> None:
        self.ctx = running(claimed)

    def __enter__(self) -> context.JobContext:
        self.token = context.enter(self.ctx)
        return self.ctx

    def __exit__(self, *exc: object) -> None:
        context.leave(self.token)


def claim_one() -> ledger.ClaimedJob:
    [claimed] = ledger.claim("w")
    return claimed


# --- the API, in the ledger -------------------------------------------------------------------


@pytest.mark.django_db
def test_a_step_runs_once_and_a_retry_returns_its_result() -> None:
    job = EventJobFactory()
    calls: list[str] = []
    first = claim_one()
    assert not first.has_steps
    with InHandler(first):
        assert feishu_inbox.step("think", lambda: calls.append("x") or {"answer": 42}) == {
            "answer": 42
        }
        assert feishu_inbox.step("tuple", lambda: (1, 2)) == [1, 2]  # what JSON gives back
    ledger.fail(first.lease, error_type="Boom", retry_in=0)
    make_due(job.pk)
    second = claim_one()
    assert second.has_steps
    with InHandler(second):
        assert feishu_inbox.step("think", lambda: calls.append("again")) == {"answer": 42}
        assert feishu_inbox.step("tuple", lambda: calls.append("again")) == [1, 2]
    assert calls == ["x"]
    rows = list(Step.objects.filter(job_id=job.pk).values_list("name", "attempt", "result"))
    assert rows == [("think", 1, {"answer": 42}), ("tuple", 1, [1, 2])]


@pytest.mark.django_db(transaction=True)  # the async form writes from another thread
def test_the_decorator_and_async_forms() -> None:
    EventJobFactory()

    @feishu_inbox.step
    def think(x: int) -> int:
        return x * 2

    @feishu_inbox.step("draft")
    async def draft(x: int) -> str:
        await asyncio.sleep(0)
        return f"draft {x}"

    async def polish(x: str) -> str:
        return x.upper()

    claimed = claim_one()
    with InHandler(claimed):
        assert think(21) == 42

        async def handler() -> tuple[str, str]:
            # One database thread, whose connection is closed at the end, as a worker would.
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
            try:
                return await draft(1), await feishu_inbox.step("polish", polish, "p")
            finally:
                await asyncio.to_thread(connections.close_all)

        assert asyncio.run(handler()) == ("draft 1", "P")
    assert set(Step.objects.values_list("name", flat=True)) == {"think", "draft", "polish"}


@pytest.mark.django_db
def test_a_name_runs_once_per_attempt_and_bad_results_are_named() -> None:
    job = EventJobFactory()
    with InHandler(claim_one()):
        feishu_inbox.step("a", int)
        with pytest.raises(DuplicateStep, match="Step 'a' ran twice in attempt 1"):
            feishu_inbox.step("a", int)
        with pytest.raises(StepResultError, match=r"Step 'b' .* returned a set") as info:
            feishu_inbox.step("b", set)
        assert info.value.code == "invalid_argument"
        with pytest.raises(LedgerError, match="needs a name"):
            feishu_inbox.step("", int)
    assert list(Step.objects.filter(job_id=job.pk).values_list("name", flat=True)) == ["a"]


@pytest.mark.django_db
def test_a_step_write_after_a_takeover_is_refused_and_changes_nothing() -> None:
    job = EventJobFactory()
    old = claim_one()
    expire_lease(job.pk)
    claim_one()  # another worker has it now
    before = snapshot(job.pk)
    with InHandler(old), pytest.raises(LeaseLost, match=r"worker w holds it"):
        feishu_inbox.step("think", lambda: "stale work")
    assert snapshot(job.pk) == before
    assert not Step.objects.exists()
    with pytest.raises(LeaseLost):
        ledger.record_step(old.lease, name="think", result='"x"', took=0.1, retrying=True)


def _completed_with_steps(names: tuple[str, ...] = NAMES) -> EventJob:
    job = EventJobFactory()
    with InHandler(claim_one()) as ctx:
        for name in names:
            feishu_inbox.step(name, str, name)
    ledger.finish(ctx.lease)
    return EventJob.objects.get(pk=job.pk)


@pytest.mark.django_db
def test_from_step_forgets_that_step_and_every_later_one() -> None:
    job = _completed_with_steps()
    assert ledger.replay([job.pk], from_step="b").done == [job.pk]
    assert list(Step.objects.filter(job_id=job.pk).values_list("name", flat=True)) == ["a"]


@pytest.mark.django_db
def test_from_step_counts_a_step_that_started_at_the_same_instant_as_later() -> None:
    job = _completed_with_steps()
    at = Step.objects.get(job=job, name="a").started_at
    Step.objects.filter(job=job).update(started_at=at)  # all three started at one instant
    Step.objects.filter(job=job, name="a").update(started_at=at - timedelta(seconds=1))
    ledger.replay([job.pk], from_step="c")
    assert list(Step.objects.filter(job_id=job.pk).values_list("name", flat=True)) == ["a"]


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["requeue", "reconcile", "replay"])
def test_an_unknown_from_step_is_refused_and_changes_nothing(action: str) -> None:
    job = EventJobFactory()
    with InHandler(claim_one()) as ctx:
        feishu_inbox.step("a", str, "a")
    if action == "requeue":
        with override_settings(FEISHU_INBOX={"MAX_ATTEMPTS": 1}):
            ledger.fail(ctx.lease, error_type="Boom")
        call = ledger.requeue
    elif action == "reconcile":
        ledger.begin_effect(ctx.lease)
        ledger.finish(ctx.lease)
        call = lambda ids, from_step: ledger.reconcile(ids, applied=False, from_step=from_step)  # noqa: E731
    else:
        ledger.finish(ctx.lease)
        call = ledger.replay
    before = snapshot(job.pk)
    refusal = call([job.pk], from_step="nope").refused[job.pk]
    assert refusal.code == "unknown_step" and "from step 'nope'" in refusal.message
    assert snapshot(job.pk) == before
    assert Step.objects.filter(job_id=job.pk).count() == 1
    assert call([job.pk], from_step="a").done == [job.pk]
    assert not Step.objects.filter(job_id=job.pk).exists()


@pytest.mark.django_db
def test_retention_removes_steps_with_their_job_and_a_moved_replay_keeps_them() -> None:
    from feishu_inbox.ledger import retention

    old = _completed_with_steps(("x",))
    EventJob.objects.filter(pk=old.pk).update(finished_at=old.finished_at - timedelta(days=8))
    kept = _completed_with_steps(("y",))
    _completed_with_steps(("z",))  # a later job of the chat ran: a replay moves it
    [moved] = ledger.replay([kept.pk]).done
    assert moved != kept.pk and Step.objects.get(name="y").job_id == moved
    retention.purge()
    assert not EventJob.objects.filter(pk=old.pk).exists()
    assert sorted(Step.objects.values_list("name", flat=True)) == ["y", "z"]


# --- a property: a step's function runs to completion at most once per job ---------------------


class StepMachine(RuleBasedStateMachine):
    """Attempts of one job run steps that may raise, fail, lose their lease, complete, and are
    requeued or replayed from a step. Whatever the sequence, each step's function ran to
    completion at most once, plus once per time an operator forgot it."""

    def __init__(self) -> None:
        super().__init__()
        Step.objects.all().delete()
        EventJob.objects.all().delete()
        Partition.objects.all().delete()
        self.job_id = EventJobFactory(partition_key="p").pk
        self.completions: Counter[str] = Counter()
        self.forgotten: Counter[str] = Counter()
        self.current: InHandler | None = None

    def _state(self) -> str:
        return str(EventJob.objects.values_list("status", flat=True).get(pk=self.job_id))

    @rule()
    def claim(self) -> None:
        if self.current is None and self._state() in ("queued", "retry_wait"):
            make_due(self.job_id)
            self.current = InHandler(claim_one())

    @rule(name=st.sampled_from(NAMES), raises=st.booleans())
    def run_step(self, name: str, raises: bool) -> None:
        if self.current is None or name in self.current.ctx.steps_run:
            return

        def work() -> str:
            if raises:
                raise RuntimeError("the step's function failed")
            self.completions[name] += 1
            return name

        with self.current:
            try:
                feishu_inbox.step(name, work)
            except RuntimeError:
                self._end("fail")

    @rule(how=st.sampled_from(["fail", "finish", "lose_lease"]))
    def end_attempt(self, how: str) -> None:
        if self.current is not None:
            self._end(how)

    def _end(self, how: str) -> None:
        assert self.current is not None
        lease = self.current.ctx.lease
        if how == "fail":
            ledger.fail(lease, error_type="Boom", retry_in=0)
        elif how == "finish":
            ledger.finish(lease)
        else:
            expire_lease(self.job_id)
            ledger.expire_leases()
        self.current = None

    @rule(name=st.sampled_from(NAMES))
    def operator_runs_it_again_from(self, name: str) -> None:
        state = self._state()
        before = set(Step.objects.filter(job_id=self.job_id).values_list("name", flat=True))
        if state == "completed":
            outcome = ledger.replay([self.job_id], from_step=name)
        elif state == "failed":
            outcome = ledger.requeue([self.job_id], from_step=name)
        else:
            return
        if outcome.done:
            self.job_id = outcome.done[0]  # a replay may move it
            after = set(Step.objects.filter(job_id=self.job_id).values_list("name", flat=True))
            self.forgotten.update(before - after)

    @invariant()
    def each_step_ran_at_most_once_per_forgetting(self) -> None:
        for name in NAMES:
            assert self.completions[name] <= 1 + self.forgotten[name], (name, self.completions)


@pytest.mark.django_db(transaction=True)  # PostgreSQL's now() must move: one commit a step
def test_a_steps_function_runs_to_completion_at_most_once_per_job() -> None:
    with override_settings(FEISHU_INBOX={"MAX_ATTEMPTS": 3}):
        run_state_machine_as_test(
            StepMachine,
            settings=settings(
                max_examples=40,
                stateful_step_count=30,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )


# --- on real runworker processes ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_retry_runs_only_the_step_that_failed(workers: Workers) -> None:
    job_id = enqueue("s", ["step:a", "step:b", "step_fails_once:c"])
    workers.start(FEISHU_INBOX_BACKOFF_BASE="0.2")
    wait_for(lambda: job(job_id).status == "completed", 30, "the retried job")
    ran = Counter(line[2] for line in workers.lines("ran", "s"))
    started = Counter(line[2] for line in workers.lines("step_start", "s"))
    assert ran == {"a": 1, "b": 1, "c": 1} and started == {"a": 1, "b": 1, "c": 2}
    assert job(job_id).attempt == 2


@pytest.mark.django_db(transaction=True)
def test_a_step_killed_midway_runs_again_but_not_the_one_before(workers: Workers) -> None:
    job_id = enqueue("k", ["step:a", "step_gate:b", "step:c"])
    first = workers.start("--lease-seconds", "2")
    wait_for(lambda: workers.lines("step_start", "k"), 30, "step b to start")
    wait_for(lambda: len(workers.lines("step_start", "k")) == 2, 30, "step b to start")
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    workers.open_gate("b")
    workers.start("--lease-seconds", "2")
    wait_for(lambda: job(job_id).status == "completed", 30, "the job to complete")
    started = Counter(line[2] for line in workers.lines("step_start", "k"))
    assert started == {"a": 1, "b": 2, "c": 1}  # b never finished the first time
    results = dict(Step.objects.filter(job_id=job_id).values_list("name", "attempt"))
    assert results == {"a": 1, "b": 2, "c": 2}
    assert json.loads(json.dumps(list(Step.objects.values_list("result", flat=True)))) == [
        "a-result",
        "b-result",
        "c-result",
    ]
