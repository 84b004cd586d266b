"""Reactions and recalls in the fake Open API (``fake_feishu.FakeFeishu`` serves them), written
from Feishu's documentation, independent of feishu_inbox's code:

- ``POST   /open-apis/im/v1/messages/:message_id/reactions``
  ``{"reaction_type": {"emoji_type": "Typing"}}``: a reaction by the calling app; its answer
  names the ``reaction_id``, the ``operator`` (``operator_type: "app"``, the app's id) and the
  ``reaction_type``;
- ``GET    …/reactions?reaction_type=…&page_size=…&page_token=…``: the message's reactions
  (``items``, ``has_more``, ``page_token``), of one emoji when asked;
- ``DELETE …/reactions/:reaction_id``: removes one; only its operator may (231010 otherwise),
  an unknown one answers 231008 (the fake's reading of Feishu's "reaction not found").

A message ``recall``-ed by its sender refuses replies and reactions with 230011 ("The message
was withdrawn."), as Feishu does; its reactions are gone with it.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

REACTIONS_PATH = re.compile(r"^/open-apis/im/v1/messages/([^/]+)/reactions$")
REACTION_PATH = re.compile(r"^/open-apis/im/v1/messages/([^/]+)/reactions/([^/]+)$")
WITHDRAWN = 230011
REACTION_NOT_FOUND = 231008
NOT_YOUR_REACTION = 231010
INVALID = 99992402


@dataclass
class Reaction:
    reaction_id: str
    message_id: str
    emoji: str
    operator_id: str
    operator_type: str = "app"
    action_time: float = field(default_factory=time.time)

    def data(self) -> dict[str, Any]:
        return {
            "reaction_id": self.reaction_id,
            "operator": {"operator_id": self.operator_id, "operator_type": self.operator_type},
            "action_time": str(int(self.action_time * 1000)),
            "reaction_type": {"emoji_type": self.emoji},
        }


class Reactions:
    """The messages' reactions, every one ever added and removed, and the recalled messages."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.live: dict[str, Reaction] = {}
        self.added: list[Reaction] = []
        self.removed: list[Reaction] = []
        self.vanished: list[Reaction] = []  # gone with their recalled message
        self.recalled: set[str] = set()
        self.requests: list[tuple[str, str]] = []  # (operation, message id)

    def recall(self, message_id: str) -> None:
        """The sender recalled the message: it is withdrawn, and its reactions with it."""
        with self._lock:
            self.recalled.add(message_id)
            for reaction in [r for r in self.live.values() if r.message_id == message_id]:
                del self.live[reaction.reaction_id]
                self.vanished.append(reaction)

    def on(self, message_id: str, emoji: str | None = None) -> list[Reaction]:
        with self._lock:
            return [
                r
                for r in self.live.values()
                if r.message_id == message_id and (emoji is None or r.emoji == emoji)
            ]

    def left(self) -> list[Reaction]:
        with self._lock:
            return list(self.live.values())

    # --- the endpoints ---------------------------------------------------------------------

    def add(self, app_id: str, message_id: str, body: Any) -> tuple[int, dict[str, Any]]:
        emoji = (
            (body or {}).get("reaction_type", {}).get("emoji_type")
            if isinstance(body, dict)
            else None
        )
        with self._lock:
            self.requests.append(("add", message_id))
            if message_id in self.recalled:
                return 400, {"code": WITHDRAWN, "msg": "The message was withdrawn."}
            if not isinstance(emoji, str) or not emoji:
                return 400, {"code": INVALID, "msg": "field validation failed: reaction_type"}
            reaction = Reaction(f"r_{secrets.token_hex(10)}", message_id, emoji, app_id)
            self.live[reaction.reaction_id] = reaction
            self.added.append(reaction)
            return 200, {"code": 0, "msg": "success", "data": reaction.data()}

    def list(self, message_id: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        emoji = (query.get("reaction_type") or [None])[0]
        size = int((query.get("page_size") or ["20"])[0])
        start = int((query.get("page_token") or ["0"])[0] or 0)
        with self._lock:
            self.requests.append(("list", message_id))
            if message_id in self.recalled:
                return 400, {"code": WITHDRAWN, "msg": "The message was withdrawn."}
            found = [
                r
                for r in self.live.values()
                if r.message_id == message_id and (emoji is None or r.emoji == emoji)
            ]
        page = found[start : start + size]
        more = start + size < len(found)
        return 200, {
            "code": 0,
            "msg": "success",
            "data": {
                "items": [r.data() for r in page],
                "has_more": more,
                "page_token": str(start + size) if more else "",
            },
        }

    def delete(self, app_id: str, message_id: str, reaction_id: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append(("delete", message_id))
            reaction = self.live.get(reaction_id)
            if reaction is None or reaction.message_id != message_id:
                return 400, {"code": REACTION_NOT_FOUND, "msg": "reaction not found"}
            if reaction.operator_id != app_id:
                return 400, {"code": NOT_YOUR_REACTION, "msg": "not the reaction's operator"}
            del self.live[reaction_id]
            self.removed.append(reaction)
            return 200, {"code": 0, "msg": "success", "data": reaction.data()}
