"""Idempotent effects in the ledger (SPEC §3 Effects): a failure, a crash or a lost lease
inside an effect the remote side deduplicates by its key retries the job within the window,
with the same key; past it the job is unknown, as any effect."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

import feishu_inbox
from feishu_inbox import ledger
from feishu_inbox.errors import (
    DuplicateEffect,
    IdempotencyWindowPassed,
    InvalidState,
    LeaseLost,
    LedgerError,
)
from feishu_inbox.ledger.idempotency import KEY_MAX_LENGTH, effect_key
from feishu_inbox.models import Attempt, EventJob
from tests.runtime.test_steps import InHandler
from tests.support.factories import EventJobFactory
from tests.support.ledger_helpers import assert_mirror_consistent, expire_lease, make_due, snapshot

HOUR = timedelta(hours=1)
pytestmark = pytest.mark.django_db


def claim_one() -> ledger.ClaimedJob:
    [claimed] = ledger.claim("w")
    return claimed


def row(job_id: int) -> EventJob:
    return EventJob.objects.get(pk=job_id)


def begin(claimed: ledger.ClaimedJob, name: str = "reply", **kwargs: Any) -> str:
    """Enter an idempotent effect of the claimed job, as its handler would, and leave it
    by an exception (the connection dropped): the effect is uncertain. Returns its key."""
    keys: list[str] = []
    window = kwargs.pop("window", HOUR)
    with (
        InHandler(claimed),
        pytest.raises(ConnectionError),
        feishu_inbox.effect(name, idempotent_for=window, **kwargs) as key,
    ):
        keys.append(key)
        raise ConnectionError("dropped after the request was sent")
    return keys[0]


def past_window(job_id: int) -> None:
    """Make the job's idempotency window lie in the past (as if an hour went by)."""
    assert EventJob.objects.filter(pk=job_id, idempotent_until__isnull=False).update(
        idempotent_until=timezone.now() - timedelta(seconds=1)
    )


# --- the key --------------------------------------------------------------------------------


def test_the_key_is_stable_across_attempts_and_short_enough() -> None:
    job = EventJobFactory()
    first = claim_one()
    key = begin(first)
    assert ledger.fail(first.lease, error_type="ConnectionError", retry_in=0) == "retry_wait"
    make_due(job.pk)
    second = claim_one()
    with InHandler(second):
        with feishu_inbox.effect("reply", idempotent_for=HOUR) as again:
            pass
        with feishu_inbox.effect("other", idempotent_for=HOUR) as other:
            pass
    assert again == key and other != key
    assert len(key) <= KEY_MAX_LENGTH
    longest = effect_key(
        job_id=2**63 - 1, app="a" * 64, event_id="e" * 128, generation=2**32, name="n" * 64
    )
    assert len(longest) <= KEY_MAX_LENGTH
    assert ledger.finish(second.lease) == "completed"


def test_requeue_and_reconcile_keep_the_key_and_a_replay_gets_a_new_one() -> None:
    job = EventJobFactory()
    first = claim_one()
    key = begin(first)
    past_window(job.pk)
    assert ledger.fail(first.lease, error_type="ConnectionError", retry_in=0) == "unknown"
    ledger.reconcile([job.pk], applied=False)  # "it did not happen": run it again
    assert row(job.pk).idempotent_until is None  # a new window
    again = claim_one()
    with InHandler(again), feishu_inbox.effect("reply", idempotent_for=HOUR) as same:
        pass
    assert same == key
    assert ledger.finish(again.lease) == "completed"
    ledger.replay([job.pk])  # an operator asks for the work to happen again: a new message
    replayed = claim_one()
    with InHandler(replayed), feishu_inbox.effect("reply", idempotent_for=HOUR) as new:
        pass
    assert new != key
    assert ledger.finish(replayed.lease) == "completed"
    assert row(job.pk).replays == 1


# --- within the window: the job runs again --------------------------------------------------


def test_an_exception_inside_an_idempotent_effect_retries_the_job() -> None:
    job = EventJobFactory()
    first = claim_one()
    begin(first)
    r = row(job.pk)
    assert (r.side_effect_started, r.effect_uncertain, r.idempotent_effect) == (True, True, "reply")
    assert r.idempotent_window == 3600.0
    assert r.idempotent_since is not None and r.idempotent_until is not None
    # The window is counted from the first start, less the margin (5 minutes of an hour).
    left = (r.idempotent_until - r.idempotent_since).total_seconds()
    assert 3300 - 1 <= left <= 3300 + 1
    assert ledger.fail(first.lease, error_type="ConnectionError", retry_in=0) == "retry_wait"
    r = row(job.pk)
    # Nothing is in flight or uncertain any more: the next attempt re-issues it, same key.
    assert (r.effects_in_flight, r.effect_uncertain, r.side_effect_started) == (0, False, True)
    until = r.idempotent_until
    make_due(job.pk)
    second = claim_one()
    with InHandler(second), feishu_inbox.effect("reply", idempotent_for=HOUR):
        pass
    assert row(job.pk).idempotent_until == until  # counted from the first start, not this one
    assert ledger.finish(second.lease) == "completed"
    assert_mirror_consistent()


