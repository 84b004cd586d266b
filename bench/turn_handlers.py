"""Handlers for bench/turns.py (loaded with FEISHU_INBOX_HANDLERS=bench.turn_handlers).

- ``im.message.receive_v1``: a coalescing handler, ``Coalesce(quiet=0.0, max_wait=0.0)``
  (a chat's waiting messages, up to 8, are one turn as soon as its first is claimed);
- ``bench.turn_plain``: a plain handler, one job per message, for the same Feishu-shaped
  payloads (one handler per event type, so the plain one has a type of its own).

Both do nothing but return, unless ``BENCH_LATENCY_FILE`` is set: then each writes one line,
``<kind> <t0> <start> <messages>`` (``t0``: the payload's ``bench_t0``, when its enqueue
began; ``start``: when the handler started, both ``time.time()``). No Feishu API call.
"""

from __future__ import annotations

import os
import time

import feishu_inbox
from feishu_inbox import Event

PLAIN = "bench.turn_plain"
LATENCY_FILE = os.environ.get("BENCH_LATENCY_FILE", "")


def _started(kind: str, event: Event, start: float, messages: int) -> None:
    with open(LATENCY_FILE, "a") as f:
        f.write(f"{kind} {event.payload['bench_t0']} {start} {messages}\n")


@feishu_inbox.handler(
    "im.message.receive_v1",
    coalesce=feishu_inbox.Coalesce(quiet=0.0, max_wait=0.0, max_messages=8),
)
def turn(event: Event) -> None:
    """A turn: nothing but return (the quiet window is zero: what forming a turn costs)."""
    if LATENCY_FILE:
        _started("turn", event, time.time(), len(event.turn.messages))


@feishu_inbox.handler(PLAIN)
def plain(event: Event) -> None:
    """One message, one job: nothing but return."""
    if LATENCY_FILE:
        _started("plain", event, time.time(), 1)
