"""Fair claims (issue 53, SPEC §9j), in one process on both databases: while several tenants
have due heads, a claim gives each slot to the tenant with the fewest running jobs per
weight, each tenant's heads in their own order (priority, then receipt); with one tenant (a
site without tenants) the claim is the plain one. Real workers under a flood are in
``tests/runtime/test_fair_workers.py``."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from feishu_inbox import ledger
from feishu_inbox.ledger.rules import KeyFilter
from feishu_inbox.models import EventJob, Partition
from feishu_inbox.tables.tenants import TenantWeight
from tests.ledger.test_ledger_concurrency import held_open
from tests.support.ledger_helpers import assert_mirror_consistent

pytestmark = pytest.mark.django_db(transaction=True)


def flood(tenant: str, chats: int, per_chat: int, *, prefix: str = "chat") -> list[int]:
    """``per_chat`` jobs in each of ``chats`` chats of ``tenant``, chat after chat."""
    return [
        ledger.enqueue(
            event_id=f"{prefix}:{tenant}-{c}-{n}",
            event_type="test.noop",
            partition_key=f"{prefix}:{tenant}-{c}",
            payload={},
            tenant=tenant,
        ).job_id
        for n in range(per_chat)
        for c in range(chats)
    ]


def tenants_of(jobs: list[ledger.ClaimedJob]) -> Counter[str]:
    found = dict(EventJob.objects.filter(pk__in=[j.id for j in jobs]).values_list("id", "tenant"))
    return Counter(found[j.id] for j in jobs)


def chats_of(jobs: list[ledger.ClaimedJob]) -> list[str]:
    return list(
        EventJob.objects.filter(pk__in=[j.id for j in jobs]).values_list("partition_key", flat=True)
    )


def test_a_heavy_tenants_backlog_does_not_hold_back_a_light_one() -> None:
    """A's 10 chats were all enqueued first; B's 3 chats come after. The plain order (oldest
    head first) would give every slot to A until its backlog is gone; the fair claim gives
    B its share at once, and B's chats run while A still has nearly all of its backlog."""
    flood("a", 10, 20)
    light = flood("b", 3, 2)
    first = ledger.claim("w1", limit=6)
    assert tenants_of(first) == {"a": 3, "b": 3}
    # Now A and B run 3 each: the next slot goes to A (its 4th chat: share 4 against B's
    # none left due: B's chats each have their head running).
    assert tenants_of(ledger.claim("w1", limit=1)) == {"a": 1}
    running = [*first]
    rounds = 0
    while EventJob.objects.filter(pk__in=light).exclude(status="completed").exists():
        for job in running:  # a round: what runs ends, six slots claim again
            ledger.finish(job.lease)
        running = ledger.claim("w1", limit=6)
        rounds += 1
        assert rounds < 10, "B's second jobs never came"
    assert rounds == 2  # claimed by the first claim after their chats freed, ended by the next
    assert EventJob.objects.filter(tenant="a").exclude(status="completed").count() >= 190
    assert_mirror_consistent()


def test_running_jobs_count_against_their_tenants_share() -> None:
    """A already runs 4 jobs; B's new head is the next claim's, one slot at a time, though
    A's due heads are older."""
    flood("a", 8, 3)
    running = ledger.claim("w1", limit=4)
    assert tenants_of(running) == {"a": 4}
    flood("b", 2, 1)
    assert tenants_of(ledger.claim("w2", limit=1)) == {"b": 1}
    assert tenants_of(ledger.claim("w2", limit=1)) == {"b": 1}
    assert tenants_of(ledger.claim("w2", limit=1)) == {"a": 1}  # B has nothing due now


