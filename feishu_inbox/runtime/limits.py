"""Rate limits from inside a handler: take a token before an effect, or wait for one.

``acquire(limits)`` takes one token of each limit's bucket for this job (its key filled from
the job: ``{app}``, ``{chat_id}``, ``{open_id}``, ``{tenant_key}``, ``{event_type}``, and
from the caller's values). When one is empty, a wait of up to ``INLINE_WAIT`` is spent here
(renewing the lease as any handler does); a longer one raises ``Deferred``: the worker hands
the job back, due when the bucket refills, without spending an attempt. A job that already
started an effect waits here whatever the wait, since it cannot be handed back.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from ..errors import Deferred
from ..ledger.limits import Bucket, RateLimit
from .context import Event, JobContext, current
from .writes import write

#: The longest wait for a token spent inside the handler; a longer one hands the job back.
INLINE_WAIT = 1.0


def job_values(event: Event) -> dict[str, Any]:
    """What a limit's key may name, taken from the job."""
    body = event.payload if isinstance(event.payload, dict) else {}
    inner = body.get("event") if isinstance(body.get("event"), dict) else {}
    message = inner.get("message") if isinstance(inner.get("message"), dict) else {}  # type: ignore[union-attr]
    sender = (inner.get("sender") or {}).get("sender_id") or {}  # type: ignore[union-attr]
    header = body.get("header") if isinstance(body.get("header"), dict) else {}
    return {
        "app": event.app,
        "event_type": event.event_type,
        "partition": event.partition_key,
        "chat_id": message.get("chat_id") or inner.get("chat_id"),  # type: ignore[union-attr]
        "open_id": sender.get("open_id") if isinstance(sender, dict) else None,
        "tenant_key": (header or {}).get("tenant_key") or event.tenant or None,
        # any job's tenant (SPEC §9j): a limit or a concurrency key per tenant
        "tenant": event.tenant or None,
    }


def acquire(limits: Sequence[RateLimit], **values: Any) -> None:
    """Take a token of each of ``limits`` for the current job (see the module)."""
    if not limits:
        return
    ctx = current()
    known = {**job_values(ctx.event), **values}
    wanted = [limit.bucket(known) for limit in limits]
    take(ctx, wanted)


def take_slots(ctx: JobContext, specs: Sequence[tuple[str, int]]) -> list[str]:
    """Take a slot of each ``(key template, N)`` for the current job, or none of them:
    ``Deferred`` when one key has all its N slots held. Returns the keys taken."""
    from ..ledger import concurrency  # models: not at import time

    taken: list[str] = []
    values = job_values(ctx.event)
    for template, limit in specs:
        key = RateLimit(template, 1).bucket(values).key  # the same template rules
        parked = write(
            ctx, "take a slot for", partial(_take_slot, concurrency.take, key, limit, ctx)
        )
        if parked is not None:  # parked: woken when a slot is given back
            give_back_slots(ctx, taken)
            raise Deferred(parked, f"All {limit} slots of {key} are held by running jobs.")
        taken.append(key)
    return taken


def _take_slot(take_fn: Any, key: str, limit: int, ctx: JobContext, retrying: bool) -> float | None:
    found = take_fn(key, limit, ctx.lease)
    return None if found is None else float(found)


def give_back_slots(ctx: JobContext, keys: list[str]) -> None:
    from ..ledger import concurrency

    if keys:
        write(ctx, "give back the slots of", lambda _: concurrency.give_back(keys, ctx.lease))


def take(ctx: JobContext, wanted: Sequence[Bucket]) -> None:
    from ..ledger import buckets  # models: not at import time (handlers are declared then)

    while True:
        ctx.ensure_alive()
        ctx.ensure_in_time()
        wait = write(ctx, "take a rate-limit token for", lambda _: buckets.take(wanted))
        if wait <= 0:
            return
        names = ", ".join(b.key for b in wanted)
        if wait > INLINE_WAIT and not ctx.effects_started:
            raise Deferred(wait, f"Waiting {wait:.2f}s for a token of {names}.")
        ctx.lost.wait(min(wait, INLINE_WAIT))  # a lost lease ends the wait at once
