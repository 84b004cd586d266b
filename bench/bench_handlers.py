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
