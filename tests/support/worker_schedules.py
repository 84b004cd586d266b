"""Schedules for the worker tests, declared from ``$TEST_SCHEDULES`` (a JSON list of
``{"name", "cron", ...}``), each running ``ran``; loaded by ``runworker`` beside
``worker_handlers`` through FEISHU_INBOX_HANDLERS. Without the variable it declares nothing.
"""

from __future__ import annotations

import json
import os

import feishu_inbox
from feishu_inbox import Event
from tests.support.worker_handlers import record


def ran(event: Event) -> None:
    """Record the run: its occurrence, who enqueued it, this process and attempt."""
    payload = event.payload
    with feishu_inbox.effect():  # a scheduled function runs like a handler: effects too
        record(
            "ran",
            payload["schedule"],
            payload["occurrence"],
            payload["trigger"],
            payload.get("enqueued_by") or "-",
            os.getpid(),
            event.attempt,
        )


for declaration in json.loads(os.environ.get("TEST_SCHEDULES", "[]")):
    feishu_inbox.schedule(**declaration)(ran)
