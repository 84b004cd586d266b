"""Schedules on real ``runworker`` processes: every worker ticks, each occurrence is enqueued
and run once, a paused schedule catches up when resumed, bad declarations stop the start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from datetime import datetime, timedelta

import pytest

from feishu_inbox.models import EventJob, Schedule
from feishu_inbox.store import store
from tests.support.processes import ROOT, subprocess_env, wait_for
from tests.support.worker_helpers import Workers

pytestmark = pytest.mark.django_db(transaction=True)

HANDLERS = "tests.support.worker_handlers,tests.support.worker_schedules"
#: Occurrences of the every-second schedule the four workers race for (180: the issue's 3 min).
#: 35 once; 18 catch a tick without its compare-and-set as surely (every occurrence is then
#: enqueued by several workers, from the first one on).
SOAK_SECONDS = int(os.environ.get("SCHEDULE_SOAK_SECONDS", "18"))


def schedule_env(**declaration: object) -> dict[str, str]:
    return {"FEISHU_INBOX_HANDLERS": HANDLERS, "TEST_SCHEDULES": json.dumps([declaration])}


def scheduled(name: str) -> list[EventJob]:
    return list(EventJob.objects.filter(event_type=f"schedule.{name}").order_by("id"))


def seconds(jobs: list[EventJob]) -> list[datetime]:
    return [datetime.fromisoformat(j.payload["occurrence"]) for j in jobs]


def test_four_workers_enqueue_and_run_each_occurrence_exactly_once(workers: Workers) -> None:
    """Four real worker processes tick an every-second schedule; one of them is stopped
    half-way (there is no leader to lose). The suite runs it for about 18 occurrences;
    ``SCHEDULE_SOAK_SECONDS=180`` runs the issue's three minutes (180 occurrences) — the
    property is per occurrence, so the longer run repeats it rather than strengthens it.

    ``run-all`` keeps every occurrence even when a tick comes more than a second late (four
    processes on two cores): the test then sees a gap only if one was really skipped.
    """
    env = schedule_env(name="every_second", cron="* * * * * *", catch_up="run-all")
    procs = [workers.start("--concurrency", "2", "--lease-seconds", "10", **env) for _ in range(4)]
    total = SOAK_SECONDS
    wait_for(lambda: len(scheduled("every_second")) >= total // 2, total + 30, "half of them")
    procs[0].terminate()  # SIGTERM: it drains and exits; the others go on ticking
    assert procs[0].wait(30) == 0
    wait_for(lambda: len(scheduled("every_second")) >= total, total + 30, f"{total} occurrences")
    store().set_schedule_paused("every_second", True)  # no more, from now on
    enqueued = scheduled("every_second")
    wait_for(lambda: not EventJob.objects.unresolved().exists(), 60, "every occurrence to have run")

    occurred = seconds(enqueued)
    first = occurred[0]
    assert occurred == [first + timedelta(seconds=n) for n in range(len(occurred))]  # no gap
    ran = Counter(line[2] for line in workers.lines("ran"))
    assert sorted(ran) == sorted(j.payload["occurrence"] for j in enqueued)
    assert set(ran.values()) == {1}  # each ran exactly once
    assert all(j.status == "completed" and j.attempt == 1 for j in scheduled("every_second"))
    logs = [workers.stderr(p) for p in procs]
    assert not any("was already stored" in log for log in logs)  # the CAS, not the dedupe key
    for log in logs:  # every worker ticked at the occurrences (the first for half): no leader
        assert log.count("schedules ticked at") >= total // 3
    enqueuers = Counter(j.payload["enqueued_by"] for j in enqueued)
    assert len(enqueuers) >= 2, enqueuers  # whoever gets there first enqueues


def test_a_paused_schedule_enqueues_nothing_and_catches_up_when_resumed(
    workers: Workers,
) -> None:
    env = schedule_env(name="pausable", cron="* * * * * *", catch_up="skip")
    workers.start(**env)
    wait_for(lambda: len(scheduled("pausable")) >= 2, 30, "two occurrences")
    store().set_schedule_paused("pausable", True)
    before = scheduled("pausable")
    paused_at = store().now()
    wait_for(lambda: store().now() >= paused_at + timedelta(seconds=4), 10, "4 paused seconds")
    assert scheduled("pausable") == before  # nothing while paused
    store().set_schedule_paused("pausable", False)
    wait_for(
        lambda: any(j.payload["trigger"] == "catch-up" for j in scheduled("pausable")),
        30,
        "the catch-up after resume",
    )
    wait_for(lambda: len(scheduled("pausable")) >= len(before) + 2, 30, "the cadence again")
    after = scheduled("pausable")[len(before) :]
    catch_up = after[0].payload
    assert catch_up["trigger"] == "catch-up" and catch_up["catch_up"] == "skip"
    assert catch_up["missed_since"] == before[-1].payload["occurrence"]
    resumed_after = (paused_at + timedelta(seconds=4)).replace(microsecond=0)
    assert datetime.fromisoformat(catch_up["missed_until"]) >= resumed_after
    assert catch_up["occurrence"] == catch_up["missed_until"]  # only the latest missed one
    assert after[1].payload["trigger"] == "schedule"
    gap = seconds([before[-1], *after])
    assert gap[1] - gap[0] >= timedelta(seconds=4) and gap[2] - gap[1] == timedelta(seconds=1)
    assert not Schedule.objects.get(name="pausable").paused


def test_runworker_refuses_invalid_schedules_listing_every_problem() -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "runworker"],
        cwd=ROOT,
        env=subprocess_env(FEISHU_INBOX_HANDLERS="tests.support.bad_schedules"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    for problem in (
        "bad cron expression '0 9 * *'",
        "unknown time zone 'Mars/Olympus_Mons'",
        "unknown catch_up policy 'sometimes'",
        "max_catch_up must be an integer >= 1 (got 0)",
        "schedule name 'twice' is declared 2 times",
    ):
        assert problem in done.stderr
