"""Cancel and replay, retry policies, and the codes every refusal carries (SPEC §3)."""

from __future__ import annotations

import inspect
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import override_settings
from django.utils import timezone

from feishu_inbox import errors, ledger
from feishu_inbox.errors import (
    CATALOGUE,
    Cancelled,
    ConfigurationError,
    Duplicate,
    InboxError,
    InvalidState,
    JobNotFound,
    LedgerError,
    NotRequeueable,
)
from feishu_inbox.feishu import protocol as feishu
from feishu_inbox.ledger import retry
from feishu_inbox.ledger.retry import RetryAfter, RetryAt, RetryPolicy
from feishu_inbox.models import Attempt, EventJob
from feishu_inbox.runtime import registry
from tests.support.factories import EventJobFactory
from tests.support.ledger_helpers import (
    assert_mirror_consistent,
    expire_lease,
    make_due,
    snapshot,
    status,
)

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def claim_one(worker: str = "w1") -> ledger.ClaimedJob:
    [job] = ledger.claim(worker)
    return job


def row(job_id: int) -> EventJob:
    return EventJob.objects.get(pk=job_id)


def completed_job(partition_key: str = "chat-1", note: str = "NoHandler") -> EventJob:
    job = EventJobFactory(partition_key=partition_key)
    ledger.finish(claim_one().lease, note=note)
    return row(job.pk)


# --- cancel ---------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["queued", "retry_wait"])
def test_cancel_completes_a_job_that_has_not_run_and_its_chat_moves_on(state: str) -> None:
    job = EventJobFactory()
    behind = EventJobFactory()
    if state == "retry_wait":
        ledger.fail(claim_one().lease, error_type="Boom", retry_in=600)
    outcome = ledger.cancel([job.pk])
    assert (outcome.done, outcome.pending, outcome.refused) == ([job.pk], [], {})
    r = row(job.pk)
    assert (r.status, r.error_type, r.resolution, r.cancel_requested) == (
        "completed",
        "Cancelled",
        "cancelled",
        False,
    )
    assert r.error_message == "Cancelled by an operator before it ran." and r.finished_at
    assert claim_one().id == behind.pk
    assert_mirror_consistent()


def test_cancel_of_a_running_job_asks_it_to_stop_and_changes_nothing_else() -> None:
    job = EventJobFactory()
    lease = claim_one().lease
    before = row(job.pk)
    outcome = ledger.cancel([job.pk])
    assert (outcome.done, outcome.pending) == ([], [job.pk])
    after = row(job.pk)
    assert after.cancel_requested and not before.cancel_requested
    changed = {
        f.attname
        for f in EventJob._meta.fields
        if getattr(before, f.attname) != getattr(after, f.attname)
    }
    assert changed == {"cancel_requested"}
    assert ledger.signals([lease]) == {job.pk: ledger.Signals(cancelled=True, superseded=False)}
    with pytest.raises(Cancelled):  # entering an effect is refused: nothing starts
        ledger.begin_effect(lease)
    assert not row(job.pk).side_effect_started
    assert ledger.finish(lease, note="Cancelled") == "completed"
    assert (row(job.pk).error_type, row(job.pk).resolution) == ("Cancelled", "")


@pytest.mark.parametrize("ending", ["fail", "lease_expiry", "hand_back"])
def test_a_cancelled_running_job_is_never_retried_however_its_attempt_ends(ending: str) -> None:
    job = EventJobFactory()
    lease = claim_one().lease
    ledger.cancel([job.pk])
    if ending == "fail":
        assert ledger.fail(lease, error_type="Boom", retry_in=0) == "completed"
    elif ending == "lease_expiry":
        expire_lease(job.pk)
        assert ledger.expire_leases() == 1
    else:
        assert ledger.hand_back(lease) == "completed"
    assert (status(job.pk), row(job.pk).error_type) == ("completed", "Cancelled")
    assert ledger.claim("w2") == []
    assert_mirror_consistent()


def test_a_cancelled_job_whose_effect_is_uncertain_still_ends_unknown() -> None:
    job = EventJobFactory()
    lease = claim_one().lease
    ledger.begin_effect(lease)
    ledger.cancel([job.pk])
    ledger.end_effect(lease, ok=False)
    assert ledger.finish(lease, note="Cancelled") == "unknown"
    assert row(job.pk).error_type == "UncertainEffect"


def test_a_handler_that_finishes_before_it_sees_the_cancel_completes_normally() -> None:
    """Cancel racing the job's own finish ends in exactly one outcome, with its history."""
    job = EventJobFactory()
    lease = claim_one().lease
    ledger.cancel([job.pk])
    assert ledger.finish(lease) == "completed"
    assert ledger.cancel([job.pk]).refused[job.pk].code == "invalid_state"
    assert list(Attempt.objects.filter(job_id=job.pk).values_list("outcome", flat=True)) == [
        "completed"
    ]


