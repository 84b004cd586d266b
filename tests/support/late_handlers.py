"""A handler deployed after its events arrived (the replay test lists this module late)."""

from __future__ import annotations

import os
import time

import feishu_inbox
from feishu_inbox import Event
from tests.support.worker_handlers import record


@feishu_inbox.handler("test.late")
def late(event: Event) -> None:
    record("late", event.event_id, os.getpid(), time.monotonic_ns())


@feishu_inbox.handler(
    "test.policy", retry=feishu_inbox.RetryPolicy(attempts=2, backoff="fixed", delay=0.2)
)
def always_fails(event: Event) -> None:
    record("policy", event.event_id, event.attempt)
    raise RuntimeError("still broken")
