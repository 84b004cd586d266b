"""Durable waits on real ``runworker`` processes, killed with SIGKILL (SPEC §9e, invariant 8):
every waiting job resumes exactly once with its payload, the step before its wait runs once
and the effect after it once, and waiting jobs hold no slot."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter

import pytest
from django.db import transaction

import feishu_inbox
from feishu_inbox import ledger
from feishu_inbox.models import EventJob
from feishu_inbox.waiting import Wait
from tests.support.processes import wait_for
from tests.support.worker_helpers import Workers, enqueue

pytestmark = pytest.mark.django_db(transaction=True)

WAITERS, SLEEPERS, EARLY, IDLE = 200, 100, 50, 700


def count(**where: object) -> int:
    return EventJob.objects.filter(**where).count()


def test_a_thousand_waiting_jobs_hold_no_slot_and_each_resumes_once_across_kills(
    workers: Workers,
) -> None:
    # Signals sent before their waiters wait are kept for them.
    for i in range(EARLY):
        assert feishu_inbox.signal(f"k{i}", {"n": i}).kept
    waiter_ids = {
        enqueue(f"w{i}", ["step:before", f"wait:k{i}", "effect"], partition=f"w-{i}"): i
        for i in range(WAITERS)
    }
    for i in range(SLEEPERS):
        enqueue(f"s{i}", ["step:before", "sleep:2", "effect"], partition=f"s-{i}")
    idle = [
        enqueue(f"i{i}", [f"wait:never-{i}"], partition=f"i-{i}") for i in range(IDLE)
    ]  # they wait until an operator cancels them

    first = workers.start("--concurrency", "2", "--lease-seconds", "2")
    wait_for(
        lambda: (
            count(event_id__startswith="w", status="waiting") == WAITERS - EARLY
            and count(event_id__startswith="i", status="waiting") == IDLE
        ),
        180,
        "every waiter without a kept signal to wait",
        seen=lambda: Counter(EventJob.objects.values_list("status", flat=True)),
    )
    os.kill(first.pid, signal.SIGKILL)  # killed while a thousand jobs wait
    first.wait(10)

    # A worker of two slots serves other chats while those jobs wait: they hold none.
    others = [enqueue(f"o{i}", [], partition=f"o-{i}") for i in range(20)]
    second = workers.start("--concurrency", "2", "--lease-seconds", "2")
    wait_for(lambda: count(id__in=others, status="completed") == 20, 60, "the other chats' jobs")
    assert count(event_id__startswith="i", status="waiting") == IDLE

    with transaction.atomic():  # the late signals, committed together
        for i in range(EARLY, WAITERS):
            feishu_inbox.signal(f"k{i}", {"n": i})
    wait_for(lambda: len(workers.lines("waited")) >= EARLY + 30, 60, "some late waiters resumed")
    os.kill(second.pid, signal.SIGKILL)  # killed while jobs resume
    second.wait(10)
    workers.start("--concurrency", "2", "--lease-seconds", "2")

    def settled() -> bool:
        return (
            count(status__in=["queued", "running", "retry_wait"]) == 0
            and count(id__in=list(waiter_ids), status="waiting") == 0
            and count(event_id__startswith="s", status="waiting") == 0
        )

    wait_for(settled, 180, "every waiter and sleeper to end")
    assert ledger.cancel(idle).done == idle  # an operator ends the idle ones

    statuses = dict(EventJob.objects.values_list("event_id", "status"))
    unknown = {e for e, s in statuses.items() if s == "unknown"}
    # Only a job killed after its effect began (inside it, or after it while its finish waited
    # for its batch's commit) may end unknown: its effect is never repeated.
    assert len(unknown) < WAITERS // 10, unknown
    assert all(
        EventJob.objects.get(event_id=e).error_type == "LeaseExpiredAfterSideEffect"
        for e in unknown
    )
    assert {s for e, s in statuses.items() if e not in unknown} == {"completed"}

    # Each wait resolved once: delivered with its own payload, or timed out (the sleeps).
    waits = {w.job_id: w for w in Wait.objects.all()}
    for job_id, i in waiter_ids.items():
        assert (waits[job_id].state, waits[job_id].payload) == ("delivered", {"n": i})
    assert Counter(w.state for w in waits.values()) == Counter(
        delivered=WAITERS, timed_out=SLEEPERS, cancelled=IDLE
    )
    # The step before each wait ran once; the effect after it once (at most once when killed
    # inside it); every resumed run got its own payload.
    ran = Counter(line[1] for line in workers.lines("ran"))
    effects = Counter(line[1] for line in workers.lines("effect"))
    for event_id in [f"w{i}" for i in range(WAITERS)] + [f"s{i}" for i in range(SLEEPERS)]:
        assert ran[event_id] == 1, event_id
        assert effects[event_id] == 1 or (event_id in unknown and effects[event_id] == 0)
    for line in workers.lines("waited"):
        if line[1].startswith("w"):
            assert json.loads(line[2]) == {"n": int(line[1][1:])}
    assert {line[1] for line in workers.lines("waited") if line[1].startswith("w")} == {
        f"w{i}" for i in range(WAITERS)
    }
