"""Running the schedules (SPEC §8): the tick every worker makes, and the operators' actions.

A tick reads the declared schedules' watermarks, asks ``schedules.plan`` what is due by the
database's clock, and for each schedule with something due runs one transaction:

1. compare-and-set the watermark, from the value the tick read to the last occurrence due
   (``advance_schedule``); it never moves backwards, nor while the schedule is paused;
2. ``ledger.enqueue`` each occurrence as a job of type ``schedule.<name>`` with the dedupe key
   ``schedule:<name>:<occurrence, ISO 8601 in UTC>``;
3. record that job as the schedule's last.

Every running worker ticks at each occurrence; there is no leader. Of the workers that read
one watermark, exactly one moves it (PostgreSQL: the others wait on the row's lock, then match
nothing; SQLite: one writer at a time) and enqueues, in the same transaction, the occurrences
it covers; the others enqueue nothing. Each occurrence lies in exactly one step of the
watermark, so it is enqueued once; the dedupe key would refuse a second copy anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..errors import InvalidState, LedgerError, ScheduleNotFound
from ..ledger import schedules as rows
from ..ledger.schedules import Row
from ..models import EventJob, Schedule
from . import Plan, ScheduleSpec, declared, plan

log = logging.getLogger("feishu_inbox.schedules")

#: The job's ``trigger`` for an operator's "run now" (beside ``schedule`` and ``catch-up``).
RUN_NOW = "run-now"


def iso(moment: datetime) -> str:
    """An instant as the ledger names it: ISO 8601 in UTC, to the second."""
    return moment.astimezone(timezone.utc).replace(microsecond=0).isoformat()


def dedupe_key(name: str, occurrence: datetime) -> str:
    return f"schedule:{name}:{iso(occurrence)}"


# --- the tick --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fired:
    """What one tick enqueued for one schedule."""

    name: str
    occurrences: tuple[datetime, ...]
    job_ids: tuple[int, ...]
    trigger: str


@dataclass(frozen=True)
class TickResult:
    now: datetime
    fired: list[Fired] = field(default_factory=list)
    #: Schedules whose watermark another worker moved first: this one enqueued nothing.
    lost: list[str] = field(default_factory=list)
    #: The earliest occurrence not yet enqueued of any schedule that is not paused (in the
    #: past or now: the next tick is due at once).
    next_at: datetime | None = None

    def seconds_until_next(self) -> float | None:
        return None if self.next_at is None else (self.next_at - self.now).total_seconds()


def tick(
    *,
    now: datetime | None = None,
    specs: Iterable[ScheduleSpec] | None = None,
    worker_id: str = "",
) -> TickResult:
    """Enqueue what is due of the declared schedules (or ``specs``), each in one transaction.

    ``now`` is the database's clock unless given (tests inject a clock; a worker never does).
    """
    chosen = list(declared().values() if specs is None else specs)
    now = rows.now() if now is None else now
    if not chosen:
        return TickResult(now)
    states = _states([s.name for s in chosen], now)
    fired: list[Fired] = []
    lost: list[str] = []
    following: list[datetime] = []
    for spec in chosen:
        state = states[spec.name]
        if state["paused"]:
            continue
        planned = plan(spec, state["watermark"], now)
        if planned.occurrences:
            job_ids = _fire(spec, state["watermark"], planned, now, worker_id)
            if job_ids is None:
                log.debug(
                    "schedule %s: another worker moved it first (or it was paused)", spec.name
                )
                lost.append(spec.name)
                following.append(now)  # read its new watermark at once
                continue
            occurrences = tuple(planned.occurrences)
            fired.append(Fired(spec.name, occurrences, tuple(job_ids), planned.trigger))
            log.info(
                "schedule %s: enqueued %s (%s) as job %s",
                spec.name,
                ", ".join(iso(o) for o in planned.occurrences),
                planned.trigger,
                ", ".join(map(str, job_ids)) or "- (already stored)",
            )
        if planned.next_at is not None:
            following.append(planned.next_at)
    return TickResult(now, fired, lost, min(following, default=None))


def _states(names: list[str], now: datetime) -> dict[str, Row]:
    return rows.states(names, now)


def _fire(
    spec: ScheduleSpec, old: datetime, planned: Plan, now: datetime, worker_id: str
) -> list[int] | None:
    """Move the watermark and enqueue the planned occurrences, in one transaction; None when
    another worker moved the watermark first (or the schedule was paused meanwhile)."""
    jobs = []
    for occurrence in planned.occurrences:
        payload = _payload(spec, occurrence, planned.trigger, worker_id)
        if planned.missed_until is not None:  # a catch-up: which gap it stands for
            payload.update(
                catch_up=spec.catch_up,
                missed_since=iso(old),
                missed_until=iso(planned.missed_until),
            )
        jobs.append(_job(spec, dedupe_key(spec.name, occurrence), payload))
    stored = rows.advance(spec.name, old=old, new=planned.watermark, now=now, jobs=jobs)
    if stored is None:
        return None
    for occurrence, one in zip(planned.occurrences, stored, strict=True):
        if not one.created:  # the watermark says it was never enqueued: this should not happen
            log.warning(
                "schedule %s: occurrence %s was already stored as job %s",
                spec.name,
                iso(occurrence),
                one.job_id,
            )
    return [one.job_id for one in stored if one.created]


def _payload(spec: ScheduleSpec, occurrence: datetime, trigger: str, by: str) -> dict[str, Any]:
    return {
        "schedule": spec.name,
        "occurrence": iso(occurrence),
        "local_time": spec.cron.local(occurrence).replace(microsecond=0).isoformat(),
        "time_zone": spec.tz,
        "trigger": trigger,
        "enqueued_by": by,
    }


def _job(spec: ScheduleSpec, key: str, payload: dict[str, Any]) -> rows.Occurrence:
    return rows.Occurrence(key, spec.event_type, spec.partition, payload, tenant=spec.tenant)


# --- operators -------------------------------------------------------------------------------


@dataclass
class ScheduleOutcome:
    """Per-schedule result of an operator action over several schedules."""

    done: list[str] = field(default_factory=list)
    refused: dict[str, LedgerError] = field(default_factory=dict)
    #: run now: the job each schedule got.
    job_ids: dict[str, int] = field(default_factory=dict)


def _not_declared(name: str, doing: str) -> ScheduleNotFound:
    return ScheduleNotFound(
        f"Cannot {doing} schedule {name!r}: no schedule of that name is declared."
    )


def pause(names: Iterable[str]) -> ScheduleOutcome:
    """Pause schedules: no occurrence is enqueued until they are resumed."""
    return _set_paused(names, paused=True)


def resume(names: Iterable[str]) -> ScheduleOutcome:
    """Resume paused schedules; the occurrences missed meanwhile go by their catch-up policy."""
    return _set_paused(names, paused=False)


def _set_paused(names: Iterable[str], *, paused: bool) -> ScheduleOutcome:
    doing = "pause" if paused else "resume"
    known = declared()
    wanted = list(dict.fromkeys(names))
    outcome = ScheduleOutcome()
    present = [n for n in wanted if n in known]
    if present:
        _states(present, rows.now())  # a schedule nothing looked at yet gets its row
    for name in wanted:
        if name not in known:
            outcome.refused[name] = _not_declared(name, doing)
        elif rows.set_paused(name, paused):
            outcome.done.append(name)
        else:
            outcome.refused[name] = InvalidState(
                f"Cannot {doing} schedule {name!r}: it is {'already' if paused else 'not'} paused.",
                fix="Nothing to do." if paused else "Only a paused schedule can be resumed.",
            )
    return outcome


def run_now(names: Iterable[str], *, by: str = "") -> ScheduleOutcome:
    """Enqueue one job of each schedule now, outside its cadence (the watermark stays): an
    operator's "run now", also while it is paused. ``by`` names who asked."""
    known = declared()
    outcome = ScheduleOutcome()
    for name in dict.fromkeys(names):
        spec = known.get(name)
        if spec is None:
            outcome.refused[name] = _not_declared(name, "run")
            continue

        def job_at(now: datetime, spec: ScheduleSpec = spec, name: str = name) -> rows.Occurrence:
            payload = {**_payload(spec, now, RUN_NOW, ""), "requested_by": by}
            return _job(spec, f"schedule:{name}:{RUN_NOW}:{now.isoformat()}", payload)

        stored = rows.enqueue_now(name, job_at)
        if stored.created:
            outcome.done.append(name)
            outcome.job_ids[name] = stored.job_id
        else:
            outcome.refused[name] = InvalidState(
                f"Cannot run schedule {name!r} now: job {stored.job_id} was asked for at the "
                "same instant.",
                fix="It runs already; look at that job.",
            )
    return outcome