def test_a_crash_inside_an_idempotent_effect_retries_the_job_at_once() -> None:
    job = EventJobFactory()
    claimed = claim_one()
    with (
        InHandler(claimed),
        pytest.raises(LeaseLost),  # leaving it finds the lease gone
        feishu_inbox.effect("reply", idempotent_for=HOUR),
    ):
        expire_lease(job.pk)  # the worker died inside the effect
        assert ledger.expire_leases() == 1
    r = row(job.pk)
    assert (r.status, r.error_type, r.effects_in_flight) == ("retry_wait", "LeaseExpired", 0)
    assert r.available_at <= timezone.now()
    assert Attempt.objects.get(job_id=job.pk).outcome == "retry_wait"
    assert_mirror_consistent()


# --- past the window, or not every effect idempotent: unknown --------------------------------


def test_past_the_window_a_crash_or_a_failure_ends_unknown() -> None:
    crashed, failed = EventJobFactory(partition_key="a"), EventJobFactory(partition_key="b")
    first = claim_one()
    begin(first)
    second = claim_one()
    begin(second)
    past_window(crashed.pk)
    past_window(failed.pk)
    expire_lease(crashed.pk)
    assert ledger.expire_leases() == 1
    assert ledger.fail(second.lease, error_type="ConnectionError", retry_in=0) == "unknown"
    assert (row(crashed.pk).status, row(crashed.pk).error_type) == (
        "unknown",
        "LeaseExpiredAfterSideEffect",
    )
    assert row(failed.pk).error_type == "ConnectionError"


def test_a_retry_due_after_the_window_ends_unknown_now() -> None:
    job = EventJobFactory()
    first = claim_one()
    begin(first, window=timedelta(seconds=60), margin=timedelta(seconds=10))
    assert ledger.fail(first.lease, error_type="RetryAt", retry_in=120) == "unknown"
    assert row(job.pk).effect_uncertain


def test_a_retried_job_does_not_reissue_an_effect_past_its_window() -> None:
    job = EventJobFactory()
    first = claim_one()
    begin(first)
    assert ledger.fail(first.lease, error_type="ConnectionError", retry_in=0) == "retry_wait"
    make_due(job.pk)
    second = claim_one()
    past_window(job.pk)  # the claim came late (workers were down for an hour)
    before = snapshot(job.pk)
    with (
        InHandler(second),
        pytest.raises(IdempotencyWindowPassed),
        feishu_inbox.effect("reply", idempotent_for=HOUR),
    ):
        pytest.fail("the effect must not start")
    assert snapshot(job.pk) == before  # refused: nothing changed
    assert ledger.fail(second.lease, error_type="IdempotencyWindowPassed") == "unknown"


def test_an_effect_without_a_key_makes_a_failure_unknown_again() -> None:
    job = EventJobFactory()
    claimed = claim_one()
    with InHandler(claimed):
        with feishu_inbox.effect("reply", idempotent_for=HOUR):
            pass
        with feishu_inbox.effect():  # an email: no idempotency key
            pass
        with feishu_inbox.effect("again", idempotent_for=HOUR):
            pass
    assert row(job.pk).idempotent_until is None
    assert ledger.fail(claimed.lease, error_type="Boom", retry_in=0) == "unknown"


@pytest.mark.parametrize("why", ["cancelled", "attempts spent"])
def test_a_job_that_will_not_run_again_ends_unknown(why: str) -> None:
    job = EventJobFactory(max_attempts=1 if why == "attempts spent" else None)
    claimed = claim_one()
    begin(claimed)
    if why == "cancelled":
        ledger.cancel([job.pk])
    assert ledger.fail(claimed.lease, error_type="ConnectionError", retry_in=0) == "unknown"


def test_a_final_failure_after_a_settled_idempotent_effect_is_failed() -> None:
    settled, uncertain = EventJobFactory(partition_key="a"), EventJobFactory(partition_key="b")
    first, second = claim_one(), claim_one()
    with InHandler(first), feishu_inbox.effect("reply", idempotent_for=HOUR):
        pass  # Feishu refused it: the reply helper leaves the effect settled
    begin(second)  # the request may have been applied
    assert ledger.fail(first.lease, error_type="FeishuBusinessError", final=True) == "failed"
    assert ledger.fail(second.lease, error_type="FeishuBusinessError", final=True) == "unknown"
    assert row(settled.pk).attempt == 1 and row(uncertain.pk).status == "unknown"


