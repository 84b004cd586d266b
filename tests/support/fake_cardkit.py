"""The CardKit half of the fake Open API (``fake_feishu.FakeFeishu`` serves it): card
entities a streamed reply writes into, with Feishu's documented rules, written from its
documentation and independent of feishu_inbox's code.

- ``POST /open-apis/cardkit/v1/cards`` ``{"type": "card_json", "data": "<card JSON 2.0>"}``:
  a new card (no uuid), streaming when its ``config.streaming_mode`` is true;
- ``PUT  /cards/:card_id/elements/:element_id/content`` ``{"content", "sequence", "uuid"}``:
  the element's text, while streaming is on;
- ``PATCH /cards/:card_id/settings`` ``{"settings": "<JSON>", "sequence", "uuid"}``: e.g.
  streaming mode off (or on again: its window starts anew);
- ``PUT  /cards/:card_id`` ``{"card": {"type": "card_json", "data"}, "sequence", "uuid"}``:
  the whole card.

Every operation after create needs a ``sequence`` higher than any the card has seen
(300317), may carry a ``uuid`` (a repeat with the same body answers success and changes
nothing; with another body 200770); a card takes at most ``ops_per_second`` operations in any
second (429, 99991400, ``x-ogw-ratelimit-reset``); streaming turns itself off
``stream_window`` seconds after it was turned on (an update then answers 200850 once, and
300309 after); an unknown card answers 200740. A card can be sent in one message only.

It records, per card, when each operation arrived (``arrivals``), every text its element
showed (``history``), and each request's outcome (``requests``).
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

CARDS_PATH = "/open-apis/cardkit/v1/cards"
CARD_PATH = re.compile(r"^/open-apis/cardkit/v1/cards/([^/]+)$")
CONTENT_PATH = re.compile(r"^/open-apis/cardkit/v1/cards/([^/]+)/elements/([^/]+)/content$")
SETTINGS_PATH = re.compile(r"^/open-apis/cardkit/v1/cards/([^/]+)/settings$")

SEQUENCE_NOT_INCREASING = 300317
STREAMING_CLOSED = 300309
STREAMING_TIMED_OUT = 200850
CARD_NOT_FOUND = 200740
UUID_REUSED = 200770
ELEMENT_NOT_FOUND = 300308
INVALID = 99992402
#: The IM endpoints' answer to a card entity sent a second time (or not found).
CARD_ALREADY_SENT = 230099


@dataclass
class Card:
    card_id: str
    app_id: str
    data: dict[str, Any]
    streaming: bool
    streaming_on_at: float
    created: float = field(default_factory=time.monotonic)
    sequence: int = 0
    #: element_id -> its text now
    elements: dict[str, str] = field(default_factory=dict)
    message_id: str | None = None
    uuids: dict[str, str] = field(default_factory=dict)
    #: when (monotonic) each operation on it arrived, whatever its answer
    arrivals: list[float] = field(default_factory=list)
    #: the operations of the last second counted against the limit (not refused by it)
    admitted: list[float] = field(default_factory=list)
    #: (element_id, text) each time an element's text changed, in order
    history: list[tuple[str, str]] = field(default_factory=list)
    timed_out_told: bool = False

    def most_in_a_second(self) -> int:
        """The most operations that arrived within any one second."""
        times = sorted(self.arrivals)
        best, start = 0, 0
        for end, t in enumerate(times):
            while t - times[start] >= 1.0:
                start += 1
            best = max(best, end - start + 1)
        return best

    def texts(self, element_id: str) -> list[str]:
        return [text for e, text in self.history if e == element_id]


@dataclass
class CardRequest:
    operation: str  # create | content | settings | update
    app_id: str
    card_id: str | None
    sequence: int | None
    uuid: str | None
    #: created | applied | duplicate | rate_limited | sequence_refused | closed | timed_out |
    #: not_found | uuid_reused | invalid | <fault kind>
    outcome: str


class CardKit:
    def __init__(self, *, stream_window: float = 600.0, ops_per_second: int = 10) -> None:
        self.stream_window = stream_window
        self.ops_per_second = ops_per_second
        self.cards: dict[str, Card] = {}
        self.requests: list[CardRequest] = []
        #: card_id -> operations applied whose answer is being held back (slow_after_apply)
        self.delayed: dict[str, int] = {}
        self._lock = threading.Lock()

    # --- reading -----------------------------------------------------------------------------

    def outcomes(self) -> dict[str, int]:
        with self._lock:
            counts: dict[str, int] = {}
            for r in self.requests:
                counts[r.outcome] = counts.get(r.outcome, 0) + 1
            return counts

    def card_of_message(self, message_id: str) -> Card | None:
        with self._lock:
            return next((c for c in self.cards.values() if c.message_id == message_id), None)

    # --- the endpoints -----------------------------------------------------------------------

    def create(self, app_id: str, body: Any) -> tuple[int, dict[str, Any], Card | None]:
        data = _card_data(body)
        if isinstance(data, str):
            self._record("create", app_id, None, None, None, "invalid")
            return 400, {"code": INVALID, "msg": data}, None
        with self._lock:
            now = time.monotonic()
            streaming = bool(data.get("config", {}).get("streaming_mode"))
            card = Card(f"7{secrets.randbelow(10**18):018d}", app_id, data, streaming, now)
            card.elements = dict(_elements(data))
            self.cards[card.card_id] = card
            self.requests.append(CardRequest("create", app_id, card.card_id, None, None, "created"))
        return 200, {"code": 0, "msg": "success", "data": {"card_id": card.card_id}}, card

    def operate(
        self, operation: str, app_id: str, card_id: str, element_id: str | None, body: Any
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """One operation on a card: (status, body, headers) of the answer."""
        problem = _operation_problem(operation, body)
        sequence = body.get("sequence") if isinstance(body, dict) else None
        uuid = body.get("uuid") if isinstance(body, dict) else None
        with self._lock:
            now = time.monotonic()
            card = self.cards.get(card_id)
            if card is not None and card.app_id == app_id:
                card.arrivals.append(now)

            def answer(outcome: str, status: int, code: int, msg: str, **headers: str) -> Any:
                self.requests.append(
                    CardRequest(operation, app_id, card_id, sequence, uuid, outcome)
                )
                return status, {"code": code, "msg": msg}, headers

            if problem:
                return answer("invalid", 400, INVALID, f"field validation failed: {problem}")
            if card is None or card.app_id != app_id:
                return answer("not_found", 400, CARD_NOT_FOUND, "card not found")
            admitted = [t for t in card.admitted if now - t < 1.0]
            card.admitted = admitted
            if len(admitted) >= self.ops_per_second:
                reset = max(1.0 - (now - admitted[-self.ops_per_second]), 0.01)
                return answer(
                    "rate_limited",
                    429,
                    99991400,
                    "request trigger frequency limit",
                    **{"x-ogw-ratelimit-limit": "10", "x-ogw-ratelimit-reset": f"{reset:.3f}"},
                )
            admitted.append(now)
            canonical = json.dumps(body, sort_keys=True, ensure_ascii=False)
            if uuid and uuid in card.uuids:
                if card.uuids[uuid] == canonical:
                    return answer("duplicate", 200, 0, "success")
                return answer("uuid_reused", 400, UUID_REUSED, "uuid reused with another body")
            if sequence <= card.sequence:
                return answer(
                    "sequence_refused",
                    400,
                    SEQUENCE_NOT_INCREASING,
                    f"sequence {sequence} is not greater than {card.sequence}",
                )
            if operation == "content":
                if element_id not in card.elements:
                    return answer("not_found", 400, ELEMENT_NOT_FOUND, "element not found")
                if card.streaming and now - card.streaming_on_at >= self.stream_window:
                    card.streaming = False
                    card.data.setdefault("config", {})["streaming_mode"] = False
                    if not card.timed_out_told:
                        card.timed_out_told = True
                        return answer("timed_out", 400, STREAMING_TIMED_OUT, "streaming timed out")
                if not card.streaming:
                    return answer("closed", 400, STREAMING_CLOSED, "streaming mode is closed")
                card.elements[element_id] = body["content"]
                card.history.append((element_id, body["content"]))
            elif operation == "settings":
                config = json.loads(body["settings"]).get("config", {})
                card.data.setdefault("config", {}).update(config)
                if "streaming_mode" in config:
                    turned_on = bool(config["streaming_mode"]) and not card.streaming
                    card.streaming = bool(config["streaming_mode"])
                    if turned_on:
                        card.streaming_on_at, card.timed_out_told = now, False
            else:  # update: the whole card
                data = json.loads(body["card"]["data"])
                card.data = data
                card.streaming = bool(data.get("config", {}).get("streaming_mode"))
                if card.streaming:
                    card.streaming_on_at = now
                for element, text in _elements(data):
                    if card.elements.get(element) != text:
                        card.history.append((element, text))
                card.elements = dict(_elements(data))
            card.sequence = sequence
            if uuid:
                card.uuids[uuid] = canonical
            return answer("applied", 200, 0, "success")

    def send(self, app_id: str, content: Any, message_id: str) -> tuple[int, str] | None:
        """A message carrying card entity ``content["data"]["card_id"]`` is being created:
        None when it may be (and the card is now sent), else (code, msg)."""
        card_id = content.get("data", {}).get("card_id") if isinstance(content, dict) else None
        with self._lock:
            card = self.cards.get(str(card_id))
            if card is None or card.app_id != app_id:
                return CARD_ALREADY_SENT, f"card {card_id} not found"
            if card.message_id is not None:
                return CARD_ALREADY_SENT, f"card {card_id} was already sent"
            card.message_id = message_id
            return None

    def _record(self, *args: Any) -> None:
        with self._lock:
            self.requests.append(CardRequest(*args))


def card_entity(content: Any) -> dict[str, Any] | None:
    """The ``{"type": "card", "data": {"card_id": …}}`` of an interactive message, or None."""
    if isinstance(content, str):
        try:
            content = json.loads(content)
        except ValueError:
            return None
    if isinstance(content, dict) and content.get("type") == "card":
        return content
    return None


def _card_data(body: Any) -> dict[str, Any] | str:
    """The card JSON 2.0 of a create (or of an update's ``card``), or what is wrong."""
    if not isinstance(body, dict) or body.get("type") != "card_json":
        return 'type must be "card_json"'
    try:
        data = json.loads(body.get("data") or "")
    except ValueError:
        return "data must be the card's JSON"
    if not isinstance(data, dict) or data.get("schema") != "2.0":
        return 'data must be a card JSON 2.0 object ("schema": "2.0")'
    return data


def _elements(data: dict[str, Any]) -> list[tuple[str, str]]:
    found = []
    for element in data.get("body", {}).get("elements", []):
        if isinstance(element, dict) and element.get("element_id"):
            found.append((element["element_id"], str(element.get("content", ""))))
    return found


def _operation_problem(operation: str, body: Any) -> str:
    if not isinstance(body, dict):
        return "body must be a JSON object"
    sequence = body.get("sequence")
    if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 1:
        return "sequence must be a positive integer"
    uuid = body.get("uuid")
    if uuid is not None and (not isinstance(uuid, str) or len(uuid) > 64):
        return "uuid must be a string of at most 64 characters"
    if operation == "content" and not isinstance(body.get("content"), str):
        return "content must be a string"
    if operation == "settings":
        try:
            settings = json.loads(body.get("settings") or "")
        except ValueError:
            return "settings must be a JSON string"
        if not isinstance(settings, dict):
            return "settings must be a JSON object"
    if operation == "update":
        data = _card_data(body.get("card"))
        if isinstance(data, str):
            return f"card: {data}"
    return ""
