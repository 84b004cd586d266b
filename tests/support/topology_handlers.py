"""The handler of the topology and failover tests' webhook events (a message event under a
type of its own, ``test.topology.message``: the demo's bot handles ``im.message.receive_v1``),
loaded by ``runworker`` via FEISHU_INBOX_HANDLERS beside ``worker_handlers``.

Each run records its start (with the event's chat, pid, the host's monotonic clock and the
attempt) and its end to ``$WORKER_TEST_DIR/events.log``; with ``TOPOLOGY_EFFECTS=1`` it also
records one effect, inside ``feishu_inbox.effect()``, so that a test can count effects.
"""

from __future__ import annotations

import os
import time

import feishu_inbox
from feishu_inbox import Event
from tests.support.worker_handlers import record

EFFECTS = os.environ.get("TOPOLOGY_EFFECTS") == "1"
#: Seconds of the handler's own work (a worker killed meanwhile runs it again).
WORK = float(os.environ.get("TOPOLOGY_WORK", "0.005"))
#: Seconds inside the effect, after its record (a database lost meanwhile finds it in flight).
EFFECT_WORK = float(os.environ.get("TOPOLOGY_EFFECT_WORK", "0"))


EVENT_TYPE = "test.topology.message"


@feishu_inbox.handler(EVENT_TYPE)
def message(event: Event) -> None:
    pid = os.getpid()
    chat = event.payload["event"]["message"]["chat_id"]
    record("start", event.event_id, pid, time.monotonic_ns(), event.attempt, chat)
    time.sleep(WORK)  # the handler's work, not a synchronisation
    if EFFECTS:
        with feishu_inbox.effect():
            record("effect", event.event_id, pid)
            time.sleep(EFFECT_WORK)  # the effect's own time, not a synchronisation
    record("end", event.event_id, pid, time.monotonic_ns())


NOOP_TYPE = "test.topology.noop"


@feishu_inbox.handler(NOOP_TYPE)
def noop(event: Event) -> None:
    """A no-op job of the held-snapshot test: its enqueue time (the host's monotonic clock, in
    the payload) and its start."""
    record("noop", event.event_id, event.payload["t0"], time.monotonic_ns())
