"""Cleanups (SPEC §9g): ``feishu_inbox.on_finish``'s record, a job spec the ledger enqueues
once after the running job has ended, however it ended (``ledger/turns.py`` fires them)."""

from __future__ import annotations

from typing import Any

from ..errors import LedgerError


def on_finish(spec: dict[str, Any], *, name: str) -> bool:
    """Run the job ``spec`` (a workflow job spec) once, after the running job ends however it
    ends; recorded now, fenced. The same ``name`` again (a retried attempt) is the same
    cleanup: False."""
    from ..ledger import turns as ledger_turns
    from .context import current
    from .writes import write

    if not isinstance(name, str) or not 1 <= len(name) <= 64:
        raise LedgerError(f"on_finish needs a name of 1 to 64 characters (got {name!r:.80}).")
    ctx = current()
    ctx.ensure_alive()
    added = write(
        ctx,
        "add a cleanup to",
        lambda _: ledger_turns.add_cleanup(
            ctx.lease, name=name, spec=spec, lease_seconds=ctx.lease_seconds
        ),
    )
    ctx.cleanups = True  # once its end is written, this worker enqueues them at once
    return added


def handler_spec(
    event_type: str, payload: dict[str, Any], app: str | None = None, tenant: str | None = None
) -> dict[str, Any]:
    """A workflow job spec for a handler's (or a kind's) event type: what ``on_finish`` takes."""
    return {
        "target": event_type,
        "task": False,
        "payload": payload,
        "args": [],
        "key": None,
        "app": app,
        "tenant": tenant,
    }