def test_weights_give_a_tenant_its_share_of_the_slots() -> None:
    """Weight 3 against 1: of 8 slots, A takes 6 and B 2 (shares k/3 against k: A's 1/3, 2/3,
    1, 4/3, 5/3, 2 and B's 1, 2; ties to the older head, A's)."""
    TenantWeight.objects.create(tenant="a", weight=3)
    flood("a", 10, 2)
    flood("b", 10, 2)
    assert tenants_of(ledger.claim("w1", limit=8)) == {"a": 6, "b": 2}


def test_a_tenants_heads_keep_their_order_and_no_chat_runs_twice() -> None:
    """Within a tenant, priority then receipt, as the plain claim; one head per chat, so a
    chat's second job is never claimed beside its first."""
    a = flood("a", 4, 2)
    b = flood("b", 4, 2)
    claimed = ledger.claim("w1", limit=20)
    assert sorted(j.id for j in claimed) == sorted(a[:4] + b[:4])  # the first job of each chat
    by_tenant = [j.id for j in claimed if j.id in a]
    assert by_tenant == sorted(by_tenant)
    assert len(set(chats_of(claimed))) == len(claimed)


def test_one_tenant_claims_in_the_plain_order() -> None:
    """A site without tenants (every job of none, ""): the claim reads the claimable index in
    order, oldest head first, whatever its size."""
    ids = flood("", 5, 2)
    claimed = ledger.claim("w1", limit=3)
    assert [j.id for j in claimed] == ids[:3]
    assert set(Partition.objects.values_list("head_tenant", flat=True)) == {""}


def test_jobs_of_no_tenant_are_a_tenant_of_their_own() -> None:
    """Site-wide work (tenant "") shares the slots with the tenants' work like any tenant."""
    flood("", 6, 2)
    flood("acme", 6, 2)
    assert tenants_of(ledger.claim("w1", limit=6)) == {"": 3, "acme": 3}


def test_a_worker_of_some_queues_claims_fairly_inside_them() -> None:
    """``runworker --queue`` with several tenants: only its queues' partitions, shared between
    the tenants; ``--exclude-queues``: every other one."""
    flood("a", 4, 1, prefix="task:mail")
    flood("b", 4, 1, prefix="task:mail")
    flood("a", 4, 1, prefix="task:video")
    mail = ledger.claim("w1", limit=4, keys=KeyFilter(("task:mail:",)))
    assert tenants_of(mail) == {"a": 2, "b": 2}
    assert {key.split(":")[1] for key in chats_of(mail)} == {"mail"}
    other = ledger.claim("w2", limit=10, keys=KeyFilter(("task:mail:",), excluding=True))
    assert {key.split(":")[1] for key in chats_of(other)} == {"video"}
    assert tenants_of(other) == {"a": 4}


def test_the_head_tenant_follows_the_head() -> None:
    """A chat's row mirrors its head's tenant as heads change: set by the enqueue of an idle
    chat, moved by each finish, "" when the chat is idle."""
    ledger.enqueue(event_id="x1", event_type="t", partition_key="p", payload={}, tenant="a")
    ledger.enqueue(event_id="x2", event_type="t", partition_key="p", payload={}, tenant="b")
    assert Partition.objects.get(key="p").head_tenant == "a"
    [job] = ledger.claim("w1")
    ledger.finish(job.lease)
    assert Partition.objects.get(key="p").head_tenant == "b"
    [job] = ledger.claim("w1")
    ledger.finish(job.lease)
    assert Partition.objects.get(key="p").head_tenant == ""
    assert_mirror_consistent()


def ranked(tenant: str, n: int, priority: int, *, after: timedelta | None = None) -> int:
    return ledger.enqueue_ranked(
        run_after=None if after is None else timezone.now() + after,
        priority=priority,
        event_id=f"ranked:{tenant}-{n}-{priority}",
        event_type="test.noop",
        partition_key=f"ranked:{tenant}-{n}-{priority}",
        payload={},
        tenant=tenant,
    ).job_id


