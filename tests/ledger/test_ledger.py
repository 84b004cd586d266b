"""Every transition of SPEC §3 and every refusal, on the database the suite runs on."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from feishu_inbox import ledger
from feishu_inbox.errors import InvalidState, JobNotFound, LeaseLost, LedgerError, Superseded
from feishu_inbox.ledger import retention, rules
from feishu_inbox.ledger.payloads import MAX_JSON_DEPTH
from feishu_inbox.ledger.retry import backoff_seconds
from feishu_inbox.ledger.stats import next_wakeup
from feishu_inbox.ledger.stats import stats as ledger_stats
from feishu_inbox.models import Attempt, EventJob, Maintenance, Partition
from tests.support.factories import EventJobFactory
from tests.support.ledger_helpers import (
    assert_mirror_consistent,
    expire_lease,
    make_due,
    snapshot,
    status,
)

pytestmark = pytest.mark.django_db


def claim_one(worker: str = "w1") -> ledger.ClaimedJob:
    jobs = ledger.claim(worker)
    assert len(jobs) == 1
    return jobs[0]


# --- enqueue ----------------------------------------------------------------------------


def test_enqueue_stores_once_and_duplicates_change_nothing() -> None:
    first = ledger.enqueue(event_id="e1", event_type="t", partition_key="c", payload={"n": 1})
    assert first.created
    before = snapshot(first.job_id)
    again = ledger.enqueue(event_id="e1", event_type="t", partition_key="c", payload={"n": 2})
    assert again == ledger.EnqueueResult(job_id=first.job_id, created=False)
    assert snapshot(first.job_id) == before
    assert EventJob.objects.count() == 1


@pytest.mark.parametrize("state", ["running", "failed", "unknown"])
def test_duplicate_of_a_live_job_changes_nothing(state: str) -> None:
    job = EventJobFactory(event_id="dup")
    claimed = claim_one()
    if state == "failed":
        with override_settings(FEISHU_INBOX={"MAX_ATTEMPTS": 1}):
            ledger.fail(claimed.lease, error_type="Boom")
    elif state == "unknown":
        ledger.begin_effect(claimed.lease)
        ledger.finish(claimed.lease)
    assert status(job.pk) == state
    before = snapshot(job.pk)
    assert not ledger.enqueue(
        event_id="dup", event_type="t", partition_key="chat-1", payload={}
    ).created
    assert snapshot(job.pk) == before


def test_dedupe_key_is_per_app_and_overrides_event_id() -> None:
    a = ledger.enqueue(
        event_id="e1", dedupe_key="msg-1", event_type="t", partition_key="c", payload={}
    )
    b = ledger.enqueue(
        event_id="e2", dedupe_key="msg-1", event_type="t", partition_key="c", payload={}
    )
    c = ledger.enqueue(
        event_id="e1",
        dedupe_key="msg-1",
        event_type="t",
        partition_key="c",
        payload={},
        app="other",
    )
    assert a.created and not b.created and c.created
    assert b.job_id == a.job_id


@pytest.mark.parametrize(
    "bad",
    [
        {"event_id": ""},
        {"partition_key": ""},
        {"event_type": "x" * 129},
        {"payload": ["not", "a", "dict"]},
        {"app": ""},
    ],
)
def test_enqueue_refuses_bad_input_and_stores_nothing(bad: dict[str, object]) -> None:
    args: dict[str, object] = {
        "event_id": "e",
        "event_type": "t",
        "partition_key": "c",
        "payload": {},
    }
    args.update(bad)
    with pytest.raises(LedgerError) as info:
        ledger.enqueue(**args)  # type: ignore[arg-type]
    assert "nothing was stored" in str(info.value)
    assert not EventJob.objects.exists()
    assert not Partition.objects.exists()


# --- claim and partition order ----------------------------------------------------------


def test_claim_sets_lease_and_returns_the_event() -> None:
    job = EventJobFactory(payload={"hello": "world"}, private_message=True)
    claimed = claim_one("w1")
    assert claimed.id == job.pk
    assert claimed.payload == {"hello": "world"}
    assert claimed.private_message
    row = EventJob.objects.get(pk=job.pk)
    assert (row.status, row.attempt, row.worker_id) == ("running", 1, "w1")
    assert row.lease_token == claimed.lease.token and len(row.lease_token) == 32
    assert row.lease_until is not None and row.lease_until > timezone.now()
    assert ledger.claim("w2") == []
    assert_mirror_consistent()


def test_claim_takes_lowest_sequence_across_partitions() -> None:
    jobs = [EventJobFactory(partition_key=f"c{i % 3}") for i in range(6)]
    claimed = ledger.claim("w", limit=10)
    assert [c.id for c in claimed] == [j.pk for j in jobs[:3]]


@pytest.mark.parametrize("head_state", ["running", "retry_wait", "failed", "unknown"])
def test_later_job_waits_while_head_is_unresolved(head_state: str) -> None:
    head = EventJobFactory(partition_key="a")
    behind = EventJobFactory(partition_key="a")
    other = EventJobFactory(partition_key="b")
    lease = claim_one().lease
    if head_state == "retry_wait":
        ledger.fail(lease, error_type="Boom")
        make_due(head.pk)  # even due, it is the head that runs again, not the job behind it
    elif head_state == "failed":
        with override_settings(FEISHU_INBOX={"MAX_ATTEMPTS": 1}):
            ledger.fail(lease, error_type="Boom")
    elif head_state == "unknown":
        ledger.begin_effect(lease)
        ledger.fail(lease, error_type="Boom")
    assert status(head.pk) == head_state
    claimed = [c.id for c in ledger.claim("w2", limit=10)]
    expected = [head.pk, other.pk] if head_state == "retry_wait" else [other.pk]
    assert claimed == expected
    assert behind.pk not in claimed
    assert_mirror_consistent()


def test_finish_advances_the_partition_in_receipt_order() -> None:
    jobs = [EventJobFactory(partition_key="a") for _ in range(3)]
    order = []
    while claimed := ledger.claim("w"):
        order.append(claimed[0].id)
        assert ledger.finish(claimed[0].lease) == "completed"
        assert_mirror_consistent()
    assert order == [j.pk for j in jobs]
    assert Partition.objects.get(key="a").head_state == "idle"


def test_delayed_retry_is_not_claimed_before_it_is_due() -> None:
    EventJobFactory()
    ledger.fail(claim_one().lease, error_type="Boom", retry_in=3600)
    assert ledger.claim("w") == []


# --- fencing ------------------------------------------------------------------------------


def _wrong_worker(lease: ledger.Lease) -> ledger.Lease:
    return ledger.Lease(lease.job_id, "intruder", lease.token, lease.partition_key, 1)


def _wrong_token(lease: ledger.Lease) -> ledger.Lease:
    return ledger.Lease(lease.job_id, lease.worker_id, "0" * 32, lease.partition_key, 1)


FENCED: dict[str, Callable[[ledger.Lease], object]] = {
    "renew": ledger.renew,
    "begin_effect": ledger.begin_effect,
    "end_effect": lambda lease: ledger.end_effect(lease, ok=True),
    "finish": ledger.finish,
    "fail": lambda lease: ledger.fail(lease, error_type="Boom"),
    "hand_back": ledger.hand_back,
}


@pytest.mark.parametrize("operation", sorted(FENCED))
@pytest.mark.parametrize("breach", ["wrong_worker", "wrong_token", "expired", "not_running"])
def test_fenced_calls_refuse_and_change_nothing(operation: str, breach: str) -> None:
    job = EventJobFactory()
    lease = claim_one().lease
    ledger.begin_effect(lease)  # so end_effect has something to end
    if breach == "wrong_worker":
        lease = _wrong_worker(lease)
    elif breach == "wrong_token":
        lease = _wrong_token(lease)
    elif breach == "expired":
        expire_lease(job.pk)
    else:
        ledger.end_effect(lease, ok=True)
        ledger.finish(lease)
    before = snapshot(job.pk)
    with pytest.raises(LeaseLost) as info:
        FENCED[operation](lease)
    assert f"job {job.pk}" in str(info.value)
    assert snapshot(job.pk) == before


def test_taken_over_job_cannot_be_touched_by_its_old_worker() -> None:
    job = EventJobFactory()
    old = claim_one("old").lease
    expire_lease(job.pk)
    new = claim_one("new").lease
    assert new.token != old.token and new.attempt == 2
    before = snapshot(job.pk)
    for operation in FENCED.values():
        with pytest.raises(LeaseLost, match="worker new holds it"):
            operation(old)
    assert snapshot(job.pk) == before
    assert ledger.finish(new) == "completed"


def test_renew_extends_the_lease() -> None:
    job = EventJobFactory()
    lease = claim_one().lease
    first = EventJob.objects.get(pk=job.pk).lease_until
    new_deadline = ledger.renew(lease, lease_seconds=600)
    assert first is not None and new_deadline > first
    assert EventJob.objects.get(pk=job.pk).lease_until == new_deadline


# --- effects, finish, fail ----------------------------------------------------------------


def test_effect_that_completed_lets_the_job_complete() -> None:
    job = EventJobFactory()
    lease = claim_one().lease
    ledger.begin_effect(lease)
    row = EventJob.objects.get(pk=job.pk)
    assert (row.effects_in_flight, row.side_effect_started) == (1, True)
    ledger.end_effect(lease, ok=True)
    assert ledger.finish(lease) == "completed"
    row.refresh_from_db()
    assert (row.status, row.effects_in_flight, row.effect_uncertain) == ("completed", 0, False)
    assert row.finished_at is not None and row.lease_until is None


@pytest.mark.parametrize("ended", [False, True])
def test_finish_with_open_or_uncertain_effect_is_unknown(ended: bool) -> None:
    job = EventJobFactory()
    lease = claim_one().lease
    ledger.begin_effect(lease)
    if ended:
        ledger.end_effect(lease, ok=False)
    assert ledger.finish(lease) == "unknown"
    row = EventJob.objects.get(pk=job.pk)
    assert row.error_type == "UncertainEffect"
    assert Partition.objects.get(key=row.partition_key).head_state == "unknown"


def test_end_effect_without_begin_is_refused() -> None:
    EventJobFactory()
    with pytest.raises(LeaseLost):
        ledger.end_effect(claim_one().lease, ok=True)


def test_finish_superseded_and_note_are_kept() -> None:
    a, b = EventJobFactory(partition_key="x"), EventJobFactory(partition_key="y")
    ledger.finish(claim_one().lease, superseded=True)
    ledger.finish(claim_one().lease, note="NoHandler")
    assert EventJob.objects.get(pk=a.pk).error_type == "Superseded"
    assert EventJob.objects.get(pk=b.pk).error_type == "NoHandler"


def test_fail_retries_with_backoff_then_fails() -> None:
    job = EventJobFactory()
    with override_settings(FEISHU_INBOX={"MAX_ATTEMPTS": 3, "BACKOFF_BASE": 60}):
        for attempt in (1, 2):
            claimed = claim_one()
            assert claimed.lease.attempt == attempt
            assert ledger.fail(claimed.lease, error_type="Boom", message="x" * 10_000) == (
                "retry_wait"
            )
            row = EventJob.objects.get(pk=job.pk)
            assert row.available_at > timezone.now() + timedelta(seconds=20)
            assert row.error_type == "Boom" and len(row.error_message) <= 4000
            assert ledger.claim("w") == []
            make_due(job.pk)
        assert ledger.fail(claim_one().lease, error_type="Boom") == "failed"
    assert list(Attempt.objects.filter(job=job).values_list("number", "outcome")) == [
        (1, "retry_wait"),
        (2, "retry_wait"),
        (3, "failed"),
    ]


def test_fail_after_any_effect_is_unknown_and_never_retried() -> None:
    job = EventJobFactory()
    lease = claim_one().lease
    ledger.begin_effect(lease)
    ledger.end_effect(lease, ok=True)
    assert ledger.fail(lease, error_type="Boom") == "unknown"
    row = EventJob.objects.get(pk=job.pk)
    assert (row.status, row.error_type) == ("unknown", "Boom")
    assert ledger.claim("w") == []


def test_backoff_is_exponential_capped_and_jittered() -> None:
    with override_settings(
        FEISHU_INBOX={"BACKOFF_BASE": 2, "BACKOFF_CAP": 100, "BACKOFF_JITTER": 0.5}
    ):
        for attempt, ceiling in ((1, 2), (2, 4), (5, 32), (20, 100)):
            samples = [backoff_seconds(attempt) for _ in range(200)]
            assert all(ceiling * 0.5 <= s <= ceiling for s in samples)
            assert max(samples) - min(samples) > ceiling * 0.1  # not in lockstep


# --- hand back ----------------------------------------------------------------------------


def test_hand_back_requeues_without_spending_an_attempt() -> None:
    job = EventJobFactory()
    lease = claim_one().lease
    assert ledger.hand_back(lease) == "queued"
    row = EventJob.objects.get(pk=job.pk)
    assert (row.status, row.attempt, row.lease_until) == ("queued", 0, None)
    again = claim_one()
    assert again.id == job.pk and again.lease.attempt == 1


def test_hand_back_after_a_retry_returns_to_retry_wait_due_now() -> None:
    job = EventJobFactory()
    ledger.fail(claim_one().lease, error_type="Boom")
    make_due(job.pk)
    assert ledger.hand_back(claim_one().lease) == "retry_wait"
    assert EventJob.objects.get(pk=job.pk).attempt == 1
    assert claim_one().id == job.pk


def test_hand_back_after_an_effect_is_refused() -> None:
    job = EventJobFactory()
    lease = claim_one().lease
    ledger.begin_effect(lease)
    before = snapshot(job.pk)
    with pytest.raises(InvalidState, match="an effect has started"):
        ledger.hand_back(lease)
    assert snapshot(job.pk) == before


# --- lease expiry ---------------------------------------------------------------------------


def test_expired_lease_without_effect_retries_at_once() -> None:
    job = EventJobFactory()
    claim_one("dead")
    expire_lease(job.pk)
    again = claim_one("alive")  # the claimer recovers it, then picks it
    assert again.id == job.pk and again.lease.attempt == 2
    history = Attempt.objects.get(job=job)
    assert (history.worker_id, history.outcome, history.error_type) == (
        "dead",
        "retry_wait",
        "LeaseExpired",
    )


def test_expired_lease_with_attempts_spent_fails() -> None:
    job = EventJobFactory()
    with override_settings(FEISHU_INBOX={"MAX_ATTEMPTS": 1}):
        claim_one()
        expire_lease(job.pk)
        assert ledger.expire_leases() == 1
    assert status(job.pk) == "failed"


def test_expired_lease_after_effect_is_unknown_and_never_claimed_again() -> None:
    job = EventJobFactory()
    lease = claim_one().lease
    ledger.begin_effect(lease)
    ledger.end_effect(lease, ok=True)
    expire_lease(job.pk)
    assert ledger.claim("w2") == []
    row = EventJob.objects.get(pk=job.pk)
    assert (row.status, row.error_type) == ("unknown", "LeaseExpiredAfterSideEffect")
    assert_mirror_consistent()


# --- operator actions -----------------------------------------------------------------------


def _failed_job(partition_key: str = "chat-1") -> EventJob:
    job = EventJobFactory(partition_key=partition_key)
    with override_settings(FEISHU_INBOX={"MAX_ATTEMPTS": 1}):
        ledger.fail(claim_one().lease, error_type="Boom")
    return job


def _unknown_job(partition_key: str = "chat-1") -> EventJob:
    job = EventJobFactory(partition_key=partition_key)
    lease = claim_one().lease
    ledger.begin_effect(lease)
    ledger.finish(lease)
    return job


def test_requeue_failed_job() -> None:
    job = _failed_job()
    outcome = ledger.requeue([job.pk])
    assert outcome.done == [job.pk] and not outcome.refused
    row = EventJob.objects.get(pk=job.pk)
    assert (row.status, row.attempt, row.resolution) == ("queued", 0, "requeued")
    assert claim_one().id == job.pk


def test_reconcile_applied_completes_and_unblocks_the_partition() -> None:
    job = _unknown_job()
    behind = EventJobFactory()
    assert ledger.claim("w") == []
    assert ledger.reconcile([job.pk], applied=True).done == [job.pk]
    row = EventJob.objects.get(pk=job.pk)
    assert (row.status, row.resolution) == ("completed", "applied")
    assert claim_one().id == behind.pk


def test_reconcile_not_applied_runs_again_with_clean_effect_flags() -> None:
    job = _unknown_job()
    ledger.reconcile([job.pk], applied=False)
    row = EventJob.objects.get(pk=job.pk)
    assert (row.status, row.attempt, row.resolution) == ("queued", 0, "not_applied")
    assert (row.side_effect_started, row.effect_uncertain, row.effects_in_flight) == (
        False,
        False,
        0,
    )
    claimed = claim_one()
    assert claimed.id == job.pk
    assert ledger.finish(claimed.lease) == "completed"


def test_discard_failed_job_unblocks_the_partition() -> None:
    job = _failed_job()
    behind = EventJobFactory()
    assert ledger.discard([job.pk]).done == [job.pk]
    assert EventJob.objects.get(pk=job.pk).resolution == "discarded"
    assert claim_one().id == behind.pk


@pytest.mark.parametrize(
    ("action", "eligible"),
    [
        (ledger.requeue, "failed"),
        (ledger.discard, "failed"),
        (lambda ids: ledger.reconcile(ids, applied=True), "unknown"),
        (lambda ids: ledger.reconcile(ids, applied=False), "unknown"),
    ],
)
def test_operator_actions_refuse_other_states_per_job(
    action: Callable[[list[int]], ledger.Outcome], eligible: str
) -> None:
    failed = _failed_job("p1")
    unknown = _unknown_job("p2")
    running = EventJobFactory(partition_key="p3")
    claim_one()
    queued = EventJobFactory(partition_key="p3")
    completed = EventJobFactory(partition_key="p4")
    ledger.finish(claim_one().lease)
    ids = [failed.pk, unknown.pk, running.pk, queued.pk, completed.pk, 999_999]
    before = {i: snapshot(i) for i in ids if i != 999_999}
    target = failed if eligible == "failed" else unknown
    outcome = action(ids)
    assert outcome.done == [target.pk]
    assert set(outcome.refused) == set(ids) - {target.pk}
    assert isinstance(outcome.refused[999_999], JobNotFound)
    assert isinstance(outcome.refused[running.pk], InvalidState)
    assert "it is running" in str(outcome.refused[running.pk])
    for job_id, snap in before.items():
        if job_id != target.pk:
            assert snapshot(job_id) == snap
    assert_mirror_consistent()


# --- retention ---------------------------------------------------------------------------


def test_purge_deletes_only_completed_jobs_past_retention_in_batches() -> None:
    old = [EventJobFactory(partition_key=f"p{i}") for i in range(5)]
    for _ in old:
        ledger.finish(claim_one().lease)
    recent = EventJobFactory(partition_key="recent")
    ledger.finish(claim_one().lease)
    unknown = _unknown_job("u")
    long_ago = timezone.now() - timedelta(days=8)
    EventJob.objects.filter(pk__in=[j.pk for j in old] + [unknown.pk]).update(finished_at=long_ago)
    with override_settings(FEISHU_INBOX={"PURGE_BATCH_SIZE": 2}):
        result = retention.purge()
    assert result == retention.PurgeResult(
        completed_deleted=5, unknown_expired=0, partitions_deleted=5
    )
    assert set(EventJob.objects.values_list("pk", flat=True)) == {recent.pk, unknown.pk}
    assert not Attempt.objects.filter(job_id__in=[j.pk for j in old]).exists()
    # The chats whose jobs are all gone lose their partition row; the others keep theirs.
    assert set(Partition.objects.values_list("key", flat=True)) == {"recent", "u"}
    again = EventJobFactory(partition_key="p0")  # a purged chat speaks again
    assert claim_one().id == again.pk
    assert_mirror_consistent()


def test_purge_expires_unknown_only_when_configured() -> None:
    unknown = _unknown_job()
    behind = EventJobFactory()
    EventJob.objects.filter(pk=unknown.pk).update(finished_at=timezone.now() - timedelta(days=3))
    with override_settings(
        FEISHU_INBOX={"UNKNOWN_RETENTION": timedelta(days=2), "INTERRUPT_PRIVATE": False}
    ):
        assert retention.purge().unknown_expired == 1
    assert status(unknown.pk) == "completed"
    assert claim_one().id == behind.pk


# --- reading -----------------------------------------------------------------------------


def test_next_wakeup_is_the_earliest_due_head_or_lease_expiry() -> None:
    assert next_wakeup() is None
    job = EventJobFactory(partition_key="a")
    wake = next_wakeup()
    assert wake is not None and wake <= timezone.now()
    ledger.fail(claim_one().lease, error_type="Boom", retry_in=600)
    wake = next_wakeup()
    assert wake == EventJob.objects.get(pk=job.pk).available_at
    EventJobFactory(partition_key="b")
    claimed = claim_one()
    assert next_wakeup() == EventJob.objects.get(pk=claimed.id).lease_until


def test_only_a_private_job_followed_by_a_private_message_is_superseded() -> None:
    EventJobFactory(partition_key="dm", private_message=True)
    EventJobFactory(partition_key="group", private_message=False)
    private, group = claim_one().lease, claim_one().lease

    def superseded(lease: ledger.Lease) -> bool:
        return ledger.signals([lease])[lease.job_id].superseded

    assert not superseded(private)
    EventJobFactory(partition_key="dm", private_message=True)
    EventJobFactory(partition_key="group", private_message=True)
    assert superseded(private)
    assert not superseded(group)
    with override_settings(FEISHU_INBOX={"INTERRUPT_PRIVATE": False}):
        assert not superseded(private)


def test_stats_counts_states_due_delayed_and_blocked() -> None:
    _failed_job("f")
    _unknown_job("u")
    EventJobFactory(partition_key="u")  # waits behind the unknown head
    EventJobFactory(partition_key="r")
    ledger.fail(claim_one().lease, error_type="Boom", retry_in=600)
    EventJobFactory(partition_key="q")
    stats = ledger_stats()
    assert stats.counts == {
        "queued": 2,
        "running": 0,
        "retry_wait": 1,
        "completed": 0,
        "failed": 1,
        "unknown": 1,
        "waiting": 0,
    }
    assert (stats.due, stats.delayed, stats.blocked_partitions) == (2, 1, 2)
    assert stats.due_behind_head == 1  # the job behind the unknown head; "q" is claimable
    assert stats.oldest_due_age_seconds is not None and stats.oldest_due_age_seconds >= 0


def test_stats_due_jobs_all_behind_unresolved_heads_leave_no_oldest_due() -> None:
    """Due jobs that wait behind running or blocked heads are named as such: "due 3" next to
    "oldest due: -" would contradict itself."""
    _failed_job("f")
    EventJobFactory(partition_key="f")
    EventJobFactory(partition_key="run")
    claim_one()  # "run"'s head is running now
    EventJobFactory(partition_key="run")
    EventJobFactory(partition_key="run")
    stats = ledger_stats()
    assert (stats.due, stats.due_behind_head, stats.oldest_due_age_seconds) == (3, 3, None)
    assert stats.as_dict()["due_behind_head"] == 3
    EventJobFactory(partition_key="free")
    stats = ledger_stats()
    assert (stats.due, stats.due_behind_head) == (4, 3)
    assert stats.oldest_due_age_seconds is not None


def test_finish_and_claim_completes_and_claims_the_next_head() -> None:
    first = EventJobFactory(partition_key="a")
    second = EventJobFactory(partition_key="a")  # becomes claimable by this very finish
    third = EventJobFactory(partition_key="b")
    lease = claim_one("w").lease
    status, jobs = ledger.finish_and_claim(lease, limit=2)
    assert status == "completed" and EventJob.objects.get(pk=first.pk).status == "completed"
    assert sorted(j.id for j in jobs) == [second.pk, third.pk]
    assert all(j.lease.worker_id == "w" and j.lease.token for j in jobs)
    assert_mirror_consistent()


def test_finish_and_claim_with_a_lost_lease_claims_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = EventJobFactory(partition_key="a")
    other = EventJobFactory(partition_key="b")
    lease = ledger.claim("w")[0].lease
    expire_lease(job.pk)
    # No sweep of expired leases now (one is due each second): it would recover this job by
    # its expiry, a change of its own, not of the refused finish.
    monkeypatch.setattr(rules, "_last_sweep", [time.monotonic()])
    before = snapshot(job.pk)
    with pytest.raises(LeaseLost):
        ledger.finish_and_claim(lease, limit=1)
    assert snapshot(job.pk) == before
    assert EventJob.objects.get(pk=other.pk).status == "queued"


# --- retried writes: a reply lost to a database blink never applies twice -----------------


def test_a_retried_finish_finds_its_first_try_landed() -> None:
    job = EventJobFactory()
    lease = claim_one().lease
    assert ledger.finish(lease) == "completed"  # its reply was "lost"
    before = snapshot(job.pk)
    assert ledger.finish(lease, retrying=True) == "completed"
    assert snapshot(job.pk) == before
    with pytest.raises(LeaseLost):  # a second finish that is not a retry is refused, as ever
        ledger.finish(lease)


def test_a_retry_never_applies_after_a_takeover() -> None:
    job = EventJobFactory()
    old = claim_one("old").lease
    expire_lease(job.pk)
    new = claim_one("new").lease
    before = snapshot(job.pk)
    for retry in (
        lambda: ledger.finish(old, retrying=True),
        lambda: ledger.fail(old, error_type="Boom", retrying=True),
        lambda: ledger.hand_back(old, retrying=True),
    ):
        with pytest.raises(LeaseLost, match="worker new holds it"):
            retry()
    assert snapshot(job.pk) == before
    assert ledger.finish(new) == "completed"


def test_a_retried_fail_and_hand_back_return_what_landed() -> None:
    failing, handed = EventJobFactory(partition_key="f"), EventJobFactory(partition_key="h")
    fail_lease = claim_one().lease
    assert ledger.fail(fail_lease, error_type="Boom", retry_in=600) == "retry_wait"
    assert ledger.fail(fail_lease, error_type="Boom", retrying=True) == "retry_wait"
    hand_lease = claim_one().lease
    assert hand_lease.job_id == handed.pk
    assert ledger.hand_back(hand_lease) == "queued"
    assert ledger.hand_back(hand_lease, retrying=True) == "queued"
    assert Attempt.objects.filter(job_id__in=[failing.pk, handed.pk]).count() == 2


def test_a_claim_whose_reply_was_lost_is_found_by_its_token() -> None:
    jobs = [EventJobFactory(partition_key=f"c{i}") for i in range(2)]
    claimed = ledger.claim("w", limit=5, token="t" * 32)
    assert [c.id for c in ledger.claimed_with("w", "t" * 32)] == [j.pk for j in jobs]
    assert [c.lease for c in ledger.claimed_with("w", "t" * 32)] == [c.lease for c in claimed]
    assert ledger.claimed_with("other", "t" * 32) == []
    ledger.finish(claimed[0].lease)
    assert [c.id for c in ledger.claimed_with("w", "t" * 32)] == [jobs[1].pk]


def test_a_retried_finish_and_claim_finds_the_jobs_it_claimed() -> None:
    first = EventJobFactory(partition_key="a")
    second = EventJobFactory(partition_key="a")
    lease = claim_one("w").lease
    status, jobs = ledger.finish_and_claim(lease, limit=1, token="n" * 32)
    assert (status, [j.id for j in jobs]) == ("completed", [second.pk])
    again = ledger.finish_and_claim(lease, limit=1, token="n" * 32, retrying=True)
    assert again == (status, jobs)
    assert status == EventJob.objects.get(pk=first.pk).status


def test_effect_counts_written_as_values_survive_a_retry() -> None:
    job = EventJobFactory()
    lease = claim_one().lease
    ledger.begin_effect(lease, in_flight=1)
    ledger.begin_effect(lease, in_flight=1)  # the retry of a begin whose reply was lost
    assert EventJob.objects.get(pk=job.pk).effects_in_flight == 1
    ledger.end_effect(lease, ok=True, in_flight=0)
    ledger.end_effect(lease, ok=True, in_flight=0)  # and of its end
    assert ledger.finish(lease) == "completed"  # not unknown: one effect, begun and ended


# --- SPEC §4: entering an effect in a superseded job is refused ---------------------------


def test_an_effect_is_refused_in_a_superseded_job_and_nothing_starts() -> None:
    job = EventJobFactory(partition_key="dm", private_message=True)
    lease = claim_one().lease
    EventJobFactory(partition_key="dm", private_message=True)
    before = snapshot(job.pk)
    with pytest.raises(Superseded):
        ledger.begin_effect(lease)
    assert snapshot(job.pk) == before
    assert ledger.finish(lease, superseded=True) == "completed"
    assert EventJob.objects.get(pk=job.pk).error_type == "Superseded"


@pytest.mark.parametrize(
    ("newer_private", "interrupt"), [(False, True), (True, False)], ids=["group", "off"]
)
def test_an_effect_goes_ahead_when_nothing_supersedes(newer_private: bool, interrupt: bool) -> None:
    EventJobFactory(partition_key="dm", private_message=True)
    lease = claim_one().lease
    EventJobFactory(partition_key="dm", private_message=newer_private)
    with override_settings(FEISHU_INBOX={"INTERRUPT_PRIVATE": interrupt}):
        ledger.begin_effect(lease)
    assert EventJob.objects.get(pk=lease.job_id).side_effect_started


def test_superseded_is_not_an_exception_a_handler_can_swallow() -> None:
    assert issubclass(Superseded, BaseException) and not issubclass(Superseded, Exception)


# --- operator flags, unknown expiry, the shared purge chore ------------------------------


def test_reconcile_applied_leaves_no_effect_in_flight() -> None:
    job = _unknown_job()  # its effect is still "in flight": the worker died inside it
    ledger.reconcile([job.pk], applied=True)
    row = EventJob.objects.get(pk=job.pk)
    assert (row.status, row.effects_in_flight, row.effect_uncertain) == ("completed", 0, False)
    assert row.side_effect_started  # the record says an effect happened


def test_requeue_clears_the_previous_error() -> None:
    job = _failed_job()
    ledger.requeue([job.pk])
    row = EventJob.objects.get(pk=job.pk)
    assert (row.status, row.error_type, row.error_message) == ("queued", "", "")
    assert Attempt.objects.get(job_id=job.pk).error_type == "Boom"  # the history keeps it


def test_an_expired_unknown_job_keeps_its_history_for_the_completed_retention() -> None:
    unknown = _unknown_job()
    ten_days_ago = timezone.now() - timedelta(days=10)  # past both retentions
    EventJob.objects.filter(pk=unknown.pk).update(finished_at=ten_days_ago)
    with override_settings(
        FEISHU_INBOX={"UNKNOWN_RETENTION": timedelta(days=2), "INTERRUPT_PRIVATE": False}
    ):
        result = retention.purge(by="worker w-1")
    assert (result.unknown_expired, result.completed_deleted) == (1, 0)
    row = EventJob.objects.get(pk=unknown.pk)  # not deleted by the same purge
    assert (row.status, row.error_type, row.resolution) == (
        "completed",
        "UnknownExpired",
        "expired",
    )
    assert row.finished_at is not None and row.finished_at > timezone.now() - timedelta(minutes=1)
    assert "UNKNOWN_RETENTION" in row.error_message and "worker w-1" in row.error_message
    assert Attempt.objects.filter(job_id=unknown.pk).exists()


def test_the_purge_chore_goes_to_one_worker_per_interval() -> None:
    with override_settings(FEISHU_INBOX={"PURGE_INTERVAL": 600}):
        assert retention.purge_if_due("w1") is not None
        assert retention.purge_if_due("w2") is None  # not due again for ten minutes
        Maintenance.objects.update(due_at=timezone.now() - timedelta(seconds=1))
        assert retention.purge_if_due("w2") is not None
    chore = Maintenance.objects.get(name="purge")
    assert chore.worker_id == "w2" and chore.last_result.startswith("w2: deleted 0")
    with override_settings(FEISHU_INBOX={"PURGE_INTERVAL": None}):
        Maintenance.objects.update(due_at=timezone.now() - timedelta(seconds=1))
        assert retention.purge_if_due("w3") is None  # purged from cron only


def test_lease_expiry_on_the_last_attempt_is_worker_crashed() -> None:
    job = EventJobFactory()
    with override_settings(FEISHU_INBOX={"MAX_ATTEMPTS": 2}):
        for _ in range(2):
            claim_one("crashing")
            expire_lease(job.pk)
            ledger.expire_leases()
    row = EventJob.objects.get(pk=job.pk)
    assert (row.status, row.error_type, row.attempt) == ("failed", "WorkerCrashed", 2)
    assert "crashed" in row.error_message
    outcomes = list(Attempt.objects.filter(job=job).values_list("outcome", "error_type"))
    assert outcomes == [("retry_wait", "LeaseExpired"), ("failed", "WorkerCrashed")]


def test_enqueue_refuses_a_payload_nested_too_deep() -> None:
    deep: dict[str, object] = {}
    node = deep
    for _ in range(MAX_JSON_DEPTH):
        node["a"] = node = {}
    with pytest.raises(LedgerError, match="nested at most 64 levels"):
        ledger.enqueue(event_id="deep", event_type="t", partition_key="c", payload=deep)
    assert not EventJob.objects.exists()
