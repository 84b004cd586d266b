"""A workflow as operators see it and act on it (SPEC §9f): a job's tree of descendants, a
batch's members by state, the batches not fired yet; cancel a workflow, retry its failed
members. The workflows' rules are ``workflows.py``."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.db.models import Count, Q

from ..models import EventJob, Status
from ..tables.batches import Batch, BatchKind, BatchState
from .operators import Outcome, cancel, requeue
from .workflows import ENDED


def unfinished_children(job_ids: Iterable[int]) -> list[int]:
    """The children of these jobs that have not ended (a cancelled parent's to cancel)."""
    ids = list(job_ids)
    if not ids:
        return []
    return list(
        EventJob.objects.filter(parent_id__in=ids)
        .exclude(status__in=ENDED)
        .order_by("id")
        .values_list("id", flat=True)
    )


def failed_members(root_id: int) -> list[int]:
    """A workflow's failed jobs (its children's, and their batches' members): to requeue."""
    return [job["id"] for job in tree_jobs(root_id) if job["status"] == Status.FAILED]


def tree_jobs(root_id: int, limit: int = 10_000) -> list[dict[str, Any]]:
    """A job and its descendants (children, grandchildren…), breadth first, at most
    ``limit`` jobs: id, parent, batch, event type, status, error."""
    fields = ("id", "parent_id", "batch_id", "event_type", "status", "error_type", "attempt")
    root = list(EventJob.objects.filter(id=root_id).values(*fields))
    found, level = list(root), [root_id]
    while level and len(found) < limit:
        below = list(
            EventJob.objects.filter(parent_id__in=level)
            .order_by("id")
            .values(*fields)[: limit - len(found)]
        )
        found += below
        level = [j["id"] for j in below]
    return found


def descendant_counts(root_id: int) -> dict[str, int]:
    """How many of a job's descendants are in each state (every level)."""
    counts: dict[str, int] = defaultdict(int)
    level = [root_id]
    while level:
        rows = list(EventJob.objects.filter(parent_id__in=level).values_list("id", "status"))
        for _, status in rows:
            counts[status] += 1
        level = [job_id for job_id, _ in rows]
    return dict(counts)


def batches_of(job_ids: Iterable[int]) -> list[Batch]:
    """The batches these jobs made or count in (a tree's batches)."""
    ids = list(job_ids)
    counted = EventJob.objects.filter(id__in=ids, batch_id__isnull=False).values("batch_id")
    return list(Batch.objects.filter(Q(parent_id__in=ids) | Q(id__in=counted)).order_by("id"))


def member_ids(batch_id: int) -> list[int]:
    return list(
        EventJob.objects.filter(batch_id=batch_id).order_by("id").values_list("id", flat=True)
    )


def cancel_batches(batch_ids: Iterable[int]) -> Outcome:
    """An operator cancels workflows: each batch's unfinished members (and their children).
    A batch then fires with them cancelled (its failure callback, a parent's outcomes); a
    chain stops at its cancelled link."""
    ids = [j for b in batch_ids for j in member_ids(b)]
    unfinished = list(
        EventJob.objects.filter(id__in=ids).exclude(status__in=ENDED).values_list("id", flat=True)
    )
    return cancel(unfinished)


def retry_failed(batch_ids: Iterable[int]) -> Outcome:
    """An operator requeues the failed members of these batches (a chain goes on from its
    failed link once it completes; a batch that fired already does not fire again)."""
    ids = [j for b in batch_ids for j in member_ids(b)]
    return requeue(
        EventJob.objects.filter(id__in=ids, status=Status.FAILED).values_list("id", flat=True)
    )


def open_batches_by_kind() -> dict[tuple[str, str], int]:
    """Batches not fired yet, by kind and state (the partial index on unfired batches)."""
    from ..waiting import Wait

    # A parent's wait that timed out or was cancelled leaves its batch closed: it counts no more.
    gone = Wait.objects.exclude(state="open").values("id")
    rows = (
        Batch.objects.exclude(state=BatchState.FIRED)
        .exclude(kind=BatchKind.CHILDREN, wait_id__in=gone)
        .values("kind", "state")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {(r["kind"], r["state"]): int(r["n"]) for r in rows}


def member_counts(batch_id: int) -> dict[str, int]:
    """How many of a batch's members are in each state."""
    rows = EventJob.objects.filter(batch_id=batch_id).values("status").annotate(n=Count("id"))
    return {row["status"]: row["n"] for row in rows.order_by()}


def fire_again(batch_ids: Iterable[int]) -> int:
    """An operator fires broken batches again (what broke their firing was fixed: a task
    restored, a payload made smaller): ``ready``, for the next worker. Returns how many."""
    from ..store import store
    from ..store.schema import BATCHES_NOTICE

    again = Batch.objects.filter(id__in=list(batch_ids), state=BatchState.BROKEN).update(
        state=BatchState.READY, error=""
    )
    if again:
        store().notify(BATCHES_NOTICE)
    return again