def test_priority_comes_before_the_shares_across_tenants() -> None:
    """A task above 0 runs before waiting chats, one below 0 after them (docs/tasks.md),
    whoever's they are: the shares order the work of one priority. Site-wide bulk work at
    -100 takes no slot from the tenants' chats while they have due work."""
    for n in range(6):
        ranked("", n, -100)
        ranked("a", n, 0)
    urgent = ranked("b", 0, 100)
    claimed = ledger.claim("w1", limit=4)
    assert claimed[0].id == urgent or urgent in [j.id for j in claimed]
    assert tenants_of(claimed) == {"b": 1, "a": 3}
    assert tenants_of(ledger.claim("w1", limit=4)) == {"a": 3, "": 1}


@pytest.mark.usefixtures("postgres_only")
def test_a_second_claimer_passes_over_the_heads_the_first_one_holds() -> None:
    """Two workers claim at once while several tenants have work (one of them only a head
    not due yet): the second claim takes the next heads down each tenant's order, as the
    plain claim does, never nothing while due heads remain."""
    flood("a", 10, 1)
    ranked("b", 0, 0, after=timedelta(hours=1))  # B's only head: claimable, not due
    with held_open(lambda: [j.id for j in ledger.claim("w1", limit=4)]) as first:
        second = [j.id for j in ledger.claim("w2", limit=4)]
    assert len(first) == 4 and len(second) == 4 and not set(first) & set(second)


def test_the_tenants_take_turns_round_the_ring() -> None:
    """30 tenants, each with one chat of 3 jobs enqueued tenant after tenant, so the first
    tenant's head is always the oldest. One slot claims and finishes a job at a time: every
    tenant runs its first job before any runs its second, in the ring's order (the tenants'
    keys, from the one after the last claimed), and round again."""
    tenants = [f"t{i:02d}" for i in range(30)]
    for tenant in tenants:
        flood(tenant, 1, 3)
    order = []
    for _ in range(2 * len(tenants)):
        [job] = ledger.claim("w1", limit=1)
        order.extend(tenants_of([job]))
        ledger.finish(job.lease)
    assert order == tenants + tenants
    assert_mirror_consistent()


def test_the_ring_passes_over_tenants_with_nothing_due() -> None:
    """Ten tenants, the first five with only a head held for an hour: a claim goes round the
    ring past them to the due ones, and back to the ring's start past the ones it runs."""
    for n in range(5):
        ranked(f"t{n}", 0, 0, after=timedelta(hours=1))
    for n in range(5, 10):
        flood(f"t{n}", 1, 2)
    first = ledger.claim("w1", limit=3)
    assert sorted(tenants_of(first)) == ["t5", "t6", "t7"]
    # From t7 on: t8 and t9, then round to t0..t4 (nothing due) and t5..t7 (running, their
    # one chat's next job waits behind it): two heads, not three.
    assert sorted(tenants_of(ledger.claim("w1", limit=3))) == ["t8", "t9"]
    assert ledger.claim("w1", limit=3) == []


def test_urgent_heads_past_a_tenants_bound_still_come_first() -> None:
    """PostgreSQL reads each tenant's heads up to a bound on the claim's last share (here 3
    each); where a head past it would rank in the claim, it reads them all: a tenant whose
    heads are urgent takes every slot (priority first), as with every head ranked."""
    for n in range(10):
        ranked("a", n, 100)
    flood("b", 10, 1)
    flood("c", 10, 1)
    assert tenants_of(ledger.claim("w1", limit=6)) == {"a": 6}


def test_a_tenant_short_of_heads_leaves_its_slots_to_the_others() -> None:
    """Past the bound (4 each here) because one tenant has a single due head: the other
    takes the rest of the claim, none left empty."""
    ledger.enqueue(
        event_id="a-1", event_type="test.noop", partition_key="a", payload={}, tenant="a"
    )
    flood("b", 20, 1)
    assert tenants_of(ledger.claim("w1", limit=6)) == {"a": 1, "b": 5}