# --- what operators see ------------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleView:
    """One schedule as the admin and ``inbox schedules`` show it."""

    name: str
    #: None: the row of a schedule no longer declared (it never fires).
    spec: ScheduleSpec | None
    watermark: datetime
    paused: bool
    last_fired_at: datetime | None
    last_job_id: int | None
    #: The last job's state; None when there is none, or retention purged it.
    last_job_status: str | None

    @property
    def next_at(self) -> datetime | None:
        """The next occurrence to enqueue (in the past: no worker is running); None when
        paused or no longer declared."""
        if self.spec is None or self.paused:
            return None
        return self.spec.cron.after(self.watermark)

    def as_dict(self) -> dict[str, Any]:
        spec = self.spec
        next_at = self.next_at
        return {
            "name": self.name,
            "declared": spec is not None,
            "cron": spec.expression if spec else None,
            "description": spec.cron.describe() if spec else None,
            "time_zone": spec.tz if spec else None,
            "catch_up": spec.catch_up if spec else None,
            "max_catch_up": spec.max_catch_up if spec else None,
            "partition": spec.partition if spec else None,
            "paused": self.paused,
            "watermark": iso(self.watermark),
            "next_occurrence": iso(next_at) if next_at else None,
            "next_occurrence_local": spec.cron.local(next_at).isoformat()
            if spec and next_at
            else None,
            "last_fired_at": self.last_fired_at.isoformat() if self.last_fired_at else None,
            "last_job_id": self.last_job_id,
            "last_job_status": self.last_job_status,
        }


def ensure_rows() -> None:
    """Give every declared schedule its row (its watermark starts when first seen)."""
    names = list(declared())
    if names:
        _states(names, rows.now())


def overview() -> list[ScheduleView]:
    """Every declared schedule, and the rows of those no longer declared, by name."""
    ensure_rows()
    specs = declared()
    rows = list(Schedule.objects.order_by("name"))
    job_ids = [r.last_job_id for r in rows if r.last_job_id is not None]
    statuses = dict(EventJob.objects.filter(pk__in=job_ids).values_list("pk", "status"))
    return [
        ScheduleView(
            name=r.name,
            spec=specs.get(r.name),
            watermark=r.watermark,
            paused=r.paused,
            last_fired_at=r.last_fired_at,
            last_job_id=r.last_job_id,
            last_job_status=statuses.get(r.last_job_id) if r.last_job_id else None,
        )
        for r in rows
    ]
