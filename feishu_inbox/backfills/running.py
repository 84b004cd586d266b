"""A backfill's run as a job kind: batch after batch, each one transaction with the cursor.

Each batch (SPEC §9i, invariant 12):

1. a token from the backfill's rate bucket (shared by every worker; a long wait hands the job
   back, due when the bucket refills, spending no attempt);
2. one transaction on the ledger's database: the backfill's row is claimed for this batch by
   a conditional UPDATE (its state still ``running``, its run and its batch count the ones
   read: a paused, cancelled or re-run backfill, or a zombie worker, matches nothing and
   stops); the next ``batch_size`` primary keys after the cursor, in order; the declared
   function on them; the cursor moved to the last key, the counters and the rate updated.

The row lock of step 2 is held to the commit, so the function's writes and the cursor land
together or not at all: a worker killed anywhere leaves the cursor at the last committed
batch, and the next attempt (after the lease expires) does the next batch, each row once.
When the rows' database is not the ledger's, the function's writes commit first, then the
cursor: a crash between the two repeats that one batch (at least once, not exactly once).

A batch that raises because the database was away (a dropped connection, a failover's
read-only server: ``writes.transient``) rolled back whole; it is tried again on a new
connection (SPEC §9k), and when the database stays away, the job's attempt fails and the job
is retried by its kind's policy: the backfill stays ``running``. Any other error is the
batch's own: the backfill is ``failed`` at its cursor, for an operator to resume.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, connections, transaction
from django.db.models import Count, F, IntegerField, Max, Min
from django.utils import timezone

from .. import telemetry
from ..errors import Concluded
from ..ledger.kinds import JobKind
from ..ledger.limits import RateLimit
from ..ledger.retry import RetryPolicy
from ..runtime import context, writes
from ..runtime.limits import acquire
from ..tables.backfills import Backfill, BackfillState
from .control import ATTEMPTS, PREFIX
from .declared import BackfillSpec, get

log = logging.getLogger("feishu_inbox.backfills")

#: The rate bucket's burst, in batches: with 1, each batch's lateness (the sleep's overshoot,
#: the take's round trip) is lost, and 20 batches a second ran at 84% of their rate; with 2 it
#: is made up by the next batch. A worker that comes back after a while runs one batch early.
BURST = 2
#: The weight of the newest batch in the smoothed rate.
RATE_SMOOTHING = 0.2
#: The error types a backfill's job may end with (kept on the job).
UNDECLARED, FAILED = "BackfillUnknown", "BackfillFailed"
#: A backfill's job whose attempt failed because the database stayed away comes back within
#: a minute of it, however many attempts its long life has spent (killed workers spend them
#: too): the site's policy would wait up to an hour.
POLICY = RetryPolicy(attempts=ATTEMPTS, backoff="exponential", delay=1.0, max_delay=60.0)


@dataclass(frozen=True)
class Batch:
    """What one batch did: the rows it covered (0: the backfill is done), or that it found
    the backfill no longer its to run (paused, cancelled, run again)."""

    rows: int
    stopped: bool = False


def cursor_value(spec: BackfillSpec, stored: Any) -> Any:
    """The stored cursor (JSON) as the primary key's own type (a UUID, a date…)."""
    return spec.queryset().model._meta.pk.to_python(stored)


def json_key(value: Any) -> Any:
    return value if isinstance(value, int | str) and not isinstance(value, bool) else str(value)


