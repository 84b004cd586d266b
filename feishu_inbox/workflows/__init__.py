"""Workflows (SPEC §9f): children, batches with callbacks, chains — exactly once through crashes.

- ``specs``: what a workflow enqueues (``job``: a handler's event type or a ``@task``), and
  the enqueuer the ledger calls when a firing needs a job;
- ``children``: ``spawn`` / ``spawn_many`` from a running job, ``wait_all`` / ``wait_any``;
- ``grouping``: ``batch`` and ``chain`` from any Django code;
- ``cleanup``: ``on_finish``, a job that runs once after the running job ends (SPEC §9g).

The ledger's side (memos, counting members' ends, firing once) is ``ledger/workflows.py``.
Nothing here loads Django's models at import time: ``import feishu_inbox`` loads it.
"""

from __future__ import annotations

from typing import Any

from ..errors import ChildFailed, WorkflowRefused
from .children import Child, spawn, spawn_jobs, spawn_many, wait_all, wait_any
from .grouping import BatchHandle, batch, chain, outcomes
from .specs import JobSpec, job

__all__ = [
    "BatchHandle",
    "Child",
    "ChildFailed",
    "JobSpec",
    "Outcome",
    "WorkflowRefused",
    "batch",
    "chain",
    "job",
    "outcomes",
    "spawn",
    "spawn_jobs",
    "spawn_many",
    "wait_all",
    "wait_any",
]


def __getattr__(name: str) -> Any:
    if name == "Outcome":  # the ledger's, which loads the models: read on first use
        from ..ledger.workflows import Outcome

        return Outcome
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def ready() -> None:
    """Called by the app config: the ledger enqueues workflows' jobs through ``specs``."""
    from ..ledger import workflows
    from .specs import enqueue

    workflows.set_enqueuer(enqueue)
