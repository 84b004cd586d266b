"""Concurrency per key (SPEC §9c): at most N running jobs per key across all workers,
checked from the handlers' own log (real ``runworker`` processes)."""

from __future__ import annotations

import pytest

from feishu_inbox import ledger
from feishu_inbox.models import ConcurrencySlot, EventJob
from tests.support.processes import wait_for
from tests.support.worker_helpers import Workers

pytestmark = pytest.mark.django_db(transaction=True)


def most_at_once(spans: list[tuple[int, int]]) -> int:
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, step in edges:  # an end before a start at the same instant
        running += step
        peak = max(peak, running)
    return peak


def test_a_concurrency_key_never_has_more_than_n_running(workers: Workers) -> None:
    tenant = {}
    for n in range(12):
        tenant[f"c{n}"] = "t0" if n < 8 else "t1"
        ledger.enqueue(
            event_id=f"c{n}",
            event_type="test.concurrent",
            partition_key=f"chat-{n}",  # unordered work: a chat each
            payload={"header": {"tenant_key": tenant[f"c{n}"]}, "steps": ["work:0.3"]},
        )
    for _ in range(2):
        workers.start("--concurrency", "4", FEISHU_INBOX_POLL_INTERVAL="0.1")
    wait_for(lambda: EventJob.objects.completed().count() == 12, 60, "12 completed jobs")
    starts = {line[1]: int(line[3]) for line in workers.lines("start")}
    ends = {line[1]: int(line[3]) for line in workers.lines("end")}
    for key, expected in (("t0", 2), ("t1", 2)):
        spans = [(starts[e], ends[e]) for e, t in tenant.items() if t == key]
        assert most_at_once(spans) == expected, key  # never more, and it does run 2 at once
    assert len(workers.lines("start")) == 12  # a job waiting for a slot never ran its handler
    assert set(EventJob.objects.values_list("attempt", flat=True)) == {1}
    assert not ConcurrencySlot.objects.exists()  # every slot given back


def test_a_waiter_is_parked_and_woken_when_a_slot_is_given_back(workers: Workers) -> None:
    """With its key's one slot held, a job is handed back once, parked (not due for a few
    seconds: it does not poll), and made due the moment the holder gives the slot back."""
    from datetime import timedelta

    from django.utils import timezone

    from feishu_inbox.models import ConcurrencyWaiter

    def enqueue(name: str, steps: list[str]) -> int:
        return ledger.enqueue(
            event_id=name,
            event_type="test.concurrent_one",
            partition_key=f"chat-{name}",
            payload={"header": {"tenant_key": "solo"}, "steps": steps},
        ).job_id

    holder = enqueue("holder", ["gate:hold"])
    workers.start("--concurrency", "2", FEISHU_INBOX_POLL_INTERVAL="0.1")
    wait_for(lambda: ConcurrencySlot.objects.filter(job_id=holder).exists(), 30, "the holder")
    waiter = enqueue("waiter", [])  # after the holder has the slot
    wait_for(
        lambda: ConcurrencyWaiter.objects.filter(job_id=waiter).exists(), 30, "a parked waiter"
    )
    wait_for(
        lambda: EventJob.objects.get(pk=waiter).status == "queued", 10, "the waiter handed back"
    )
    parked = EventJob.objects.get(pk=waiter)
    assert parked.available_at > timezone.now() + timedelta(seconds=1)  # parked, not polling
    assert EventJob.objects.get(pk=holder).status == "running"
    workers.open_gate("hold")
    wait_for(lambda: EventJob.objects.completed().count() == 2, 10, "both completed")
    started = {line[1]: int(line[3]) for line in workers.lines("start")}
    ended = {line[1]: int(line[3]) for line in workers.lines("end")}
    woke_after = (started["waiter"] - ended["holder"]) / 1e9
    assert 0 <= woke_after < 1.0, woke_after  # woken by the give-back, not by its own timer
    assert not ConcurrencyWaiter.objects.exists() and not ConcurrencySlot.objects.exists()
    assert EventJob.objects.get(pk=waiter).attempt == 1  # waiting spent no attempt
    from feishu_inbox.models import Attempt

    assert Attempt.objects.filter(job_id=waiter).count() <= 2  # one hand-back, not one a 0.5 s


def test_a_give_back_wakes_a_waiting_job_not_a_stale_or_running_waiter() -> None:
    """The rows of waiters whose job ended are dropped, a waiter still between its parking
    and its hand-back is passed over (it keeps its row), and the free slot goes to the
    oldest job that really waits."""
    from datetime import timedelta

    from django.utils import timezone

    from feishu_inbox.ledger import concurrency
    from feishu_inbox.models import ConcurrencyWaiter

    def job(name: str) -> int:
        return ledger.enqueue(
            event_id=name, event_type="t", partition_key=f"chat-{name}", payload={}
        ).job_id

    ended, holder, parking, waiting = job("ended"), job("holder"), job("parking"), job("waiting")
    claimed = {c.id: c for c in ledger.claim("w", limit=4)}
    assert concurrency.take("k", 1, claimed[holder].lease) is None  # the slot
    for waiter in (ended, parking, waiting):
        assert concurrency.take("k", 1, claimed[waiter].lease) is not None  # parked
    ledger.finish(claimed[ended].lease)  # its job ended while it was parked
    ledger.hand_back(claimed[waiting].lease, delay=5, error_type="Waiting", message="slot")
    # `parking` is still running: its hand-back has not come yet
    concurrency.give_back(["k"], claimed[holder].lease)
    woken = EventJob.objects.get(pk=waiting)
    assert woken.available_at <= timezone.now() + timedelta(seconds=1)  # due now, not in 5 s
    assert set(ConcurrencyWaiter.objects.values_list("job_id", flat=True)) == {parking}