@pytest.mark.parametrize("state", ["completed", "failed", "unknown"])
def test_cancel_refuses_a_finished_job_and_changes_nothing(state: str) -> None:
    job = EventJobFactory()
    lease = claim_one().lease
    if state == "completed":
        ledger.finish(lease)
    elif state == "failed":
        with override_settings(FEISHU_INBOX={"MAX_ATTEMPTS": 1}):
            ledger.fail(lease, error_type="Boom")
    else:
        ledger.begin_effect(lease)
        ledger.finish(lease)
    before = snapshot(job.pk)
    outcome = ledger.cancel([job.pk, 999_999])
    assert isinstance(outcome.refused[job.pk], InvalidState)
    assert (
        f"it is {state}, not queued or retry_wait or waiting or running"
        in outcome.refused[job.pk].message
    )
    assert isinstance(outcome.refused[999_999], JobNotFound)
    assert snapshot(job.pk) == before


# --- replay ---------------------------------------------------------------------------------


def test_replay_runs_a_completed_job_again_in_its_place_with_its_history() -> None:
    job = completed_job()
    later = EventJobFactory()  # arrived after it, not run yet
    outcome = ledger.replay([job.pk])
    assert (outcome.done, outcome.moved) == ([job.pk], {})
    r = row(job.pk)
    assert (r.status, r.attempt, r.error_type, r.resolution, r.finished_at) == (
        "queued",
        0,
        "",
        "replayed",
        None,
    )
    assert Attempt.objects.filter(job_id=job.pk).count() == 1  # the earlier attempt stays
    assert claim_one().id == job.pk  # before the later job: its original place
    assert_mirror_consistent()
    assert row(later.pk).status == "queued"


def test_replay_after_later_jobs_ran_makes_it_the_chats_newest() -> None:
    job = completed_job()
    later = completed_job()  # ran after it
    waiting = EventJobFactory()
    outcome = ledger.replay([job.pk])
    [new_id] = outcome.done
    assert outcome.moved == {job.pk: new_id} and new_id > waiting.pk
    assert not EventJob.objects.filter(pk=job.pk).exists()
    moved = row(new_id)
    assert (moved.event_id, moved.status, moved.partition_key) == (job.event_id, "queued", "chat-1")
    assert Attempt.objects.filter(job_id=new_id).count() == 1  # its history moved with it
    assert [claim_one().id] == [waiting.pk]  # it waits behind what arrived before it ran again
    assert row(later.pk).status == "completed"
    assert_mirror_consistent()


@pytest.mark.parametrize("state", ["queued", "running", "retry_wait", "failed", "unknown"])
def test_replay_refuses_a_live_job(state: str) -> None:
    job = EventJobFactory()
    if state != "queued":
        lease = claim_one().lease
        if state == "retry_wait":
            ledger.fail(lease, error_type="Boom", retry_in=600)
        elif state == "failed":
            with override_settings(FEISHU_INBOX={"MAX_ATTEMPTS": 1}):
                ledger.fail(lease, error_type="Boom")
        elif state == "unknown":
            ledger.begin_effect(lease)
            ledger.finish(lease)
    before = snapshot(job.pk)
    refusal = ledger.replay([job.pk]).refused[job.pk]
    assert isinstance(refusal, NotRequeueable) and refusal.code == "not_requeueable"
    assert snapshot(job.pk) == before


def test_replay_refuses_while_a_live_job_holds_the_same_event() -> None:
    first = completed_job(note="")
    # The same event stored again under another dedupe key (its key function changed).
    again = EventJobFactory(event_id=first.event_id, dedupe_key="another-key", partition_key="x")
    before = snapshot(first.pk)
    refusal = ledger.replay([first.pk]).refused[first.pk]
    assert isinstance(refusal, Duplicate) and refusal.code == "duplicate"
    assert snapshot(first.pk) == before
    ledger.finish(claim_one().lease)
    assert status(again.pk) == "completed"
    assert ledger.replay([first.pk]).done == [first.pk]  # once that one is done, it may


def test_a_redelivery_of_a_replayed_event_is_still_one_job() -> None:
    job = completed_job()
    ledger.replay([job.pk])
    again = ledger.enqueue(
        event_id=job.event_id, event_type=job.event_type, partition_key="chat-1", payload={}
    )
    assert again == ledger.EnqueueResult(job_id=job.pk, created=False)


# --- retry policies -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backoff", "expected"),
    [("exponential", [2, 4, 8, 10]), ("linear", [2, 4, 6, 8]), ("fixed", [2, 2, 2, 2])],
)
def test_retry_policies_back_off_as_declared(backoff: str, expected: list[float]) -> None:
    policy = RetryPolicy(attempts=5, backoff=backoff, delay=2, max_delay=10, jitter=False)  # type: ignore[arg-type]
    assert [policy.delay_before(n) for n in (1, 2, 3, 4)] == expected
    jittered = RetryPolicy(backoff=backoff, delay=2, max_delay=10, jitter=0.5)  # type: ignore[arg-type]
    samples = [jittered.delay_before(3) for _ in range(200)]
    assert all(expected[2] * 0.5 <= s <= expected[2] for s in samples)
    assert len({round(s, 6) for s in samples}) > 100  # not in lockstep


