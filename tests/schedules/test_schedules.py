"""Schedules (SPEC §8): declarations, in code and in settings, checked at once; cron in time
zones across DST; catch-up with an injected clock (test-only: a worker reads the database's
clock); exactly once under racing ticks; pause, resume and run now."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim
from django.core.checks import run_checks
from django.test import override_settings

from feishu_inbox import schedules
from feishu_inbox.errors import ConfigurationError, InvalidState
from feishu_inbox.models import EventJob, Schedule
from feishu_inbox.runtime import registry
from feishu_inbox.schedules import ScheduleSpec, bisection_bound, scheduler
from feishu_inbox.store import store
from tests.support.schedule_helpers import declare, noop

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
#: The injected clock's start: half a second past noon (a new schedule starts at noon sharp).
T0 = datetime(2026, 5, 4, 12, 0, 0, 500_000, tzinfo=UTC)
NOON = T0.replace(microsecond=0)
pytestdb = pytest.mark.django_db


# --- declaring -----------------------------------------------------------------------------


@pytest.mark.usefixtures("registry")
def test_every_bad_declaration_is_listed_in_one_error() -> None:
    schedules.schedule("0 9 * *")(noop)
    schedules.schedule("0 9 * * *", tz="Mars/Olympus_Mons", catch_up="sometimes")(noop)
    schedules.schedule("0 9 * * *", max_catch_up=0, name="zero")(noop)
    schedules.schedule("0 9 * * *", name="has space")(noop)
    schedules.schedule("0 10 * * *", name="twice")(noop)
    schedules.schedule("0 11 * * *", name="twice")(noop)
    with pytest.raises(ConfigurationError) as raised:
        schedules.validate()
    message = str(raised.value)
    for expected in (
        "bad cron expression '0 9 * *' (Wrong number of fields)",
        "unknown time zone 'Mars/Olympus_Mons'",
        "unknown catch_up policy 'sometimes' (one of skip, run-once, run-all)",
        "max_catch_up must be an integer >= 1 (got 0)",
        "schedule 'has space'",
        "schedule name 'twice' is declared 2 times",
        "feishu_inbox.E004",  # the fix names the system check
    ):
        assert expected in message
    assert list(schedules.declared()) == ["twice"]  # only valid ones; the duplicate is not run
    assert registry.registered()["schedule.twice"] is noop
    assert registry.problems() == []  # the duplicate name is reported once, as a schedule


@pytest.mark.django_db
@pytest.mark.usefixtures("registry")
def test_the_system_check_reports_each_problem_as_e004() -> None:
    schedules.schedule("61 * * * *")(noop)
    schedules.schedule("* * * * *", tz="Nowhere/Special", catch_up="all")(noop)
    found = [m.msg for m in run_checks() if m.id == "feishu_inbox.E004"]
    assert len(found) == 3
    assert "bad cron expression '61 * * * *' (Bad minute)" in found[0]
    assert "unknown time zone 'Nowhere/Special'" in found[1]
    assert "unknown catch_up policy 'all'" in found[2]


@pytest.mark.usefixtures("registry")
def test_the_scheduled_function_is_the_handler_of_its_event_type() -> None:
    @schedules.schedule("0 9 * * 1-5", tz="Asia/Shanghai", partition="digest")
    def digest(event: Any) -> None:
        pass

    spec = schedules.declared()["digest"]
    assert registry.registered()["schedule.digest"] is digest
    assert (spec.tz, spec.catch_up, spec.max_catch_up, spec.partition) == (
        "Asia/Shanghai",
        "skip",
        10,
        "digest",
    )
    assert spec.cron.describe() == "At 09:00 on Monday through Friday"
    assert declare("other").partition == "schedule:other"


@pytest.mark.usefixtures("registry")
def test_a_schedule_has_its_handlers_timeout() -> None:
    @schedules.schedule("* * * * *", timeout=timedelta(seconds=20))
    def tidy(event: Any) -> None:
        pass

    assert registry.timeout_for("schedule.tidy") == 20.0
    assert registry.timeout_for("schedule.other") is None
    registry.handler("test.bad", timeout=-1)(tidy)
    assert any("the timeout for 'test.bad' must be a positive" in p for p in registry.problems())


# --- settings-declared schedules -----------------------------------------------------------


@pytest.mark.usefixtures("registry")
def test_settings_declare_a_schedule_of_a_dotted_path_callable() -> None:
    entry = {
        "cron": "0 3 * * *",
        "tz": "Asia/Shanghai",
        "handler": "tests.support.schedule_helpers.noop",
    }
    with override_settings(
        FEISHU_INBOX={"SCHEDULES": {"nightly": {**entry, "catch_up": "run-all"}}}
    ):
        schedules.load_settings()
    spec = schedules.declared()["nightly"]
    assert (spec.target, spec.catch_up, spec.tz) == (noop, "run-all", "Asia/Shanghai")
    assert registry.registered()["schedule.nightly"] is noop
    assert schedules.problems() == []


@pytest.mark.usefixtures("registry")
def test_settings_declare_a_schedule_of_a_task_run_with_its_own_retry_policy() -> None:
    entries = {
        "report": {"cron": "0 3 * * *", "handler": "tests.support.worker_tasks.nightly_report"},
        "context": {"cron": "0 3 * * *", "handler": "tests.support.worker_tasks.with_context"},
    }
    with override_settings(FEISHU_INBOX={"SCHEDULES": entries}):
        schedules.load_settings()
    assert schedules.problems() == [
        "FEISHU_INBOX[\"SCHEDULES\"]['context']: a scheduled task cannot take a context "
        "(takes_context=True)"
    ]
    assert set(schedules.declared()) == {"report"}
    run = registry.registered()["schedule.report"]
    assert run(None) == "report sent"  # the occurrence's job runs the task itself
    assert registry.policy_for("schedule.report").attempts == 2


@pytest.mark.usefixtures("registry")
def test_bad_settings_schedules_are_listed() -> None:
    bad = {
        "typo": {
            "cron": "0 3 * * *",
            "handler": "tests.support.schedule_helpers.noop",
            "tzz": "UTC",
        },
        "nothing": {"cron": "0 3 * * *"},
        "missing": {"cron": "0 3 * * *", "handler": "tests.no_such_module.fn"},
        "late": {"cron": "0 25 * * *", "handler": "tests.support.schedule_helpers.noop"},
        "list": ["0 3 * * *"],
    }
    with override_settings(FEISHU_INBOX={"SCHEDULES": bad}):
        schedules.load_settings()
    found = " | ".join(schedules.problems())
    assert "['typo']: unknown keys ['tzz']" in found
    assert "['nothing']: missing ['handler']" in found
    assert "'tests.no_such_module.fn' cannot be imported" in found
    assert "bad cron expression '0 25 * * *' (Bad hour)" in found
    assert "['list'] must be a dict" in found
    assert schedules.declared() == {}


# --- cron in time zones, across DST ---------------------------------------------------------


def walk(cron: str, zone: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
    spec = schedules.Cron(cron, zone)
    found, moment = [], start
    while (moment := spec.after(moment)) is not None and moment <= end:
        found.append(moment)
    return found


def local(moments: list[datetime], zone: ZoneInfo = BERLIN) -> list[str]:
    return [m.astimezone(zone).strftime("%m-%d %H:%M%z") for m in moments]


def test_spring_forward_a_0230_job_runs_once_at_0300_that_day() -> None:
    # Europe/Berlin, 29 March 2026: 02:00 CET becomes 03:00 CEST; 02:30 does not exist.
    days = walk(
        "30 2 * * *",
        BERLIN,
        datetime(2026, 3, 27, 12, tzinfo=UTC),
        datetime(2026, 3, 31, tzinfo=UTC),
    )
    assert local(days) == ["03-28 02:30+0100", "03-29 03:00+0200", "03-30 02:30+0200"]


def test_autumn_repeated_hour_a_fixed_time_runs_once_a_frequent_job_in_both_passes() -> None:
    # Europe/Berlin, 25 October 2026: 03:00 CEST becomes 02:00 CET; 02:00-02:59 happens twice.
    start, end = datetime(2026, 10, 24, 12, tzinfo=UTC), datetime(2026, 10, 26, 12, tzinfo=UTC)
    assert local(walk("30 2 * * *", BERLIN, start, end)) == [
        "10-25 02:30+0200",  # the first pass only
        "10-26 02:30+0100",
    ]
    quarter = walk(
        "*/15 * * * *",
        BERLIN,
        datetime(2026, 10, 24, 23, 50, tzinfo=UTC),
        datetime(2026, 10, 25, 2, 0, tzinfo=UTC),
    )
    assert local(quarter) == [
        "10-25 02:00+0200", "10-25 02:15+0200", "10-25 02:30+0200", "10-25 02:45+0200",
        "10-25 02:00+0100", "10-25 02:15+0100", "10-25 02:30+0100", "10-25 02:45+0100",
        "10-25 03:00+0100",
    ]  # fmt: skip


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York"])
@pytest.mark.parametrize("cron", ["30 2 * * *", "*/15 * * * *", "0 * * * *", "15 1-3 * * *"])
@pytest.mark.parametrize("day", ["2026-03-08", "2026-03-29", "2026-10-25", "2026-11-01"])
def test_after_is_the_first_occurrence_strictly_after_any_instant(
    zone: str, cron: str, day: str
) -> None:
    """The bisection relies on it: from every instant of a DST day, in either pass of a
    repeated hour, ``after`` is the first occurrence of the forward walk that follows."""
    tz = ZoneInfo(zone)
    start = datetime.fromisoformat(day).replace(tzinfo=UTC) - timedelta(hours=12)
    end = start + timedelta(hours=48)
    sequence = []  # cronsim's own forward walk from the day before, as UTC instants
    for found in CronSim(cron, (start - timedelta(days=1)).astimezone(tz)):
        if (instant := found.astimezone(UTC)) > end + timedelta(days=1):
            break
        sequence.append(instant)
    assert sequence == sorted(sequence)  # it never goes back; it may repeat an instant
    probe = schedules.Cron(cron, tz)
    moment = start
    while moment < end:
        expected = next(s for s in sequence if s > moment)
        assert probe.after(moment) == expected, moment
        moment += timedelta(minutes=7, seconds=13)


# --- the ledger's side: jobs and watermarks ------------------------------------------------


def jobs(name: str) -> list[EventJob]:
    return list(EventJob.objects.filter(event_type=f"schedule.{name}").order_by("id"))


def occurrences(name: str) -> list[str]:
    return [j.payload["occurrence"] for j in jobs(name)]


def watermark(name: str) -> datetime:
    return Schedule.objects.get(name=name).watermark


def minute(n: int) -> str:
    """The ISO name of the occurrence n minutes after noon."""
    return scheduler.iso(NOON + timedelta(minutes=n))


# --- catch-up after downtime, with an injected clock ------------------------------------------


def downtime(spec: ScheduleSpec, hours: int = 3) -> datetime:
    """Tick at noon (the schedule starts) and at 12:01 (one job), then stay down ``hours``:
    returns the clock of the first tick after the downtime (15:01:00.5 for 3 hours)."""
    assert scheduler.tick(now=T0, specs=[spec]).fired == []
    assert [
        f.occurrences for f in scheduler.tick(now=T0 + timedelta(minutes=1), specs=[spec]).fired
    ] == [(NOON + timedelta(minutes=1),)]
    spec.cron.evaluations = 0
    return T0 + timedelta(hours=hours, minutes=1)


@pytestdb
@pytest.mark.usefixtures("registry")
def test_skip_enqueues_only_the_latest_missed_occurrence_in_log_gap_evaluations() -> None:
    spec = declare("skipper", catch_up="skip")
    now = downtime(spec)  # 180 occurrences missed: 12:02 … 15:01
    ticked = scheduler.tick(now=now, specs=[spec])
    evaluations = spec.cron.evaluations
    assert occurrences("skipper") == [minute(1), minute(181)]
    assert ticked.fired[0].trigger == "catch-up" and ticked.next_at == NOON + timedelta(minutes=182)
    gap = now - (NOON + timedelta(minutes=1))
    assert evaluations <= bisection_bound(gap) == 17  # walking the gap would take 181
    caught_up = jobs("skipper")[-1].payload
    assert (caught_up["missed_since"], caught_up["missed_until"]) == (minute(1), minute(181))
    assert watermark("skipper") == NOON + timedelta(minutes=181)

    # Thirty days down costs a handful more lookups, not 43,200 more.
    spec.cron.evaluations = 0
    month = now + timedelta(days=30)
    scheduler.tick(now=month, specs=[spec])
    assert spec.cron.evaluations <= bisection_bound(month - now)
    assert spec.cron.evaluations - evaluations <= 9  # log2(30 days / 3 hours) = 7.9
    assert occurrences("skipper")[-1] == scheduler.iso(month.replace(second=0, microsecond=0))


@pytestdb
@pytest.mark.usefixtures("registry")
def test_run_once_enqueues_one_job_for_the_gap_then_keeps_the_cadence() -> None:
    spec = declare("once", catch_up="run-once")
    now = downtime(spec)
    scheduler.tick(now=now, specs=[spec])
    assert spec.cron.evaluations <= bisection_bound(now - (NOON + timedelta(minutes=1)))
    assert occurrences("once") == [minute(1), minute(2)]  # the first missed, standing for all
    assert jobs("once")[-1].payload["missed_until"] == minute(181)
    assert watermark("once") == NOON + timedelta(minutes=181)
    assert scheduler.tick(now=now + timedelta(seconds=20), specs=[spec]).fired == []
    scheduler.tick(now=now + timedelta(minutes=1), specs=[spec])
    assert occurrences("once")[-1] == minute(182)
    assert jobs("once")[-1].payload["trigger"] == "schedule"


@pytestdb
@pytest.mark.usefixtures("registry")
def test_run_all_enqueues_at_most_max_catch_up_per_tick_then_the_rest() -> None:
    spec = declare("all", catch_up="run-all", max_catch_up=10)
    now = downtime(spec)
    per_tick, marks = [], [watermark("all")]
    while (ticked := scheduler.tick(now=now, specs=[spec])).fired:
        per_tick.append(len(ticked.fired[0].occurrences))
        marks.append(watermark("all"))
        assert ticked.next_at is not None
    assert per_tick == [10] * 18  # 180 missed occurrences, ten a tick
    assert marks == sorted(set(marks))  # forward only, every tick
    assert occurrences("all") == [minute(n) for n in range(1, 182)]
    ids = [j.id for j in jobs("all")]
    assert ids == sorted(ids)  # one partition, in occurrence order
    assert {j.partition_key for j in jobs("all")} == {"schedule:all"}


@pytestdb
@pytest.mark.usefixtures("registry")
def test_the_watermark_never_moves_backwards() -> None:
    spec = declare("forward")
    scheduler.tick(now=T0, specs=[spec])
    scheduler.tick(now=T0 + timedelta(minutes=5), specs=[spec])
    mark = watermark("forward")
    assert (
        scheduler.tick(now=T0 + timedelta(minutes=2), specs=[spec]).fired == []
    )  # the clock went back
    assert watermark("forward") == mark
    earlier = mark - timedelta(minutes=1)
    assert not store().advance_schedule("forward", old=mark, new=earlier, now=T0)
    assert not store().advance_schedule(
        "forward", old=earlier, new=mark + timedelta(minutes=1), now=T0
    )
    assert watermark("forward") == mark


# --- exactly once, whoever ticks -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("registry", "close_thread_connections")
def test_racing_ticks_enqueue_each_occurrence_once() -> None:
    """Eight threads (eight connections) tick the same schedule at the same instant, twenty
    times over: each occurrence is enqueued by exactly one of them, the rest enqueue nothing."""
    spec = declare("raced", catch_up="run-all")
    scheduler.tick(now=T0, specs=[spec])
    threads = 8

    def race(now: datetime, barrier: threading.Barrier, results: list[Any]) -> None:
        from django.db import connection

        try:
            barrier.wait(10)
            results.append(scheduler.tick(now=now, specs=[spec]))
        except BaseException as exc:  # reported by the test's thread
            results.append(exc)
        finally:
            connection.close()

    for n in range(1, 21):
        barrier, results = threading.Barrier(threads), []
        now = T0 + timedelta(minutes=n)
        running = [
            threading.Thread(target=race, args=(now, barrier, results)) for _ in range(threads)
        ]
        for t in running:
            t.start()
        for t in running:
            t.join(30)
        assert all(isinstance(r, scheduler.TickResult) for r in results), results
        assert len(results) == threads
        assert sum(len(r.fired) for r in results) == 1, n
    assert occurrences("raced") == [minute(n) for n in range(1, 21)]


# --- operators -------------------------------------------------------------------------------


@pytestdb
@pytest.mark.usefixtures("registry")
def test_a_paused_schedule_enqueues_nothing_and_when_resumed_applies_its_catch_up() -> None:
    spec = declare("paused", catch_up="skip")
    scheduler.tick(now=T0)
    assert scheduler.pause(["paused"]).done == ["paused"]
    for later in (timedelta(minutes=1), timedelta(minutes=30), timedelta(hours=2)):
        ticked = scheduler.tick(now=T0 + later)
        assert (ticked.fired, ticked.next_at) == ([], None)
    assert jobs("paused") == [] and watermark("paused") == NOON
    again = scheduler.pause(["paused", "unknown"])
    assert isinstance(again.refused["paused"], InvalidState)
    assert "already paused" in again.refused["paused"].message
    assert "no schedule of that name" in again.refused["unknown"].message

    assert scheduler.resume(["paused"]).done == ["paused"]
    spec.cron.evaluations = 0
    scheduler.tick(now=T0 + timedelta(hours=2))
    assert occurrences("paused") == [minute(120)]  # skip: only the latest missed
    assert jobs("paused")[0].payload["missed_since"] == scheduler.iso(NOON)
    assert spec.cron.evaluations <= bisection_bound(timedelta(hours=2))
    assert "not paused" in scheduler.resume(["paused"]).refused["paused"].message


@pytestdb
@pytest.mark.usefixtures("registry")
def test_run_now_enqueues_one_job_outside_the_cadence_even_when_paused() -> None:
    declare("manual", "0 9 * * *")
    scheduler.tick(now=T0)
    mark = watermark("manual")
    scheduler.pause(["manual"])
    outcome = scheduler.run_now(["manual", "ghost"], by="alice")
    (job,) = jobs("manual")
    assert outcome.done == ["manual"] and outcome.job_ids == {"manual": job.pk}
    assert "no schedule of that name" in outcome.refused["ghost"].message
    assert (job.payload["trigger"], job.payload["requested_by"]) == ("run-now", "alice")
    assert job.partition_key == "schedule:manual" and job.status == "queued"
    row = Schedule.objects.get(name="manual")
    assert (row.watermark, row.last_job_id, row.paused) == (mark, job.pk, True)


@pytestdb
@pytest.mark.usefixtures("registry")
def test_overview_names_next_and_last_occurrence_and_the_last_jobs_state() -> None:
    declare("view", "0 9 * * 1-5", tz="Asia/Shanghai")
    scheduler.tick(now=T0)  # a Monday, 20:00 in Shanghai
    scheduler.run_now(["view"])
    (view,) = scheduler.overview()
    data = view.as_dict()
    assert data["description"] == "At 09:00 on Monday through Friday"
    assert data["next_occurrence_local"] == "2026-05-05T09:00:00+08:00"
    assert (data["last_job_status"], data["paused"], data["declared"]) == ("queued", False, True)
