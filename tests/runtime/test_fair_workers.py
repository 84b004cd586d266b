"""Fair claims on real workers (issue 53, SPEC §9j), both databases: tenant A's 20,000 jobs
over 500 chats are draining through two workers when tenant B's 200 jobs over 5 chats arrive;
B's last job ends while A still has most of its backlog (the plain claim, oldest head first,
would run B after all of A's), and every chat of both runs in receipt order. How long B's
jobs wait (enqueue to start, p50 and p99) against A's drain, and the throughput beside the
same run without tenants, are figures of ``bench/fair.py``, not of this test.

500 chats, not 50: with 50, the plain claim already serves B before A's backlog is gone (two
workers' claims and buffers hold most of A's 50 heads, so B's heads come into the claim's
window): B's last job ended after 4,607 of A's, against 1,216 with the fair claim. With 500
the plain claim ends B after all 20,000 of A's, and the test tells the two apart by far."""

from __future__ import annotations

import itertools

import pytest
from django.db import transaction

from feishu_inbox import ledger
from feishu_inbox.models import EventJob
from tests.support.processes import wait_for
from tests.support.worker_helpers import Workers

pytestmark = pytest.mark.django_db(transaction=True)

HEAVY, HEAVY_CHATS = 20_000, 500
LIGHT, LIGHT_CHATS = 200, 5


def enqueue(tenant: str, total: int, chats: int) -> list[int]:
    """``total`` no-op jobs of ``tenant`` round-robin over ``chats`` chats, in one commit."""
    with transaction.atomic():
        return [
            ledger.enqueue(
                event_id=f"{tenant}-{n}",
                event_type="test.steps",
                partition_key=f"chat:{tenant}-{n % chats}",
                payload={"steps": []},
                tenant=tenant,
            ).job_id
            for n in range(total)
        ]


def completed(tenant: str) -> int:
    return EventJob.objects.filter(tenant=tenant, status="completed").count()


@pytest.mark.timeout(600)
def test_a_light_tenant_is_served_while_a_heavy_ones_backlog_drains(workers: Workers) -> None:
    enqueue("heavy", HEAVY, HEAVY_CHATS)
    for _ in range(2):
        workers.start("--concurrency", "4")
    wait_for(lambda: completed("heavy") >= 200, 180, "the heavy tenant's backlog to drain")
    light = enqueue("light", LIGHT, LIGHT_CHATS)
    wait_for(
        lambda: completed("light") == LIGHT,
        300,
        "every job of the light tenant",
        seen=lambda: {"light": completed("light"), "heavy": completed("heavy")},
    )
    last = EventJob.objects.filter(pk__in=light).order_by("-finished_at").first()
    assert last is not None and last.finished_at is not None
    heavy_done = EventJob.objects.filter(
        tenant="heavy", status="completed", finished_at__lte=last.finished_at
    ).count()
    # B's 40 jobs a chat, one after another, ran beside A's: A had done a small part of its
    # backlog when B's last one ended (measured on SQLite: 2,315 of 20,000; the plain claim,
    # oldest head first, ran all 20,000 of A's first).
    assert heavy_done < HEAVY / 2, heavy_done
    # Each chat of both in receipt order, one job at a time: a job's handler started after
    # its chat's previous one ended (the handlers' own records, the host's monotonic clock).
    log = workers.log()  # read once: the workers go on with A's backlog meanwhile
    starts = {line[1]: int(line[3]) for line in log if line[0] == "start"}
    ends = {line[1]: int(line[3]) for line in log if line[0] == "end" and line[1] in starts}
    for tenant, total, chats in (("light", LIGHT, LIGHT_CHATS), ("heavy", HEAVY, HEAVY_CHATS)):
        for chat in range(chats):
            ran = [f"{tenant}-{n}" for n in range(chat, total, chats) if f"{tenant}-{n}" in ends]
            for earlier, later in itertools.pairwise(ran):
                assert ends[earlier] < starts[later], (earlier, later)
    assert set(EventJob.objects.filter(pk__in=light).values_list("attempt", flat=True)) == {1}
