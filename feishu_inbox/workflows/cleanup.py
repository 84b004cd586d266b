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

import hashlib
from typing import Any

from ..errors import WorkflowRefused
from ..runtime import cleanups
from .specs import job

#: A cleanup's name is stored in 64 characters.
NAME_LIMIT = 64


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
    if name is not None and (not isinstance(name, str) or not 1 <= len(name) <= NAME_LIMIT):
        raise WorkflowRefused(
            f"on_finish needs a name of 1 to {NAME_LIMIT} characters (got {name!r:.80}).",
            fix="Name the cleanup shortly, e.g. name='typing'; or leave it to the target's.",
        )
    if name is None:  # the target's path, or a digest of a long one (two never collide)
        name = spec.target
        if len(name) > NAME_LIMIT:
            name = "target:" + hashlib.sha256(name.encode()).hexdigest()[:32]
    return cleanups.on_finish(spec.as_dict(), name=name)
