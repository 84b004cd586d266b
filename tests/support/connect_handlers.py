"""Handlers for the long-connection tests: what ``runworker`` ran, in order, and a card
callback that answers in the ACK."""

from __future__ import annotations

import os
from pathlib import Path

import feishu_inbox
from feishu_inbox import CardAction, Event


def _log(line: str) -> None:
    directory = os.environ.get("CONNECT_TEST_DIR")
    if directory:
        with open(Path(directory) / "runs.log", "a") as f:
            f.write(line + "\n")


@feishu_inbox.handler("im.message.receive_v1")
def on_message(event: Event) -> None:
    message = event.payload["event"]["message"]
    _log(f"run {event.event_id} {message['chat_id']}")


@feishu_inbox.card_callback()
def on_card(action: CardAction) -> dict[str, object]:
    choice = action.action.get("value", {}).get("choice")
    return {"toast": {"type": "success", "content": f"chose {choice}"}}
