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
