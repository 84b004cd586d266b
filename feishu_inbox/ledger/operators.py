"""Operator actions (SPEC §3): requeue, reconcile, discard, cancel, replay — and the expiry of
old unknown jobs, which the retention purge applies the same way.

Each is a guarded transition applied to each job in its own transaction, its partition row
locked first. Every job it does not apply to is refused, with a typed error (code, message,
fix), and stays as it was — also when it changed state between the operator's click and the
update. ``ledger`` offers these functions under the same names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..errors import (
    Duplicate,
    InvalidState,
    JobNotFound,
    LedgerError,
    NotRequeueable,
    UnknownStep,
)
from ..models import EventJob, Resolution, Status
from ..store import store
from .kinds import CHILDREN_KEY_PREFIX, RESULT_STEP

#: What to do instead, when an action meets a job of another state.
_HINTS = {
    "requeue": "Failed jobs are requeued or discarded; unknown jobs need reconcile.",
    "discard": "Failed jobs are requeued or discarded; unknown jobs need reconcile.",
    "reconcile": "Unknown jobs are reconciled; failed jobs are requeued or discarded.",
    "cancel": "Only a job that has not finished can be cancelled; replay a completed one, "
    "requeue or discard a failed one, reconcile an unknown one.",
}


@dataclass
class Outcome:
    """Per-job result of an operator action over several jobs."""

    done: list[int] = field(default_factory=list)
    refused: dict[int, LedgerError] = field(default_factory=dict)
    #: Running jobs asked to stop (cancel): their handler stops at its next checkpoint.
    pending: list[int] = field(default_factory=list)
    #: Replayed jobs that moved to the end of their partition: old id → new id.
    moved: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class OperatorAction:
    """One guarded transition an operator may apply."""

    doing: str
    #: The store's query (``common.sql``) and the states it applies to.
    transition: str
    from_statuses: tuple[Status, ...]
    resolution: str = Resolution.NONE

    def apply(
        self, job_ids: Iterable[int], *, message: str = "", from_step: str | None = None
    ) -> Outcome:
        """Apply it to each job in its own transaction; refuse every other job, with why."""
        outcome = Outcome()
        for job_id in dict.fromkeys(job_ids):
            found = store().transition(
                self.transition,
                job_id,
                from_statuses=[s.value for s in self.from_statuses],
                resolution=self.resolution,
                message=message,
                from_step=from_step,
            )
            if found.unknown_step:
                outcome.refused[job_id] = _unknown_step(self.doing, job_id, from_step)
            elif found.changed and found.status == Status.RUNNING:
                outcome.pending.append(job_id)
            elif found.changed:
                outcome.done.append(job_id)
            elif not found.found:
                outcome.refused[job_id] = _not_found(self.doing, job_id)
            else:
                outcome.refused[job_id] = InvalidState(
                    f"Cannot {self.doing} job {job_id}: it is {found.status}, "
                    f"not {' or '.join(self.from_statuses)}.",
                    fix=_HINTS.get(self.doing, ""),
                )
        return outcome


def _not_found(doing: str, job_id: int) -> JobNotFound:
    return JobNotFound(f"Cannot {doing} job {job_id}: there is no such job.")


def _unknown_step(doing: str, job_id: int, name: str | None) -> UnknownStep:
    return UnknownStep(f"Cannot {doing} job {job_id} from step {name!r}: it has no such step.")


REQUEUE = OperatorAction("requeue", "run_again", (Status.FAILED,), Resolution.REQUEUED)
DISCARD = OperatorAction("discard", "mark_done", (Status.FAILED,), Resolution.DISCARDED)
RECONCILE_APPLIED = OperatorAction("reconcile", "mark_done", (Status.UNKNOWN,), Resolution.APPLIED)
RECONCILE_NOT_APPLIED = OperatorAction(
    "reconcile", "run_again", (Status.UNKNOWN,), Resolution.NOT_APPLIED
)
CANCEL = OperatorAction(
    "cancel",
    "cancel",
    (Status.QUEUED, Status.RETRY_WAIT, Status.WAITING, Status.RUNNING),
    Resolution.CANCELLED,
)
EXPIRE_UNKNOWN = OperatorAction("expire", "expire_unknown", (Status.UNKNOWN,), Resolution.EXPIRED)


def requeue(job_ids: Iterable[int], *, from_step: str | None = None) -> Outcome:
    """``failed`` → ``queued``, attempt 0, due now. Its memoized steps stay, except, with
    ``from_step``, that step and every step that started after it (SPEC §7)."""
    return REQUEUE.apply(job_ids, from_step=from_step)


def reconcile(job_ids: Iterable[int], *, applied: bool, from_step: str | None = None) -> Outcome:
    """``unknown`` → ``completed`` (the effect happened) or ``queued`` (it did not: run again,
    from ``from_step`` if given)."""
    if applied and from_step is not None:
        raise LedgerError(
            "reconcile --applied marks the job done: there is no step to run again from.",
            fix="Leave from_step out, or reconcile as not applied.",
        )
    return (RECONCILE_APPLIED if applied else RECONCILE_NOT_APPLIED).apply(
        job_ids, from_step=from_step
    )


def discard(job_ids: Iterable[int]) -> Outcome:
    """``failed`` → ``completed`` (resolution recorded), unblocking its partition."""
    return DISCARD.apply(job_ids)


def cancel(job_ids: Iterable[int]) -> Outcome:
    """``queued``/``retry_wait``/``waiting`` → ``completed`` (``Cancelled``) at once (a waiting
    job's open wait closes: no signal is spent on it); a ``running`` job is
    asked to stop (``Outcome.pending``): its handler stops at its next checkpoint or effect
    with ``Cancelled``, and it ends ``completed`` (``unknown`` if an effect is uncertain).

    The unfinished children of every job asked for are cancelled too, and theirs (SPEC §9f),
    whether that job was cancelled now or had ended (a fire-and-forget parent; a cancel
    repeated after one that died midway): they are in ``Outcome.done`` / ``pending``. A child
    spawned meanwhile is refused (its parent's row is locked by both), so none escapes."""
    requested = list(dict.fromkeys(job_ids))
    outcome = CANCEL.apply(requested)
    # From every job asked for, cancelled now or not (a parent that ended, or whose cancel an
    # earlier call made before it died): cancelling a parent again reaches its children.
    seen = set(requested)
    level = requested
    while level:
        below = [c for c in _unfinished_children(level) if c not in seen]
        seen.update(below)
        more = CANCEL.apply(below)
        outcome.done += more.done
        outcome.pending += more.pending
        level = below
    return outcome


def _unfinished_children(job_ids: list[int]) -> list[int]:
    """The children of these jobs that have not ended (completed or failed)."""
    return list(
        EventJob.objects.filter(parent_id__in=job_ids)
        .exclude(status__in=(Status.COMPLETED, Status.FAILED))
        .order_by("id")
        .values_list("id", flat=True)
    )


def replay(job_ids: Iterable[int], *, from_step: str | None = None) -> Outcome:
    """``completed`` → ``queued``, attempt 0, its history kept: a new run of the same event
    (a handler bug was fixed, an event had no handler). It keeps its place in its partition
    if no later job has run, else it becomes the partition's newest job (``Outcome.moved``).
    Live jobs are refused (``not_requeueable``), and so is a job whose event another live job
    holds (``duplicate``). Its memoized steps stay, except, with ``from_step``, that step and
    every step that started after it."""
    outcome = Outcome()
    for job_id in dict.fromkeys(job_ids):
        found = store().replay(
            job_id,
            resolution=Resolution.REPLAYED,
            from_step=from_step,
            forget_waits=CHILDREN_KEY_PREFIX,  # a new generation of children (SPEC §9f)
            forget_step=RESULT_STEP,
        )
        if found.unknown_step:
            outcome.refused[job_id] = _unknown_step("replay", job_id, from_step)
        elif found.changed:
            outcome.done.append(found.job_id)
            if found.job_id != job_id:
                outcome.moved[job_id] = found.job_id
        elif not found.found:
            outcome.refused[job_id] = _not_found("replay", job_id)
        elif found.duplicate:
            outcome.refused[job_id] = Duplicate(
                f"Cannot replay job {job_id}: another live job holds the same event."
            )
        else:
            outcome.refused[job_id] = NotRequeueable(
                f"Cannot replay job {job_id}: it is {found.status}; only completed jobs run again."
            )
    return outcome