@pytest.mark.django_db(transaction=True)  # attempts in their own transactions (and clocks)
def test_a_refusal_of_a_resent_key_ends_unknown() -> None:
    job = EventJobFactory()
    first = claim_one()
    begin(first)  # applied, then the connection dropped?
    assert ledger.fail(first.lease, error_type="ConnectionError", retry_in=0) == "retry_wait"
    make_due(job.pk)
    second = claim_one()
    with InHandler(second), feishu_inbox.effect("reply", idempotent_for=HOUR):
        pass  # Feishu refused the re-send: that says nothing about the first try
    assert ledger.fail(second.lease, error_type="FeishuBusinessError", final=True) == "unknown"


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        dict(name=None, idempotent_for=HOUR),
        dict(name="", idempotent_for=HOUR),
        dict(name="x" * 65, idempotent_for=HOUR),
        dict(name="reply", idempotent_for=timedelta(0)),
        dict(name="reply", idempotent_for=-HOUR),
        dict(name="reply", idempotent_for=3600),
        dict(name="reply", idempotent_for=HOUR, margin=HOUR),
        dict(name="reply", idempotent_for=HOUR, margin=timedelta(seconds=-1)),
        dict(name="reply", idempotent_for=2 * HOUR, longest=HOUR),
        dict(name="reply", margin=timedelta(seconds=1)),
    ],
)
def test_bad_arguments_are_refused_and_change_nothing(args: dict[str, object]) -> None:
    job = EventJobFactory()
    claimed = claim_one()
    before = snapshot(job.pk)
    name = args.pop("name")
    with (
        InHandler(claimed),
        pytest.raises(LedgerError) as refused,
        feishu_inbox.effect(name, **args),  # type: ignore[arg-type]
    ):
        pytest.fail("the effect must not start")
    assert refused.value.code == "invalid_argument"
    assert snapshot(job.pk) == before


def test_two_idempotent_effects_of_one_name_in_one_attempt_are_refused() -> None:
    job = EventJobFactory()
    claimed = claim_one()
    with InHandler(claimed):
        with feishu_inbox.effect("reply", idempotent_for=HOUR):
            pass
        before = snapshot(job.pk)
        with pytest.raises(DuplicateEffect), feishu_inbox.effect("reply", idempotent_for=HOUR):
            pytest.fail("the effect must not start")
    assert snapshot(job.pk) == before


# --- admin -------------------------------------------------------------------------------------


def test_the_job_page_shows_the_key_and_the_window(admin_client: Any) -> None:
    from django.urls import reverse

    job = EventJobFactory()
    first = claim_one()
    key = begin(first)
    ledger.fail(first.lease, error_type="ConnectionError", retry_in=30)
    page = admin_client.get(reverse("admin:feishu_inbox_eventjob_change", args=[job.pk]))
    text = page.content.decode()
    assert f"key {key}, window 1:00:00" in text and "re-sends it with this key" in text
    past_window(job.pk)
    text = admin_client.get(reverse("admin:feishu_inbox_eventjob_change", args=[job.pk]))
    assert "its window (less the margin) closed" in text.content.decode()


@pytest.mark.django_db(transaction=True)  # the async form writes from another thread
def test_the_async_form_yields_the_same_key() -> None:
    EventJobFactory()
    claimed = claim_one()

    async def handler() -> list[str]:
        # One database thread, whose connection is closed at the end, as a worker would.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        found = []
        try:
            async with feishu_inbox.effect("reply", idempotent_for=HOUR) as key:
                found.append(key)
            async with feishu_inbox.effect() as plain:
                found.append(plain)
        finally:
            await asyncio.to_thread(connections.close_all)
        return found

    with InHandler(claimed) as ctx:
        key, plain = asyncio.run(handler())
        assert key == effect_key(
            job_id=claimed.id,
            app="default",
            event_id=ctx.event.event_id,
            generation=0,
            name="reply",
        )
        assert plain != key
    assert ledger.finish(claimed.lease) == "completed"


def test_an_effect_costs_two_statements_with_or_without_a_key(
    django_assert_num_queries: Any,
) -> None:
    EventJobFactory()
    claimed = claim_one()
    with InHandler(claimed):
        with django_assert_num_queries(2), feishu_inbox.effect():  # begin, end: as before
            pass
        with django_assert_num_queries(2), feishu_inbox.effect("reply", idempotent_for=HOUR):
            pass
    assert ledger.finish(claimed.lease) == "completed"


def test_a_retried_job_that_has_not_reissued_its_effect_can_be_handed_back() -> None:
    job = EventJobFactory()
    first = claim_one()
    begin(first)
    assert ledger.fail(first.lease, error_type="ConnectionError", retry_in=0) == "retry_wait"
    make_due(job.pk)
    second = claim_one()
    assert ledger.hand_back(second.lease) == "retry_wait"  # shutting down: back at once
    r = row(job.pk)
    assert (r.attempt, r.side_effect_started, r.idempotent_until is not None) == (1, True, True)
    third = claim_one()
    with InHandler(third):
        feishu_inbox.effect("reply", idempotent_for=HOUR).__enter__()  # in flight: stays
    with pytest.raises(InvalidState):
        ledger.hand_back(third.lease)
    assert ledger.fail(third.lease, error_type="LeaseLost", retry_in=0) == "retry_wait"
    make_due(job.pk)
    past_window(job.pk)
    with pytest.raises(InvalidState):  # past its window: its lease expires, it ends unknown
        ledger.hand_back(claim_one().lease)
