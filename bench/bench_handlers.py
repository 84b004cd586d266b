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


def _answer() -> list[str]:
    return [f"t{i} " for i in range(int(os.environ.get("BENCH_STREAM_TOKENS", "100")))]


def _pace() -> None:
    pace = float(os.environ.get("BENCH_STREAM_PACE", "0"))
    if pace:
        time.sleep(pace)  # the model's pace between tokens


@feishu_inbox.handler("bench.reply_stream")
def reply_stream(event: Event) -> None:
    """A memoized answer streamed into a card reply (``stream_reply``)."""
    words = feishu_inbox.step("think", _answer)
    with feishu_inbox.stream_reply(event) as card:
        for word in words:
            card.write(word)
            _pace()
    with open(os.environ["BENCH_STREAM_FILE"], "a") as f:
        f.write(f"{card.operations} {card.requests} {card.ledger_writes}\n")


@feishu_inbox.handler("bench.reply_stream_raw")
def reply_stream_raw(event: Event) -> None:
    """The same card by bare CardKit calls, no ledger: the same coalescing and spacing."""
    from feishu_inbox.feishu import cardkit, openapi, streams

    card = {
        "schema": "2.0",
        "config": {"streaming_mode": True},
        "body": {"elements": [{"tag": "markdown", "content": "", "element_id": "answer"}]},
    }
    card_id = cardkit.create_card(event.app, card)
    content = {"type": "card", "data": {"card_id": card_id}}
    parent = event.payload["event"]["message"]["message_id"]
    openapi.reply_message(
        event.app, parent, content, msg_type="interactive", uuid=f"raw-{event.job_id}"
    )
    sequence, text, sent, last_flush, last_op = 0, "", "", time.monotonic(), 0.0

    def operation(send: object) -> None:
        nonlocal sequence, last_op
        sequence += 1
        wait = last_op + streams.OPERATION_SPACING - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        last_op = time.monotonic()
        send(sequence, f"raw-{card_id}-{sequence}")  # type: ignore[operator]

    def content_op(seq: int, uuid: str) -> None:
        cardkit.stream_text(event.app, card_id, "answer", text, sequence=seq, uuid=uuid)

    for word in _answer():
        text += word
        _pace()
        if time.monotonic() - last_flush >= streams.UPDATE_INTERVAL:
            last_flush = time.monotonic()
            operation(content_op)
            sent = text
    if sent != text:
        operation(content_op)
    off = {"config": {"streaming_mode": False}}
    operation(
        lambda seq, uuid: cardkit.card_settings(event.app, card_id, off, sequence=seq, uuid=uuid)
    )


@feishu_inbox.handler("bench.signal")
def resumed(event: Event) -> None:
    """Waits for its own signal (bench/waits.py); writes the signal's commit time and when
    its wait returned."""
    got = feishu_inbox.wait_for(f"bench-{event.event_id[1:]}", timeout=None)
    now = time.time()
    with open(os.environ["BENCH_LATENCY_FILE"], "a") as f:
        f.write(f"{got['t0']} {now}\n")


@feishu_inbox.handler("bench.wf_noop")
def wf_noop(event: Event) -> None:
    """A workflow's no-op child or batch member (bench/workflows.py)."""


@feishu_inbox.handler("bench.fanout")
def fanout(event: Event) -> None:
    """Fan-out/fan-in (bench/workflows.py): ``spawn_many`` ``n`` no-op children, ``wait_all``
    for them (the slot given back meanwhile); writes how many there were and completed."""
    n = int(event.payload["n"])
    kids = feishu_inbox.spawn_many("bench.wf_noop", [{"i": i} for i in range(n)])
    results = feishu_inbox.wait_all(kids)
    with open(os.environ["BENCH_FANOUT_FILE"], "a") as f:
        f.write(f"{len(results)} {sum(1 for r in results if r.ok)}\n")


@feishu_inbox.handler("bench.wf_callback")
def wf_callback(event: Event) -> None:
    """A batch's callback (bench/workflows.py): writes when it started and the batch's size."""
    with open(os.environ["BENCH_LATENCY_FILE"], "a") as f:
        f.write(f"{time.time()} {event.payload['batch']['total']}\n")
