"""Children of a running job (SPEC §9f): spawned once, waited for without a slot.

    @feishu_inbox.handler("im.message.receive_v1")
    def answer(event):
        tools = feishu_inbox.spawn_many("tool.call", [{"tool": t} for t in plan(event)])
        results = feishu_inbox.wait_all(tools, timeout=timedelta(minutes=5))
        feishu_inbox.reply(event, summarise([r.value for r in results if r.ok]))

``spawn`` enqueues a child and memoizes it like a step, in one transaction fenced by the
parent's lease: a retried parent gets the same child back, never a second one (the memo is per
replay generation: a replayed parent spawns a new generation, the old one stays as history).
Spawns without a ``key`` are told apart by their order in the handler (``spawn:1``…), as
unnamed waits are. A child runs in a partition of its own, in parallel with its siblings, unless
``ordered=True`` puts it in its parent's chat, behind it.

``wait_all`` / ``wait_any`` are durable waits (SPEC §9e): the parent gives its slot, thread
and chat back, and resumes once, when every child (or one) has ended — completed, failed,
cancelled or discarded; an ``unknown`` child holds the wait until an operator reconciles it.
They return each child's ``Outcome`` (``ok``, ``value``, ``state``, ``error_type``), failures
as values; a ``timeout`` raises ``WaitTimedOut``. A child is waited for by one wait at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..errors import WorkflowRefused
from ..runtime import context, writes
from ..runtime import waits as runtime_waits
from .specs import job, spec_of

#: The longest key of a spawn (its memo's name is ``spawn:<generation>:<key>``, 128 at most).
SPAWN_KEY_LIMIT = 100
#: The most children one transaction spawns (``spawn_many`` of more goes in chunks).
SPAWN_CHUNK = 250


@dataclass(frozen=True)
class Child:
    """A spawned child: its job's id (``feishu_inbox.wait_all`` takes these)."""

    job_id: int


def spawn(
    kind_or_task: Any,
    payload: dict[str, Any] | list[Any] | None = None,
    *,
    key: str | None = None,
    ordered: bool = False,
) -> Any:
    """Spawn one child (a handler's event type with its payload, or a ``@task`` with its
    arguments) from the running job; returns its ``Child`` (an awaitable in an async handler)."""
    spec = job(kind_or_task, payload).as_dict()
    return runtime_waits.in_handler(lambda: _spawn([spec], key, ordered)[0])


def spawn_many(
    kind_or_task: Any,
    payloads: Iterable[dict[str, Any] | list[Any] | None],
    *,
    key: str | None = None,
    ordered: bool = False,
) -> Any:
    """Spawn one child per payload, in one transaction (one memo): a fan-out of a thousand
    costs one commit. Returns the ``Child`` handles in order."""
    specs = [job(kind_or_task, p).as_dict() for p in payloads]
    return runtime_waits.in_handler(lambda: _spawn(specs, key, ordered))


def spawn_jobs(jobs: Sequence[Any], *, key: str | None = None, ordered: bool = False) -> Any:
    """Spawn children of different kinds (``feishu_inbox.job`` specs) in one transaction."""
    specs = [spec_of(j) for j in jobs]
    return runtime_waits.in_handler(lambda: _spawn(specs, key, ordered))


def _spawn(specs: list[dict[str, Any]], key: str | None, ordered: bool) -> list[Child]:
    from ..ledger import workflows

    ctx = context.current()
    ctx.ensure_alive()
    ctx.ensure_in_time()
    if key is None:
        ctx.spawned += 1
        name = str(ctx.spawned)
    elif not isinstance(key, str) or not key or len(key) > SPAWN_KEY_LIMIT or ":" in key:
        raise WorkflowRefused(
            f"A spawn's key is 1 to {SPAWN_KEY_LIMIT} characters without ':' (got {key!r:.80}).",
            fix="Name what the child does, e.g. key='search'.",
        )
    else:
        name = f"key={key}"
    if ordered and any(spec["task"] for spec in specs):
        raise WorkflowRefused(
            "A task child cannot run in its parent's chat (ordered=True).",
            fix="Give the tasks an ordering key instead: job(task, args, key=...).",
        )
    # A big fan-out goes in chunks, each its own transaction and memo: no transaction holds
    # the parent's row (and its lease's renewals) for long, and the first children run while
    # the rest are stored. A retried parent finds every chunk that committed.
    chunks = [specs[i : i + SPAWN_CHUNK] for i in range(0, len(specs), SPAWN_CHUNK)] or [[]]
    ids: list[int] = []
    for n, chunk in enumerate(chunks):
        memo = name if len(chunks) == 1 else f"{name}/{n}"

        def one(_: bool, memo: str = memo, chunk: list[dict[str, Any]] = chunk) -> list[int]:
            return workflows.spawn(
                ctx.lease, name=memo, specs=chunk, ordered=ordered, lease_seconds=ctx.lease_seconds
            )

        ids += writes.write(ctx, "spawn children of", one)
    return [Child(job_id) for job_id in ids]


def wait_all(
    children: Iterable[Child | int],
    *,
    timeout: timedelta | float | None = None,
    name: str | None = None,
) -> Any:
    """Wait until every child has ended; returns their ``Outcome`` in the order given."""
    return _wait(children, "all", timeout, name)


def wait_any(
    children: Iterable[Child | int],
    *,
    timeout: timedelta | float | None = None,
    name: str | None = None,
) -> Any:
    """Wait until at least one child has ended; returns the ``Outcome`` of those that had
    when the wait resolved (one or more)."""
    return _wait(children, "any", timeout, name)


def _wait(
    children: Iterable[Child | int], mode: str, timeout: timedelta | float | None, name: str | None
) -> Any:
    from ..ledger import workflows

    ids = list(dict.fromkeys(c.job_id if isinstance(c, Child) else int(c) for c in children))
    seconds = None if timeout is None else runtime_waits.as_seconds(timeout, "timeout")
    key = workflows.children_key(ids, mode)

    def run() -> Any:
        if not ids:
            return []
        ctx = context.current()
        wait_name, memo = runtime_waits.open_wait(
            key=key, seconds=seconds, name=name or key[1:], hold_chat=False
        )
        if memo.state == runtime_waits.OPEN:
            delivered = writes.write(
                ctx,
                "wait for the children of",
                lambda _: workflows.await_children(
                    ctx.lease,
                    wait_id=memo.wait_id,
                    job_ids=ids,
                    mode=mode,
                    lease_seconds=ctx.lease_seconds,
                ),
            )
            if delivered:
                wait_name, memo = runtime_waits.reopen_wait(wait_name)
        payload = runtime_waits.outcome(wait_name, memo)
        if payload is None:  # an operator resumed it early: what they are now
            return workflows.outcomes(ids)
        return [workflows.Outcome.from_json(o) for o in payload]

    return runtime_waits.in_handler(run)