def run_batch(spec: BackfillSpec, row: Backfill) -> Batch:
    """One batch of ``row``'s run, in one transaction (see the module)."""
    alias = spec.write_alias()  # its keys too: a replica that lags would skip rows
    queryset = spec.queryset().using(alias)
    same_database = alias == DEFAULT_DB_ALIAS
    with transaction.atomic():
        now = timezone.now()
        mine = Backfill.objects.filter(
            pk=row.pk, run=row.run, state=BackfillState.RUNNING, batches=row.batches
        ).update(batch_started_at=now)  # the row's lock, to the commit
        if not mine:
            return Batch(0, stopped=True)
        if row.cursor is not None:
            queryset = queryset.filter(pk__gt=cursor_value(spec, row.cursor))
        keys = _window(spec, queryset)
        if not keys:
            Backfill.objects.filter(pk=row.pk).update(
                state=BackfillState.APPLIED, finished_at=now, batch_started_at=None
            )
            return Batch(0)
        if same_database:
            _work(spec, queryset, keys)
        else:
            with transaction.atomic(using=alias):
                _work(spec, queryset, keys)
        done = timezone.now()
        rate = row.rate
        if row.last_batch_at is not None:
            seconds = max((done - row.last_batch_at).total_seconds(), 1e-6)
            now_rate = len(keys) / seconds
            rate = now_rate if rate <= 0 else rate + RATE_SMOOTHING * (now_rate - rate)
        Backfill.objects.filter(pk=row.pk).update(
            cursor=json_key(keys[-1]),
            batches=F("batches") + 1,
            rows_done=F("rows_done") + len(keys),
            rate=rate,
            last_batch_at=done,
            batch_started_at=None,
        )
    telemetry.BACKFILL_ROWS.labels(spec.name).inc(len(keys))
    telemetry.BACKFILL_BATCHES.labels(spec.name).inc()
    return Batch(len(keys))


class Window(list[Any]):
    """A batch's first and last key and its size, without its keys in between (what a
    queryset batch needs: its range), read as one row; ``len`` is the batch's rows."""

    def __init__(self, rows: int, first: Any, last: Any) -> None:
        super().__init__([first, last] if rows else [])
        self.rows = rows

    def __len__(self) -> int:
        return self.rows


def _window(spec: BackfillSpec, queryset: Any) -> list[Any]:
    """The next batch after the cursor, by primary key: its keys (``takes="pks"``/``"rows"``),
    or, for a queryset batch, its size and first and last key. With an integer key, these are
    one aggregate over the window (``SELECT count, min, max FROM (… ORDER BY pk LIMIT n)``):
    the keys themselves would be fetched and turned into Python objects for nothing. Other
    keys are fetched: PostgreSQL has no ``min``/``max`` of a UUID, and a key type a site
    made may have none on either database."""
    window = queryset.order_by("pk")
    if spec.takes != "queryset" or not isinstance(queryset.model._meta.pk, IntegerField):
        keys = list(window.values_list("pk", flat=True)[: spec.batch_size])
        if spec.takes != "queryset" or not keys:
            return keys
        return Window(len(keys), keys[0], keys[-1])
    found = window.values("pk")[: spec.batch_size].aggregate(
        rows=Count("pk"), first=Min("pk"), last=Max("pk")
    )
    return Window(found["rows"], found["first"], found["last"])


def _work(spec: BackfillSpec, queryset: Any, keys: list[Any]) -> None:
    """The declared function on the batch: its keys, its rows, or (the default) the source
    queryset over the keys' range (``pk BETWEEN first AND last``: a range scan, where a list
    of a thousand keys is a thousand probes; the source's own filters keep out what is not
    its). Rows another transaction inserted into the range since the keys were read are in
    it too: they are below the cursor, so they are done once, by this batch. All of it on
    the batch's database (``queryset``'s)."""
    if spec.takes == "pks":
        spec.work(keys)
    elif spec.takes == "rows":
        rows = queryset.model._default_manager.using(queryset.db).filter(pk__in=keys)
        spec.work(list(rows.order_by("pk")))
    else:
        spec.work(spec.queryset().using(queryset.db).filter(pk__gte=keys[0], pk__lte=keys[-1]))


