"""Starting, pausing, resuming and cancelling backfills, and what operators read of them:
progress (rows done, the estimate of the total, rate, ETA), stalls, and the deploy gate's
list of what is still pending. Every call is one transaction; a refused one changes nothing.

A run is a job of the ledger (``running.py``) in the partition ``backfill:<name>``, so one
job of a backfill runs at a time; pausing or cancelling changes the row, and its job stops
before its next batch. Resuming enqueues a new job that goes on from the cursor.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, router, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.recorder import MigrationRecorder
from django.utils import timezone

from ..conf import checked_settings
from ..ledger import rules as ledger
from ..tables.backfills import Backfill, BackfillState
from .declared import BackfillSpec, declared, get
from .gate import RequireBackfill, holds
from .refusals import (
    BackfillApplied,
    BackfillEnvironment,
    BackfillError,
    BackfillMigrationPending,
    BackfillPending,
    BackfillRunning,
    BackfillStalled,
    BackfillUnknown,
)

#: The ledger's app, event type prefix and partition prefix of backfill jobs.
APP = "backfills"
PREFIX = "backfill:"
#: A backfill's job is never failed for its attempts: a worker killed mid-batch leaves the
#: cursor at the last commit, and the next attempt goes on from it.
ATTEMPTS = 1_000_000
LIVE = (BackfillState.RUNNING, BackfillState.PAUSED)


@dataclass(frozen=True)
class Progress:
    """A backfill as operators read it (admin, CLI, metrics)."""

    name: str
    state: str
    declared: bool
    rows_done: int
    total_estimate: int | None
    rate: float
    eta_seconds: float | None
    stalled: bool
    run: int
    started_at: datetime | None
    last_batch_at: datetime | None
    finished_at: datetime | None
    environment: str
    error: str

    def as_dict(self) -> dict[str, Any]:
        return {
            k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in self.__dict__.items()
        }


def spec_of(name: str) -> BackfillSpec:
    spec = get(name)
    if spec is None:
        raise BackfillUnknown(f"No backfill named {name!r} is declared.")
    return spec


def applied_migrations(alias: str = DEFAULT_DB_ALIAS) -> set[tuple[str, str]]:
    return set(MigrationRecorder(connections[alias]).applied_migrations())


def check_environment(spec: BackfillSpec, row: Backfill | None) -> str:
    """The environment these settings mark; ``BackfillEnvironment`` when it is not the one
    the backfill is declared for, or not the one it was started in on this database."""
    here = checked_settings().ENVIRONMENT
    if spec.environments and here not in spec.environments:
        raise BackfillEnvironment(
            f"Backfill {spec.name!r} runs in {', '.join(spec.environments)}; these settings "
            f"mark {here or 'no environment'} (FEISHU_INBOX['ENVIRONMENT'])."
        )
    if row is not None and row.environment and row.environment != here:
        raise BackfillEnvironment(
            f"Backfill {spec.name!r} was started in {row.environment!r} on this database; "
            f"these settings mark {here or 'no environment'} (FEISHU_INBOX['ENVIRONMENT'])."
        )
    return here


def check_migration(spec: BackfillSpec) -> None:
    if spec.after is not None and spec.after not in applied_migrations():
        app, migration = spec.after
        raise BackfillMigrationPending(
            f"Backfill {spec.name!r} needs migration {app}.{migration}, which is not applied.",
            fix=f"Apply it first (`manage.py migrate {app} {migration}`), then start the backfill.",
        )


def estimate(spec: BackfillSpec) -> int | None:
    """The rows the backfill walks (``estimate_rows``)."""
    return estimate_rows(spec.queryset())


def estimate_rows(queryset: Any) -> int | None:
    """The rows of a queryset: the planner's estimate on PostgreSQL (no scan of a big table),
    a count elsewhere; None when neither can be read."""
    with contextlib.suppress(Exception):  # a planner that explains in JSON (PostgreSQL's)
        plan = json.loads(queryset.explain(format="json"))  # estimates without a scan
        return int(plan[0]["Plan"]["Plan Rows"])
    try:  # another database (SQLite explains in text only): a count
        return int(queryset.count())
    except Exception:  # an estimate is a nicety: a backfill starts without one
        return None


def _enqueue(row: Backfill) -> None:
    row.job_id = ledger.enqueue(
        event_id=f"{PREFIX}{row.name}:{row.run}:{row.segment}",
        event_type=f"{PREFIX}{row.name}",
        partition_key=f"{PREFIX}{row.name}",
        payload={"backfill": row.name, "run": row.run},
        app=APP,
        max_attempts=ATTEMPTS,
    ).job_id
    Backfill.objects.filter(pk=row.pk).update(job_id=row.job_id)


def start(name: str, *, force: bool = False) -> Progress:
    """Start backfill ``name`` from its first row. Refused while it runs or is paused
    (``backfill_running``), once applied unless ``force`` (``backfill_applied``), before the
    migration it needs (``backfill_migration_pending``), and in another environment."""
    spec = spec_of(name)
    check_migration(spec)
    total = estimate(spec)
    now = timezone.now()
    stall = spec.stall_seconds or checked_settings().BACKFILL_STALL_SECONDS
    with transaction.atomic():
        row = Backfill.objects.select_for_update().filter(name=name).first()
        environment = check_environment(spec, row)
        if row is not None and row.state in LIVE:
            raise BackfillRunning(
                f"Backfill {name!r} is {row.state} (run {row.run}, {row.rows_done} rows done).",
            )
        if row is not None and row.state == BackfillState.APPLIED and not force:
            raise BackfillApplied(f"Backfill {name!r} was applied at {row.finished_at}.")
        fields = {
            "state": BackfillState.RUNNING,
            "segment": 1,
            "cursor": None,
            "batches": 0,
            "rows_done": 0,
            "total_estimate": total,
            "rate": 0.0,
            "stall_seconds": stall,
            "environment": environment,
            "forced": force and row is not None,
            "error": "",
            "started_at": now,
            "resumed_at": now,
            "batch_started_at": None,
            "last_batch_at": None,
            "finished_at": None,
        }
        if row is None:
            row = Backfill.objects.create(name=name, run=1, **fields)
        else:
            for key, value in fields.items():
                setattr(row, key, value)
            row.run += 1
            row.save()
        _enqueue(row)
    return progress(row)


def pause(name: str) -> Progress:
    """Pause a running backfill: its job stops before its next batch; the cursor stays."""
    return _move(name, BackfillState.PAUSED, (BackfillState.RUNNING,), "pause")


def cancel(name: str) -> Progress:
    """Cancel a running, paused or failed backfill: its job stops before its next batch.
    Starting it again starts from its first row."""
    states = (BackfillState.RUNNING, BackfillState.PAUSED, BackfillState.FAILED)
    return _move(name, BackfillState.CANCELLED, states, "cancel")


def resume(name: str) -> Progress:
    """Go on from the cursor: a paused backfill, or a failed one (its function fixed)."""
    spec = spec_of(name)
    with transaction.atomic():
        row = Backfill.objects.select_for_update().filter(name=name).first()
        if row is None:
            raise BackfillUnknown(f"Backfill {name!r} was never started; start it.")
        check_environment(spec, row)
        if row.state not in (BackfillState.PAUSED, BackfillState.FAILED):
            raise _not_now(row, "resume")
        row.state, row.segment, row.error = BackfillState.RUNNING, row.segment + 1, ""
        row.resumed_at = timezone.now()
        row.save(update_fields=["state", "segment", "error", "resumed_at"])
        _enqueue(row)
    return progress(row)


def _move(name: str, to: str, allowed: tuple[str, ...], verb: str) -> Progress:
    with transaction.atomic():
        row = Backfill.objects.select_for_update().filter(name=name).first()
        if row is None:
            raise BackfillUnknown(f"Backfill {name!r} was never started.")
        if row.state not in allowed:
            raise _not_now(row, verb)
        row.state = to
        if to == BackfillState.CANCELLED:
            row.finished_at = timezone.now()
        row.save(update_fields=["state", "finished_at"])
    return progress(row)


def _not_now(row: Backfill, verb: str) -> BackfillError:
    if row.state in LIVE:
        return BackfillRunning(f"Cannot {verb} backfill {row.name!r}: it is {row.state}.")
    if row.state == BackfillState.APPLIED:
        return BackfillApplied(f"Cannot {verb} backfill {row.name!r}: it is applied.")
    return BackfillError(
        f"Cannot {verb} backfill {row.name!r}: it is {row.state}.",
        fix="Start it again (`inbox backfills start NAME`): it starts from its first row.",
    )


def is_stalled(row: Backfill, now: datetime | None = None) -> bool:
    """Running, and no batch committed for its stall window (counted from its last batch, or
    from when it was started or resumed)."""
    if row.state != BackfillState.RUNNING:
        return False
    since = max(t for t in (row.last_batch_at, row.resumed_at, row.started_at) if t is not None)
    return ((now or timezone.now()) - since).total_seconds() > row.stall_seconds


def progress(row: Backfill, now: datetime | None = None) -> Progress:
    total = row.total_estimate
    if total is not None and row.state == BackfillState.APPLIED:
        total = row.rows_done
    elif total is not None:
        total = max(total, row.rows_done)
    eta = None
    if row.state == BackfillState.RUNNING and total is not None and row.rate > 0:
        eta = max(total - row.rows_done, 0) / row.rate
    return Progress(
        name=row.name,
        state=row.state,
        declared=get(row.name) is not None,
        rows_done=row.rows_done,
        total_estimate=total,
        rate=round(row.rate, 3),
        eta_seconds=None if eta is None else round(eta, 1),
        stalled=is_stalled(row, now),
        run=row.run,
        started_at=row.started_at,
        last_batch_at=row.last_batch_at,
        finished_at=row.finished_at,
        environment=row.environment,
        error=row.error,
    )


def status(name: str) -> Progress:
    row = Backfill.objects.filter(name=name).first()
    if row is None:
        raise BackfillUnknown(f"Backfill {name!r} was never started.")
    return progress(row)


def every() -> list[Progress]:
    """Each declared backfill (never started: ``pending``) and each started one."""
    return _with_declared(list(Backfill.objects.all()))


def _with_declared(rows: list[Backfill]) -> list[Progress]:
    by_name = {row.name: row for row in rows}
    found = [progress(row) for row in by_name.values()]
    found += [never_started(name) for name in declared() if name not in by_name]
    return sorted(found, key=lambda p: p.name)


def never_started(name: str) -> Progress:
    """A backfill with no row: declared and never started (or only named by a migration)."""
    return Progress(
        name=name,
        state="pending",
        declared=get(name) is not None,
        rows_done=0,
        total_estimate=None,
        rate=0.0,
        eta_seconds=None,
        stalled=False,
        run=0,
        started_at=None,
        last_batch_at=None,
        finished_at=None,
        environment="",
        error="",
    )


def stalled_error(p: Progress) -> BackfillStalled:
    return BackfillStalled(
        f"Backfill {p.name!r} is running but committed no batch since "
        f"{p.last_batch_at or p.started_at} ({p.rows_done} rows done)."
    )


@dataclass(frozen=True)
class Gated:
    """A backfill as the deploy gate reports it: declared and not applied, or stalled; and
    the migration it holds back, if any."""

    progress: Progress
    #: A migration ``migrate`` would apply now that needs it and would refuse
    #: (``app_label.0042_name``); "" when none does: nothing of this deploy waits for it.
    blocks: str
    #: ``backfill_pending`` when it blocks, ``backfill_stalled`` when stalled; else None.
    error: BackfillError | None

    def as_dict(self) -> dict[str, Any]:
        found = {**self.progress.as_dict(), "blocks": self.blocks or None}
        return {**found, **(self.error.as_dict() if self.error is not None else {})}


def pending(alias: str = DEFAULT_DB_ALIAS) -> list[Gated]:
    """What the deploy gate (``inbox backfills check``) reports about database ``alias``:
    each declared backfill that is not applied and each stalled one, with the migration it
    holds back. Only that blocks a deploy: a migration ``migrate`` would apply now (on disk,
    not applied) needs it, by a ``RequireBackfill`` or as a declaration's ``before``, and
    the gate in it would refuse (``gate.holds``). A backfill shipped ahead of the migration
    that needs it (the deploy before that migration) blocks nothing."""
    blocked = held_back(alias)
    ledger = router.db_for_write(Backfill)
    started = Backfill._meta.db_table in connections[ledger].introspection.table_names()
    everyone = _with_declared(list(Backfill.objects.using(ledger)) if started else [])
    seen = {p.name for p in everyone}
    everyone += [never_started(name) for name in sorted(blocked) if name not in seen]
    found: list[Gated] = []
    for p in everyone:
        blocks = blocked.get(p.name, "")
        error: BackfillError | None = None
        if p.stalled:
            error = stalled_error(p)
        elif blocks:
            state = "was never started" if p.state == "pending" else f"is {p.state}"
            error = BackfillPending(
                f"Backfill {p.name!r} {state}; migration {blocks}, to apply now, needs it "
                "applied first."
            )
        elif p.state == BackfillState.APPLIED or not p.declared:
            continue
        found.append(Gated(p, blocks, error))
    return found


def held_back(alias: str = DEFAULT_DB_ALIAS) -> dict[str, str]:
    """Each backfill that holds back a migration ``migrate`` would apply now on ``alias``
    (its whole plan, as ``migrate`` with no arguments), with the first such migration."""
    executor = MigrationExecutor(connections[alias])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    befores: dict[tuple[str, str], list[str]] = {}
    for spec in declared().values():
        if spec.before is not None:
            befores.setdefault(spec.before, []).append(spec.name)
    blocked: dict[str, str] = {}
    for migration, backwards in plan:
        key = (migration.app_label, migration.name)
        ops = [op for op in migration.operations if isinstance(op, RequireBackfill)]
        needs = [(op.name, op.hints) for op in ops] + [(n, {}) for n in befores.get(key, [])]
        if backwards or not needs:
            continue
        apps = executor.loader.project_state(key, at_end=False).apps
        for name, hints in needs:
            if name not in blocked and holds(name, key[0], alias, apps, hints) is not None:
                blocked[name] = ".".join(key)
    return blocked
