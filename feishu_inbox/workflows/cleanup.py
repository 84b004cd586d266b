"""``feishu_inbox.on_finish``: a job that runs once after the running job ends (SPEC §9g).

    @feishu_inbox.handler("im.message.receive_v1")
    def answer(event):
        feishu_inbox.on_finish("cleanup.release_lock", {"lock": name})   # a handler's type
        feishu_inbox.on_finish(notify_done, {"chat": chat_id})          # or a @task

The spec is recorded in the ledger now (fenced by the job's lease), and enqueued once the job
has ended — completed, failed, cancelled, superseded, timed out, ``unknown``, or after its
worker died and its lease expired — in the transaction that deletes the record
(``ledger/turns.py``): once, whichever worker sees it. A retried attempt that asks again for
the same ``name`` (by default: the target's) asks for the same cleanup.
"""

from __future__ import annotations

from typing import Any

from ..runtime import turns
from .specs import job


def on_finish(
    kind_or_task: Any,
    payload: dict[str, Any] | list[Any] | None = None,
    *,
    name: str | None = None,
    key: str | None = None,
) -> bool:
    """Enqueue ``job(kind_or_task, payload, key=key)`` once the running job has ended; False
    when a cleanup of this ``name`` was recorded already (an earlier attempt's)."""
    spec = job(kind_or_task, payload, key=key)
    return turns.on_finish(spec.as_dict(), name=(name or spec.target)[:64])
