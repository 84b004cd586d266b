"""Workflows (SPEC §9f): children spawned once, a parent's wait for them, batches whose
callbacks run once, chains — the ledger's side.

How "once" holds through crashes:

- **Spawn.** A child is enqueued and the parent's memo of it (a step, ``spawn:<generation>:
  <name>``) recorded in one transaction, fenced by the parent's lease, its row locked first: a
  retried parent finds the memo and spawns nothing; a cancelled one spawns nothing.
- **Counting ends.** A member of a batch is a job whose ``batch_id`` names it. A row trigger on
  the job table (migration 0034) writes a ``BatchEvent`` in the member's own transaction each
  time it moves into an ended state (``completed`` — cancelled, superseded and discarded
  included — or ``failed``) or out of one (requeued, replayed); ``unknown`` holds its batch
  until an operator reconciles it. Nothing else on the hot path changes.
- **Firing.** ``fire_ready`` takes events (``SKIP LOCKED``), folds them into their batches'
  ``pending`` counts under the batches' row locks, in id order, and fires each batch that is
  closed and done, in the same transaction: the events deleted, the state set ``fired``, the
  callbacks enqueued (or the waiting parent's wait delivered, or the chain's next link
  enqueued). One transaction decides all of it, so a batch fires once, and a crash before the
  commit leaves the events for the next worker. Workers call it when PostgreSQL says a member
  ended (``BATCHES_NOTICE``), and at least once a second (``rules._maybe_sweep``).
- **Attaching.** A wait for children attaches them under their row locks and counts the ended
  ones from what those locks return, so a child that ends meanwhile is counted exactly once:
  by the attach (it ended first) or by its event (it ended after).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from django.db import DatabaseError
from django.utils import timezone

from .. import telemetry
from ..conf import checked_settings
from ..errors import ChildFailed, LeaseLost, WorkflowRefused
from ..models import EventJob, Status, Step
from ..store import store
from ..store.schema import BATCHES_NOTICE
from ..tables.batches import Batch, BatchEvent, BatchKind, BatchState
from .fencing import why_not_held
from .kinds import CHILDREN_KEY_PREFIX, RESULT_STEP

log = logging.getLogger("feishu_inbox.ledger")

#: A member's states that end it (``completed`` covers cancelled, superseded and discarded);
#: ``unknown`` holds its batch until an operator reconciles it.
ENDED = (Status.COMPLETED.value, Status.FAILED.value)
#: The steps a member's result is read from: a handler's return value, a task's.
TASK_RESULT_STEP = "django.tasks:return_value"
#: A spawn's memo: a step of the parent.
SPAWN_PREFIX = "spawn:"
#: The most events one ``fire_ready`` folds (the rest wait for the next call).
FOLD_LIMIT = 2000

# --- job specs: what a spawn, a member, a callback or a link enqueues ------------------------

#: How the workflows package enqueues a spec (``feishu_inbox.workflows``, which knows tasks):
#: ``enqueue(spec, extra)`` → the job's id, in the caller's transaction. ``extra``: values the
#: firing passes (the batch's outcome, a chain's previous result), by name.
Enqueuer = Callable[[dict[str, Any], dict[str, Any]], int]
_enqueuer: list[Enqueuer] = []


def set_enqueuer(enqueue: Enqueuer) -> None:
    """Called once, at start-up, by the layer that knows every kind of job."""
    _enqueuer[:] = [enqueue]


def enqueue_spec(spec: dict[str, Any], extra: dict[str, Any] | None = None) -> int:
    if not _enqueuer:
        raise WorkflowRefused("No enqueuer is set: is feishu_inbox in INSTALLED_APPS?")
    return _enqueuer[0](spec, extra or {})


# --- outcomes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """How a child or a batch member ended, as its parent or a callback reads it."""

    job_id: int
    #: ``completed``, ``failed``, ``cancelled``, ``discarded``; or, when read before it ended
    #: (an operator resumed the parent early), its status then.
    state: str
    result: Any = None
    error_type: str = ""
    error_message: str = ""

    @property
    def ok(self) -> bool:
        return self.state == "completed"

    @property
    def value(self) -> Any:
        """Its result; ``ChildFailed`` when it did not complete."""
        if not self.ok:
            raise ChildFailed(
                f"Job {self.job_id} {self.state}"
                + (f" ({self.error_type}: {self.error_message})" if self.error_type else "")
                + "."
            )
        return self.result

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, "")}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return cls(
            job_id=int(data["job_id"]),
            state=str(data.get("state", "")),
            result=data.get("result"),
            error_type=str(data.get("error_type", "")),
            error_message=str(data.get("error_message", "")),
        )


def _state_of(row: Any) -> str:
    if row["status"] != Status.COMPLETED:
        return str(row["status"])
    if row["resolution"] == "discarded":
        return "discarded"
    if row["error_type"] == "Cancelled":
        return "cancelled"
    return "completed"


def outcomes(job_ids: Sequence[int], *, results: bool = True) -> list[Outcome]:
    """The outcome of each job, in the order given (a job purged meanwhile: ``gone``)."""
    rows = {
        r["id"]: r
        for r in EventJob.objects.filter(id__in=job_ids).values(
            "id", "status", "error_type", "error_message", "resolution"
        )
    }
    found: dict[int, Any] = {}
    if results:
        for step in Step.objects.filter(
            job_id__in=job_ids, name__in=(RESULT_STEP, TASK_RESULT_STEP)
        ).values("job_id", "result"):
            found[step["job_id"]] = step["result"]
    made = []
    for job_id in job_ids:
        row = rows.get(job_id)
        if row is None:
            made.append(Outcome(job_id, "gone"))
            continue
        state = _state_of(row)
        made.append(
            Outcome(
                job_id,
                state,
                result=found.get(job_id),
                error_type="" if state == "completed" else row["error_type"],
                error_message="" if state == "completed" else row["error_message"][:500],
            )
        )
    return made


# --- spawning --------------------------------------------------------------------------------


def _lock_parent(lease: Any, lease_seconds: float) -> Any:
    """The running parent's row, fenced and locked by renewing its lease (a full lease for
    what the transaction does next), its chat's row first (the ledger's lock order: an
    ordered child is enqueued in that chat): its generation, and refusals."""
    store().lock_partitions([lease.partition_key])
    if store().renew(lease, lease_seconds) is None:
        why = why_not_held(lease) or "its lease is lost"
        raise LeaseLost(f"Cannot spawn from job {lease.job_id}: {why}.")
    row = (
        EventJob.objects.filter(id=lease.job_id)
        .values("replays", "cancel_requested", "app", "partition_key")
        .get()
    )
    if row["cancel_requested"]:
        raise WorkflowRefused(
            f"Job {lease.job_id} was cancelled: it spawns no more children.",
            fix="Nothing: the job stops at its next checkpoint.",
        )
    return row


def spawn(
    lease: Any,
    *,
    name: str,
    specs: Sequence[dict[str, Any]],
    ordered: bool = False,
    lease_seconds: float | None = None,
) -> list[int]:
    """Enqueue ``specs`` as children of the lease's job under the memo ``name`` (one step of
    the parent, per replay generation), or return the children an earlier attempt spawned so.
    One transaction; fenced (``LeaseLost``: nothing spawned)."""
    seconds = lease_seconds or checked_settings().LEASE_SECONDS
    with store().transaction():
        parent = _lock_parent(lease, seconds)
        memo = f"{SPAWN_PREFIX}{parent['replays']}:{name}"
        found = Step.objects.filter(job_id=lease.job_id, name=memo).values("result").first()
        if found is not None:
            return [int(i) for i in _loads(found["result"])]
        ids: list[int] = []
        for spec in specs:
            job_id = enqueue_spec(
                spec,
                {
                    "parent": lease.job_id,
                    "generation": parent["replays"],
                    "name": name,
                    "index": len(ids),
                    "app": parent["app"],
                    "partition_key": parent["partition_key"],
                    "ordered": ordered,
                },
            )
            ids.append(job_id)
        EventJob.objects.filter(id__in=ids).update(parent_id=lease.job_id)
        # Fenced; the parent's row is locked and its memo was not there: it lands.
        if not store().record_step(lease, name=memo, result=json.dumps(ids), took=0.0):
            raise LeaseLost(f"Cannot spawn from job {lease.job_id}: its lease is lost.")
    telemetry.WORKFLOW_CHILDREN.inc(len(ids))
    return ids


def _loads(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


def children_key(job_ids: Sequence[int], mode: str) -> str:
    digest = hashlib.sha256(",".join(map(str, job_ids)).encode()).hexdigest()[:16]
    return f"{CHILDREN_KEY_PREFIX}{mode}:{len(job_ids)}:{digest}"


def await_children(
    lease: Any,
    *,
    wait_id: int,
    job_ids: Sequence[int],
    mode: str,
    lease_seconds: float | None = None,
) -> bool:
    """Attach the children to a batch that delivers the parent's open wait ``wait_id`` when all
    of them (``mode="all"``) or one (``"any"``) ended; if that is so already, deliver it now
    (right after, in the batch's own transaction). Idempotent: a wait that has its batch keeps
    it. True when the wait was delivered now."""
    with store().transaction():
        parent = _lock_parent(lease, lease_seconds or checked_settings().LEASE_SECONDS)
        if Batch.objects.filter(wait_id=wait_id).exists():
            return False
        theirs = list(
            EventJob.objects.select_for_update()
            .filter(id__in=job_ids)
            .order_by("id")
            .values("id", "status", "parent_id", "batch_id")
        )
        strangers = [r["id"] for r in theirs if r["parent_id"] != lease.job_id]
        missing = sorted(set(job_ids) - {r["id"] for r in theirs})
        if strangers or missing:
            raise WorkflowRefused(
                f"Job {lease.job_id} can wait only for its own children; "
                f"{sorted(strangers) + missing} are not (or are gone).",
                fix="Wait for the handles spawn() returned.",
            )
        _refuse_awaited(theirs, f"Job {lease.job_id}'s children")
        ended = sum(1 for r in theirs if r["status"] in ENDED)
        batch = Batch.objects.create(
            kind=BatchKind.CHILDREN,
            state=BatchState.CLOSED,
            mode=mode,
            total=len(theirs),
            pending=len(theirs) - ended,
            parent_id=lease.job_id,
            wait_id=wait_id,
            description=f"children of job {lease.job_id} ({parent['partition_key'][:80]})",
            created_at=timezone.now(),
            closed_at=timezone.now(),
        )
        EventJob.objects.filter(id__in=job_ids).update(batch_id=batch.pk)
        telemetry.BATCHES.labels(batch.kind, "opened").inc()
        if not _done(batch):
            return False
        # Done already: fired right after this commit (``fire_batch``), in the ledger's lock
        # order, not under the job rows held here; a crash between leaves it to a sweep.
        batch.state = BatchState.READY
        batch.save(update_fields=["state"])
    return bool(fire_batch(batch.pk))


def _refuse_awaited(rows: Iterable[Any], whose: str) -> None:
    """A job counts in one batch at a time: one that still counts in an unfired batch (whose
    wait is still open) is refused."""
    held = {r["batch_id"] for r in rows if r["batch_id"] is not None}
    if not held:
        return
    live = list(
        Batch.objects.filter(id__in=held)
        .exclude(state=BatchState.FIRED)
        .values_list("id", "kind", "wait_id")
    )
    from ..waiting import Wait

    still = [
        b
        for b, kind, wait_id in live
        if kind != BatchKind.CHILDREN
        or (wait_id is not None and Wait.objects.filter(id=wait_id, state="open").exists())
    ]
    if still:
        raise WorkflowRefused(
            f"{whose} already count in batch(es) {still}, not ended yet.",
            fix="Wait for each child once (wait_any, then wait_all of the rest, is fine).",
        )


# --- batches and chains ----------------------------------------------------------------------


def create_batch(
    *,
    kind: str,
    specs: Sequence[dict[str, Any]],
    callbacks: dict[str, dict[str, Any]] | None = None,
    links: Sequence[dict[str, Any]] = (),
    closed: bool = True,
    description: str = "",
    parent_id: int | None = None,
) -> tuple[int, list[int]]:
    """A batch (or a chain: its first link as the one member, the rest in ``links``) and its
    members, enqueued in the caller's transaction. Returns its id and its members' ids."""
    with store().transaction():
        batch = Batch.objects.create(
            kind=kind,
            state=BatchState.OPEN,
            callbacks=callbacks or {},
            links=list(links),
            length=len(links) + 1 if kind == BatchKind.CHAIN else 0,
            description=description[:255],
            parent_id=parent_id,
            created_at=timezone.now(),
        )
        ids = _add(batch, specs)
        if kind == BatchKind.CHAIN:
            batch.fired_jobs = ids
        if closed:
            _close(batch)
        batch.save()
    telemetry.BATCHES.labels(kind, "opened").inc()
    return batch.pk, ids


def add_members(batch_id: int, specs: Sequence[dict[str, Any]]) -> list[int]:
    """More members of an open batch, in the caller's transaction; refused once closed."""
    with store().transaction():
        batch = Batch.objects.select_for_update().filter(id=batch_id).first()
        if batch is None or batch.kind != BatchKind.BATCH:
            raise WorkflowRefused(f"No batch #{batch_id}.", fix="Check the batch's id.")
        if batch.state != BatchState.OPEN:
            raise WorkflowRefused(
                f"Batch #{batch_id} is {batch.state}: no member can be added any more.",
                fix="Add members before close(), or make another batch.",
            )
        ids = _add(batch, specs)
        batch.save(update_fields=["total", "pending"])
    return ids


def _add(batch: Batch, specs: Sequence[dict[str, Any]]) -> list[int]:
    ids = [
        enqueue_spec(spec, {"batch": batch.pk, "index": batch.total + i})
        for i, spec in enumerate(specs)
    ]
    EventJob.objects.filter(id__in=ids).update(batch_id=batch.pk)
    batch.total += len(ids)
    batch.pending += len(ids)
    return ids


def close_batch(batch_id: int) -> bool:
    """No more members: the batch fires once every member ended (at once if they all did).
    False when it was closed already."""
    with store().transaction():
        batch = Batch.objects.select_for_update().filter(id=batch_id).first()
        if batch is None:
            raise WorkflowRefused(f"No batch #{batch_id}.", fix="Check the batch's id.")
        if batch.state != BatchState.OPEN:
            return False
        _close(batch)
        batch.save(update_fields=["state", "closed_at"])
    return True


def _close(batch: Batch) -> None:
    batch.state = BatchState.CLOSED
    batch.closed_at = timezone.now()
    # Its members may all have ended already: an event of no change makes a worker look.
    BatchEvent.objects.create(batch_id=batch.pk, delta=0)
    store().notify(BATCHES_NOTICE)


# --- firing ----------------------------------------------------------------------------------


def fire_ready(limit: int = FOLD_LIMIT) -> int:
    """Fold the members' events into their batches (one transaction: the events deleted, the
    counts moved, the batches now done set ``ready``), then fire each ready batch in a
    transaction of its own. Returns how many events it folded (0: none, or another worker
    holds them) plus how many batches it fired."""
    folded = _fold(limit) if BatchEvent.objects.exists() else 0  # a read: no lock for nothing
    fired = 0
    for batch_id in (
        Batch.objects.filter(state=BatchState.READY)
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    ):
        fired += fire_batch(batch_id)
    return folded + fired


def _fold(limit: int) -> int:
    with store().transaction():
        events = list(
            BatchEvent.objects.select_for_update(skip_locked=True)
            .order_by("id")
            .values_list("id", "batch_id", "delta")[:limit]
        )
        if not events:
            return 0
        BatchEvent.objects.filter(id__in=[e[0] for e in events]).delete()
        deltas: dict[int, int] = defaultdict(int)
        for _, batch_id, delta in events:
            deltas[batch_id] += delta
        for batch in Batch.objects.select_for_update().filter(id__in=deltas).order_by("id"):
            batch.pending += deltas[batch.pk]
            if batch.state == BatchState.STOPPED:
                # Its link moved (requeued, replayed; perhaps ended again since): look again.
                batch.state = BatchState.CLOSED
            if batch.state == BatchState.CLOSED and _done(batch):
                batch.state = BatchState.READY
            batch.save(update_fields=["pending", "state"])
    return len(events)


def fire_batch(batch_id: int) -> int:
    """Fire one ready batch, in a transaction of its own, its row locked first (then the
    ledger's own order: a key, partitions, jobs). 1 when it fired (or moved its chain on), 0
    when another worker did. Its firing raising anything but a database error marks it
    ``broken`` with why, for an operator: nothing of it happened, and the others go on."""
    try:
        with store().transaction():
            batch = Batch.objects.select_for_update().filter(id=batch_id).first()
            if batch is None or batch.state != BatchState.READY:
                return 0
            _fire(batch)
            batch.save()
        return 1
    except DatabaseError:
        raise
    except Exception as exc:
        log.exception("batch %s could not fire; it is marked broken", batch_id)
        Batch.objects.filter(id=batch_id, state=BatchState.READY).update(
            state=BatchState.BROKEN, error=f"{type(exc).__name__}: {exc}"[:2000]
        )
        telemetry.BATCHES.labels("any", "broken").inc()
        return 0


def _done(batch: Batch) -> bool:
    if batch.mode == "any":
        return batch.total - batch.pending >= 1 or batch.total == 0
    return batch.pending <= 0


def _fire(batch: Batch) -> None:
    """The batch's one firing (its row locked; ``fire_batch``'s transaction)."""
    members = list(
        EventJob.objects.filter(batch_id=batch.pk).order_by("id").values_list("id", flat=True)
    )
    if batch.kind == BatchKind.CHAIN:
        _advance_chain(batch, members)
        return
    batch.state = BatchState.FIRED
    batch.fired_at = timezone.now()
    telemetry.BATCHES.labels(batch.kind, "fired").inc()
    if batch.kind == BatchKind.CHILDREN:
        _deliver_children(batch, members)
        return
    ended = outcomes(members, results=False)
    counts: dict[str, int] = defaultdict(int)
    for outcome in ended:
        counts[outcome.state] += 1
    summary = {
        "id": batch.pk,
        "total": batch.total,
        "counts": dict(counts),
        "failed": [o.job_id for o in ended if not o.ok][:1000],
    }
    ok = all(o.ok for o in ended)
    fired = []
    for which in ("success" if ok else "failure", "complete"):
        spec = batch.callbacks.get(which)
        if spec:
            fired.append(enqueue_spec(spec, {"batch": summary, "callback": which}))
    batch.fired_jobs = fired
    telemetry.BATCH_CALLBACKS.inc(len(fired))


def _deliver_children(batch: Batch, members: list[int]) -> None:
    from . import waits

    found = outcomes(members)
    if batch.mode == "any":
        found = [
            o
            for o in found
            if o.state not in ("queued", "running", "retry_wait", "waiting", "unknown")
        ]
    payload = [o.as_json() for o in found]
    if batch.wait_id is not None:
        waits.deliver(int(batch.wait_id), payload)


def _advance_chain(batch: Batch, members: list[int]) -> None:
    """A chain's link ended: the next one starts with its result, or the chain ends (done),
    or it stops at a link that did not complete (held until that link is requeued)."""
    link = outcomes(members[-1:])[0] if members else None
    if link is None or not link.ok:
        batch.state = BatchState.STOPPED
        telemetry.BATCHES.labels(batch.kind, "stopped").inc()
        return
    if not batch.links:
        batch.state = BatchState.FIRED
        batch.fired_at = timezone.now()
        telemetry.BATCHES.labels(batch.kind, "fired").inc()
        return
    spec, batch.links = batch.links[0], batch.links[1:]
    batch.position += 1
    # The next link joins, then the finished one leaves (a replay of it later moves nothing):
    # its partition is locked before any job row, as the ledger's order goes.
    job_id = enqueue_spec(
        spec, {"previous": link.result, "chain": batch.pk, "index": batch.position}
    )
    EventJob.objects.filter(id=job_id).update(batch_id=batch.pk)
    EventJob.objects.filter(id=link.job_id).update(batch_id=None)
    batch.pending = 1
    batch.total += 1
    batch.fired_jobs = [*batch.fired_jobs, job_id]
