"""A job's workflow as ``manage.py inbox show`` prints it (SPEC §9f): its parent, its batch,
its descendants as an indented tree with their states, the batches it made."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from feishu_inbox.ledger import trees
from feishu_inbox.models import EventJob
from feishu_inbox.tables.batches import Batch

#: The most descendants ``inbox show`` lists (their counts cover them all).
TREE_SHOWN = 200


def _batch_as_dict(batch: Batch) -> dict[str, Any]:
    return {
        "id": batch.pk,
        "kind": batch.kind,
        "state": batch.state,
        "pending": max(batch.pending, 0),
        "total": batch.total,
    }


def workflow_as_dict(job: EventJob) -> dict[str, Any] | None:
    """Its parent, its batch, its descendants (the first ``TREE_SHOWN``, breadth first, and
    counts of all), the batches it made; None for a job in no workflow."""
    tree = trees.tree_jobs(job.pk, limit=TREE_SHOWN + 1)[1:]
    if not (job.parent_id or job.batch_id or tree):
        return None
    batch = Batch.objects.filter(pk=job.batch_id).first() if job.batch_id else None
    return {
        "parent": job.parent_id,
        "batch": None if batch is None else _batch_as_dict(batch),
        "descendants": trees.descendant_counts(job.pk) if tree else {},
        "tree": tree[:TREE_SHOWN],
        "more": len(tree) > TREE_SHOWN,
        "batches": [_batch_as_dict(b) for b in trees.batches_of([job.pk]) if b != batch],
    }


def tree_lines(job_id: int, workflow: dict[str, Any]) -> Iterator[str]:
    """The workflow as lines: an indented tree, each job with its state."""
    yield "workflow:"
    if workflow["parent"]:
        yield f"  child of #{workflow['parent']}"
    if workflow["batch"]:
        b = workflow["batch"]
        yield (
            f"  counts in {b['kind']} #{b['id']} ({b['state']}, "
            f"{b['pending']} of {b['total']} pending)"
        )
    if workflow["descendants"]:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(workflow["descendants"].items()))
        yield f"  descendants: {counts}"
    depth = {job_id: 0}
    for node in workflow["tree"]:
        depth[node["id"]] = depth.get(node["parent_id"], 0) + 1
        indent = "  " * (depth[node["id"]] + 1)
        what = f"{node['event_type']} {node['status']} {node['error_type']}".rstrip()
        yield f"{indent}#{node['id']} {what}"
    if workflow["more"]:
        yield f"  … and more (the first {TREE_SHOWN} shown)"
    for b in workflow["batches"]:
        yield f"  {b['kind']} #{b['id']}: {b['state']}, {b['pending']} of {b['total']} pending"
