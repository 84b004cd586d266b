"""Why a fenced call found its lease gone: read by every operation that was refused by its
fence (``rules``, ``waits``), outside the statement that failed."""

from __future__ import annotations

from typing import Any

from ..models import Status
from ..store import Row, store


def why_not_held(lease: Any, found: Row | None = None) -> str | None:
    """Why a fenced call found the lease gone (read outside the failed statement); None if the
    lease is still held (what stopped the call was something else)."""
    found = found or store().lease_state(lease.job_id)
    if found is None:
        return "it no longer exists"
    if found["status"] != Status.RUNNING:
        return f"it is {found['status']} now"
    if found["worker_id"] != lease.worker_id or found["lease_token"] != lease.token:
        return f"worker {found['worker_id']} holds it now"
    return "its lease expired" if found["expired"] else None
