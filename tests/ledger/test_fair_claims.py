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


def test_urgent_task_of_a_tenant_past_the_ring_window_limit_1() -> None:
    """A one-slot claim (a slot's finish and claim): B's task at priority 100 comes before
    A's chats and the site's bulk work at -100, though the ring would stop at its first
    tenant: with a priority set the ring goes round every tenant (0040's first version
    stopped)."""
    for n in range(6):
        ranked("", n, -100)
        ranked("a", n, 0)
    urgent = ranked("b", 0, 100)
    [job] = ledger.claim("w1", limit=1)
    assert job.id == urgent, tenants_of([job])


def test_urgent_task_of_a_running_tenant_with_a_higher_share() -> None:
    """No tenant is idle: A runs 1 (next share 2), B runs 2 (next share 3) and has a task at
    priority 100: priority comes before shares, so the one slot is B's task."""
    flood("a", 2, 1)
    assert tenants_of(ledger.claim("w1", limit=1)) == {"a": 1}
    flood("b", 3, 1)
    assert tenants_of(ledger.claim("w1", limit=2, keys=KeyFilter(("chat:b-",)))) == {"b": 2}
    urgent = ranked("b", 0, 100)
    [job] = ledger.claim("w1", limit=1)
    assert job.id == urgent, tenants_of([job])


def test_a_heavier_idle_tenant_past_the_ring_window() -> None:
    """C has weight 3 (first share 1/3), A and B weight 1 (share 1), none runs: C's head
    first, though C is past the ring's first tenant."""
    TenantWeight.objects.create(tenant="c", weight=3)
    flood("a", 2, 1)
    flood("b", 2, 1)
    flood("c", 2, 1)
    assert tenants_of(ledger.claim("w1", limit=1)) == {"c": 1}


def test_light_weights_leave_a_lower_share_its_slot() -> None:
    """A and B weight 0.5 (first share 2), C weight 1 (share 1): a claim of 2 takes C's head
    and one of A's/B's."""
    TenantWeight.objects.create(tenant="a", weight=0.5)
    TenantWeight.objects.create(tenant="b", weight=0.5)
    flood("a", 2, 1)
    flood("b", 2, 1)
    flood("c", 2, 1)
    assert tenants_of(ledger.claim("w1", limit=2))["c"] == 1


def test_tie_between_a_running_and_an_idle_tenant() -> None:
    """A (weight 2) runs 1 job, so its next share is (1 + 1) / 2 = 1; B runs nothing (share
    1). Equal shares: the tenants that run nothing first, on both databases."""
    TenantWeight.objects.create(tenant="a", weight=2)
    flood("a", 3, 1)
    assert tenants_of(ledger.claim("w1", limit=1)) == {"a": 1}
    flood("b", 2, 1)
    assert tenants_of(ledger.claim("w1", limit=1)) == {"b": 1}


def test_tie_between_running_tenants_older_head() -> None:
    """A and B each run 1 chat and have one more due head (B's the older); C runs nothing.
    A claim of 2: C (share 1), then of A and B (share 2 each) the older head, B's (running
    tenants have no place in the ring), on both databases."""
    flood("b", 1, 1, prefix="x")  # b's due head, oldest
    flood("a", 1, 1, prefix="x")
    flood("a", 1, 1, prefix="y")
    flood("b", 1, 1, prefix="y")
    assert tenants_of(ledger.claim("w1", limit=2, keys=KeyFilter(("y:",)))) == {"a": 1, "b": 1}
    flood("c", 1, 1, prefix="x")
    assert tenants_of(ledger.claim("w1", limit=2)) == {"c": 1, "b": 1}


@pytest.mark.usefixtures("postgres_only")
def test_second_claimer_not_empty_while_another_tenants_head_is_free() -> None:
    """A has one due head, B one: W1 holds A's (uncommitted), and W2's one-slot claim, whose
    quota fell on A's, takes B's: never empty while a due head is free."""
    flood("a", 1, 1)
    flood("b", 1, 1)
    with held_open(lambda: [j.id for j in ledger.claim("w1", limit=1)]) as first:
        second = [j.id for j in ledger.claim("w2", limit=1)]
    assert len(first) == 1 and len(second) == 1


def _tenants(n: int) -> list[str]:
    tenants = [f"t{i:02d}" for i in range(n)]
    for r in range(3):  # each tenant one chat of 3 jobs, newest ids in the lowest keys
        for tenant in reversed(tenants):
            ledger.enqueue(
                event_id=f"{tenant}-{r}",
                event_type="test.noop",
                partition_key=f"chat:{tenant}",
                payload={},
                tenant=tenant,
            )
    return tenants


def _tenant(job: ledger.ClaimedJob) -> str:
    return EventJob.objects.get(pk=job.id).tenant


def test_a_slow_slot_does_not_send_the_ring_back() -> None:
    """Four slots claim t00..t03; t00's job is the slowest. Each slot that ends claims one:
    t04, t05, t06, then (t00 ends) t07, not a second job of t01 while t07..t11 wait for their
    first: the ring's cursor is the last claimed of the attempts ended, not the last ended."""
    _tenants(12)
    jobs = {_tenant(j): j for j in ledger.claim("w1", limit=4)}
    assert sorted(jobs) == ["t00", "t01", "t02", "t03"]
    got = []
    for tenant in ["t01", "t02", "t03", "t00"]:
        ledger.finish(jobs[tenant].lease)
        [job] = ledger.claim("w1", limit=1)
        got.append(_tenant(job))
    assert got == ["t04", "t05", "t06", "t07"]


def test_a_batch_of_finishes_does_not_send_the_ring_back() -> None:
    """The same with one batch: four finishes (their history rows written in job order) and
    the claim of four in one statement go on to t04..t07."""
    _tenants(12)
    jobs = {_tenant(j): j for j in ledger.claim("w1", limit=4)}
    finishes = [(jobs[t].lease, "") for t in ["t03", "t02", "t01", "t00"]]
    _, claimed = ledger.finish_batch("w1", finishes, limit=4, token=ledger.new_token())
    assert sorted(_tenant(j) for j in claimed) == ["t04", "t05", "t06", "t07"]


def test_running_tenants_contend_by_their_first_heads_rank() -> None:
    """A and B each run 1 chat and have one more due head (B's the older); nothing idle. A
    one-slot claim takes B's: the running tenants that contend are cut by their first head's
    rank (priority, share, the older head), as the claim ranks them."""
    flood("b", 1, 1, prefix="x")
    flood("a", 1, 1, prefix="x")
    flood("a", 1, 1, prefix="y")
    flood("b", 1, 1, prefix="y")
    assert tenants_of(ledger.claim("w1", limit=2, keys=KeyFilter(("y:",)))) == {"a": 1, "b": 1}
    assert tenants_of(ledger.claim("w1", limit=1)) == {"b": 1}