def test_a_bad_retry_policy_names_every_problem_at_registration() -> None:
    before = list(registry._problems)
    try:
        registry.handler(
            "",
            retry=RetryPolicy(attempts=0, backoff="cubic", delay=-1, max_delay=-5, jitter=2),  # type: ignore[arg-type]
        )(lambda event: None)
        found = registry.problems()[len(before) :]
        text = " ".join(found)
        for part in ("event type", "attempts", "backoff", "delay", "max_delay", "jitter"):
            assert part in text, (part, text)
        with pytest.raises(ConfigurationError) as info:
            registry.validate()
        assert info.value.code == "configuration"
    finally:
        registry._problems[:] = before
        registry._registry.pop("", None)


def test_a_handlers_own_attempts_are_stored_with_its_jobs_and_bound_them() -> None:
    retry._policies["t.policy"] = RetryPolicy(attempts=2)
    try:
        job = EventJobFactory(event_type="t.policy")
        assert row(job.pk).max_attempts == 2
        ledger.fail(claim_one().lease, error_type="Boom", retry_in=0)
        assert ledger.fail(claim_one().lease, error_type="Boom", retry_in=0) == "failed"
        plain = EventJobFactory(event_type="t.site", partition_key="other")
        assert row(plain.pk).max_attempts is None  # follows the site's MAX_ATTEMPTS
    finally:
        del retry._policies["t.policy"]


def test_retry_at_asks_for_a_time_and_the_attempts_still_bound_it() -> None:
    now = timezone.now()
    assert RetryAt(30).seconds == 30 and RetryAfter(timedelta(minutes=1)).seconds == 60
    assert abs(RetryAt(now + timedelta(seconds=90)).seconds_from(now) - 90) < 1e-6
    assert RetryAt(now - timedelta(seconds=5)).seconds_from(now) == 0
    with pytest.raises(TypeError, match="RetryAt needs a datetime"):
        RetryAt("soon")  # type: ignore[arg-type]
    job = EventJobFactory()
    with override_settings(FEISHU_INBOX={"MAX_ATTEMPTS": 2}):
        ledger.fail(claim_one().lease, error_type="RetryAt", retry_in=45)
        r = row(job.pk)
        assert abs((r.available_at - r.finished_at).total_seconds() - 45) < 1
        make_due(job.pk)
        assert ledger.fail(claim_one().lease, error_type="RetryAt", retry_in=45) == "failed"


# --- every refusal carries a code from one catalogue ----------------------------------------


def test_every_error_class_has_a_catalogued_code_meaning_and_fix() -> None:
    classes = [
        c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, InboxError)
    ]
    assert len(classes) >= 8
    for cls in classes:
        assert cls.code in CATALOGUE, cls
        meaning, fix = CATALOGUE[cls.code]
        assert meaning.endswith(".") and fix, cls.code


def test_every_code_the_code_raises_is_catalogued_and_in_the_manual() -> None:
    sources = [
        ROOT / "feishu_inbox" / "feishu" / name
        for name in ("protocol.py", "webhook.py", "channel.py")
    ]
    raised = set()
    for path in sources:
        raised |= set(re.findall(r'(?:ProtocolError|_error)\(\s*"([a-z_]+)"', path.read_text()))
    assert {"invalid_json", "too_deep", "bad_signature", "unknown_app"} <= raised
    manual = (ROOT / "docs" / "operating.md").read_text()
    for code in raised | set(CATALOGUE):
        assert code in CATALOGUE, code
        assert f"`{code}`" in manual, f"the error table of docs/operating.md lacks {code}"
    assert feishu.ProtocolError("too_deep", "x").code == "too_deep"


def test_refusals_describe_themselves_code_first() -> None:
    refusal = ledger.requeue([424242]).refused[424242]
    assert refusal.described().startswith("[not_found] Cannot requeue job 424242")
    assert refusal.as_dict()["code"] == "not_found" and refusal.as_dict()["fix"]


def test_enqueue_names_every_bad_argument_at_once() -> None:
    with pytest.raises(LedgerError) as info:
        ledger.enqueue(
            event_id="",
            event_type="x" * 200,
            partition_key="",
            payload=["no"],  # type: ignore[arg-type]
            max_attempts=0,
        )
    message = info.value.message
    for name in ("event_id", "event_type", "partition_key", "payload", "max_attempts"):
        assert name in message, (name, message)
    assert info.value.code == "invalid_argument" and "nothing was stored" in str(info.value)
    assert not EventJob.objects.exists()
