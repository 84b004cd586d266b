"""Handlers for bench/worker.py (loaded with FEISHU_INBOX_HANDLERS=bench.bench_handlers)."""

from __future__ import annotations

import os
import time

import feishu_inbox
from feishu_inbox import Event


@feishu_inbox.handler("bench.noop")
def noop(event: Event) -> None:
    pass


@feishu_inbox.handler("bench.latency")
def latency(event: Event) -> None:
    now = time.time()
    with open(os.environ["BENCH_LATENCY_FILE"], "a") as f:
        f.write(f"{event.payload['t0']} {now}\n")


@feishu_inbox.handler("bench.steps")
def three_steps(event: Event) -> None:
    """A no-op handler of three memoized steps: what a step costs the ledger."""
    for name in ("think", "draft", "polish"):
        feishu_inbox.step(name, str, name)


@feishu_inbox.handler("bench.reply")
def reply(event: Event) -> None:
    """A reply through the Open API client, as an idempotent effect (the key as uuid)."""
    feishu_inbox.reply(event, "ok")


@feishu_inbox.handler("bench.reply_raw")
def reply_raw(event: Event) -> None:
    """The same request through the client alone, no effect: what the bookkeeping costs."""
    from feishu_inbox.feishu import openapi

    message_id = event.payload["event"]["message"]["message_id"]
    openapi.reply_message(event.app, message_id, "ok", uuid=f"raw-{event.job_id}")


@feishu_inbox.handler(
    "bench.limited", rate_limit=feishu_inbox.RateLimit("bench:{partition}", 1e9, burst=1e9)
)
def limited(event: Event) -> None:
    """A no-op that takes a token of its chat's bucket (never empty): what a token costs."""


@feishu_inbox.handler(
    "bench.limited_app", rate_limit=feishu_inbox.RateLimit("bench:{app}", 1e9, burst=1e9)
)
def limited_app(event: Event) -> None:
    """A no-op that takes a token of one bucket every job shares (one hot row)."""
