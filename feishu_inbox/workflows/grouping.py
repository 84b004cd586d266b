"""Batches and chains from any Django code (SPEC §9f), inside the caller's transaction.

    with transaction.atomic():
        order = Order.objects.create(...)
        feishu_inbox.batch(
            [feishu_inbox.job(resize, {"image": i}) for i in order.images],
            on_success=feishu_inbox.job(publish, {"order": order.pk}),
            on_failure=feishu_inbox.job("order.alert", {"order": order.pk}),
        )
        feishu_inbox.chain(charge.using(...), ship, notify)   # each after the last completed

A batch's callbacks are jobs enqueued exactly once, when every member has ended:
``on_success`` when all completed, ``on_failure`` when one did not (it failed, was cancelled
or discarded), ``on_complete`` either way. Each gets the batch's summary (``batch``: id,
total, counts per state, the ids of those that did not complete); ``feishu_inbox.outcomes``
reads every member's result. A member that ends ``unknown`` holds its batch until an operator
reconciles it (its effect may have happened: the callback would count it wrongly). A member
requeued after its batch fired runs again without firing it twice.

``batch(..., open=True)`` stays open: ``add`` more members, then ``close`` it; it fires only
once closed. A chain enqueues its first link now and each next link when the one before it
completed, with that link's result; a link that fails (or is cancelled) stops the chain,
visibly (admin, ``inbox show``), until an operator requeues it: the chain then goes on from
there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import WorkflowRefused
from .specs import spec_of


@dataclass(frozen=True)
class BatchHandle:
    """A batch (or a chain) as stored: its id, and its members' (a chain: its first link's)."""

    id: int
    job_ids: tuple[int, ...]

    def add(self, jobs: Sequence[Any]) -> list[int]:
        """More members of this open batch, in the caller's transaction."""
        from ..ledger import workflows

        return workflows.add_members(self.id, [spec_of(j) for j in jobs])

    def close(self) -> bool:
        """No more members: it fires once they all ended (at once if they have)."""
        from ..ledger import workflows

        return workflows.close_batch(self.id)

    def outcomes(self) -> list[Any]:
        return outcomes(self.id)


def batch(
    jobs: Sequence[Any],
    *,
    on_success: Any = None,
    on_failure: Any = None,
    on_complete: Any = None,
    open: bool = False,
    description: str = "",
) -> BatchHandle:
    """Enqueue ``jobs`` (``feishu_inbox.job`` specs, event types or tasks) as one batch whose
    callbacks run once when every member has ended. In the caller's transaction."""
    from ..ledger import workflows
    from ..tables.batches import BatchKind

    specs = [spec_of(j) for j in jobs]
    if not specs and not open:
        raise WorkflowRefused(
            "A closed batch needs at least one member.",
            fix="Pass the jobs, or open=True and add them later.",
        )
    given = {"success": on_success, "failure": on_failure, "complete": on_complete}
    callbacks = {name: spec_of(cb) for name, cb in given.items() if cb is not None}
    batch_id, ids = workflows.create_batch(
        kind=BatchKind.BATCH,
        specs=specs,
        callbacks=callbacks,
        closed=not open,
        description=description,
    )
    return BatchHandle(batch_id, tuple(ids))


def chain(*links: Any, description: str = "") -> BatchHandle:
    """Run ``links`` one after another, each once the one before it completed, with its
    result. In the caller's transaction; returns the chain's handle (its first link's job)."""
    from ..ledger import workflows
    from ..tables.batches import BatchKind

    if len(links) < 1:
        raise WorkflowRefused("A chain needs at least one link.", fix="chain(a, b, c).")
    specs = [spec_of(link) for link in links]
    batch_id, ids = workflows.create_batch(
        kind=BatchKind.CHAIN, specs=specs[:1], links=specs[1:], description=description
    )
    return BatchHandle(batch_id, tuple(ids))


def outcomes(batch_id: int) -> list[Any]:
    """Every member's ``Outcome`` (with its result), in the order they joined: what a callback
    reads beside the summary it is given."""
    from ..ledger import workflows
    from ..models import EventJob

    ids = list(
        EventJob.objects.filter(batch_id=batch_id).order_by("id").values_list("id", flat=True)
    )
    return workflows.outcomes(ids)
