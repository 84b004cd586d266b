"""What a fenced call that matched nothing ran into (SPEC §3 Fencing), in words: every
operation of a lease holder (``rules``, ``waits``) says why with these."""

from __future__ import annotations

from typing import Any

from ..errors import LeaseLost
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


def lease_lost(lease: Any, doing: str) -> LeaseLost:
    why = why_not_held(lease) or "its lease changed"
    return LeaseLost(f"Cannot {doing} job {lease.job_id} as worker {lease.worker_id}: {why}.")