def run(event: context.Event) -> None:
    """Run the job's backfill batch after batch until it is done, paused or cancelled."""
    name, run_number = event.payload["backfill"], event.payload["run"]
    spec = get(name)
    if spec is None:
        raise Concluded(UNDECLARED, f"No backfill named {name!r} is declared in this worker.")
    ctx = context.current()
    rate = spec.batches_rate
    template = f"{PREFIX}{name}".replace("{", "{{").replace("}", "}}")  # a key, not fields
    limit = RateLimit(template, rate, burst=BURST) if rate else None
    rows_alias = spec.write_alias()
    while True:
        ctx.ensure_alive()
        row = writes.write(
            ctx, f"read backfill {name!r} for", lambda _: Backfill.objects.filter(name=name).first()
        )
        if row is None or row.run != run_number or row.state != BackfillState.RUNNING:
            return
        if limit is not None:
            acquire([limit])
        try:
            batch = _batch_through_blinks(ctx, spec, row, rows_alias)
        except Exception as exc:
            if writes.transient(exc):  # the database stayed away: the executor fails the
                raise  # attempt and the job is retried (POLICY); the backfill stays running
            if not _failed(row, exc):  # another worker's batch landed first: this one's
                continue  # error may be its stale view; the next read of the row says
            raise Concluded(FAILED, f"Backfill {name!r}: its batch raised {exc!r}.") from exc
        if batch.stopped:  # paused, cancelled, run again, or a batch landed meanwhile (a
            continue  # zombie's): the loop's next read of the row says which
        if batch.rows == 0:
            log.info("backfill %s applied (run %s)", name, run_number)
            return


def _batch_through_blinks(
    ctx: context.JobContext, spec: BackfillSpec, row: Backfill, rows_alias: str
) -> Batch:
    """``run_batch``, tried again on new connections while the database is away (SPEC
    §9k). It is safe to: the batch rolled back whole, or its commit landed and only the reply
    was lost, and then the retry's claim finds the batch count moved and stops.

    Tried for one lease's length at most, and not past the lease: an error the database keeps
    raising while the worker's heartbeat renews the lease is likely the statement's own (SQLite
    raises "no such column" as an ``OperationalError`` too), and goes to the executor, which
    fails the attempt; the job is retried by ``POLICY``."""
    delay = writes.RETRY_FIRST_DELAY
    give_up = time.monotonic() + ctx.lease_seconds
    while True:
        try:
            return run_batch(spec, row)
        except (DatabaseError, InterfaceError) as exc:
            if not writes.transient(exc):
                raise
            writes.drop_connection()
            if rows_alias != DEFAULT_DB_ALIAS:
                _drop(rows_alias)
            left = min(ctx.lease_left() - writes.LEASE_MARGIN, give_up - time.monotonic())
            if left <= 0:
                raise
            log.warning(
                "job %s: a backfill batch met the database away (%s); it is tried again",
                ctx.event.job_id,
                str(exc).strip() or type(exc).__name__,
            )
            telemetry.WRITE_RETRIES.inc()
            time.sleep(min(delay, left))  # a backoff between tries, not a synchronisation
            delay = min(delay * 2, writes.RETRY_LONGEST_DELAY)


def _drop(alias: str) -> None:
    """Close the rows' database's broken connection; the next query opens a new one."""
    try:
        connections[alias].close()
    except (DatabaseError, InterfaceError):  # a dead connection may fail to close: gone
        log.debug("closing a broken connection to %s failed", alias, exc_info=True)


def _failed(row: Backfill, exc: BaseException) -> bool:
    """The batch rolled back; the backfill waits for an operator (resume once fixed).
    Fenced as the batch's claim is, on the batch count it read: False when another worker's
    batch landed since (a zombie's error does not fail the live run)."""
    failed = Backfill.objects.filter(
        pk=row.pk, run=row.run, state=BackfillState.RUNNING, batches=row.batches
    ).update(state=BackfillState.FAILED, error=f"{type(exc).__name__}: {exc}"[:4000])
    if failed:
        log.exception("backfill %s: a batch raised; it is failed at its cursor", row.name)
    else:
        log.warning("backfill %s: a stale batch raised %r; its run goes on", row.name, exc)
    return bool(failed)


#: Backfill runs, as a kind of job (registered in ``AppConfig.ready``).
BACKFILL_KIND = JobKind(
    "backfill",
    "backfill runs",
    PREFIX,
    run=run,
    policy=lambda event_type: POLICY,
    can_wait=False,
)
