"""Feishu's CardKit through the official SDK: the card entity a streamed reply writes into.

    card_id = cardkit.create_card("default", card_json)          # no uuid: not idempotent
    cardkit.stream_text("default", card_id, "answer", "Hello wor", sequence=3, uuid=key)
    cardkit.card_settings("default", card_id, {"config": {"streaming_mode": False}},
                          sequence=4, uuid=key)
    cardkit.update_card("default", card_id, card_json, sequence=5, uuid=key)

All under ``/open-apis/cardkit/v1``. Every operation on a card after its creation carries a
``sequence`` that must be higher than any the card has seen (code 300317 otherwise) and a
``uuid`` that makes a repeat of the same body harmless; a card takes at most 10 operations a
second (429, code 99991400). Streaming mode turns itself off 10 minutes after it was turned on:
a streamed update then answers 300309 (closed) or 200850 (timed out), and only a whole-card
update (``update_card``) still changes the text. Failures are typed as for messages
(``openapi.py``): ``FeishuRateLimited``, ``FeishuTransientError``, ``FeishuBusinessError``.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from ..errors import FeishuTransientError
from . import openapi

#: Feishu's per-card limit on operations.
OPERATIONS_PER_SECOND = 10
#: Streaming mode lasts this long after it was turned on.
STREAMING_WINDOW = timedelta(minutes=10)
SEQUENCE_NOT_INCREASING = 300317
STREAMING_CLOSED = 300309
STREAMING_TIMED_OUT = 200850
CARD_NOT_FOUND = 200740
UUID_REUSED = 200770
#: The codes that mean "streaming is off": only a whole-card update changes the card now.
STREAMING_OFF = (STREAMING_CLOSED, STREAMING_TIMED_OUT)


def create_card(app: str, card: dict[str, Any]) -> str:
    """Create a card entity from card JSON 2.0 (``POST /cards``); return its ``card_id``.
    Create takes no uuid: a create whose answer was lost leaves an entity nobody sends."""
    data = json.dumps(card, ensure_ascii=False, separators=(",", ":"))

    def request() -> Any:
        from lark_oapi.api.cardkit.v1 import CreateCardRequest, CreateCardRequestBody

        body = CreateCardRequestBody.builder().type("card_json").data(data).build()
        return CreateCardRequest.builder().request_body(body).build()

    answer = openapi.call(app, "create a card", request)
    card_id = answer.get("card_id") if isinstance(answer, dict) else None
    if not isinstance(card_id, str) or not card_id:
        raise FeishuTransientError(
            f"Feishu answered success to creating a card (app {app!r}) without a card id.",
            app=app,
            status=200,
            maybe_applied=True,
        )
    return card_id


def stream_text(
    app: str, card_id: str, element_id: str, content: str, *, sequence: int, uuid: str
) -> None:
    """Set the streamed text of an element (``PUT /cards/:card_id/elements/:element_id/
    content``): ``content`` is the whole text so far; the card shows it growing."""

    def request() -> Any:
        from lark_oapi.api.cardkit.v1 import (
            ContentCardElementRequest,
            ContentCardElementRequestBody,
        )

        body = (
            ContentCardElementRequestBody.builder()
            .content(content)
            .sequence(sequence)
            .uuid(uuid)
            .build()
        )
        return (
            ContentCardElementRequest.builder()
            .card_id(card_id)
            .element_id(element_id)
            .request_body(body)
            .build()
        )

    openapi.call(app, f"stream into card {card_id}", request)


def card_settings(
    app: str, card_id: str, settings: dict[str, Any], *, sequence: int, uuid: str
) -> None:
    """Change a card's settings (``PATCH /cards/:card_id/settings``), e.g. turn streaming
    mode off: ``{"config": {"streaming_mode": False}}``."""
    text = json.dumps(settings, ensure_ascii=False, separators=(",", ":"))

    def request() -> Any:
        from lark_oapi.api.cardkit.v1 import SettingsCardRequest, SettingsCardRequestBody

        body = (
            SettingsCardRequestBody.builder().settings(text).sequence(sequence).uuid(uuid).build()
        )
        return SettingsCardRequest.builder().card_id(card_id).request_body(body).build()

    openapi.call(app, f"change the settings of card {card_id}", request)


def update_card(app: str, card_id: str, card: dict[str, Any], *, sequence: int, uuid: str) -> None:
    """Replace a card entity's whole JSON (``PUT /cards/:card_id``): what still changes the
    text once streaming mode is off."""
    data = json.dumps(card, ensure_ascii=False, separators=(",", ":"))

    def request() -> Any:
        from lark_oapi.api.cardkit.v1 import Card, UpdateCardRequest, UpdateCardRequestBody

        entity = Card.builder().type("card_json").data(data).build()
        body = UpdateCardRequestBody.builder().card(entity).sequence(sequence).uuid(uuid).build()
        return UpdateCardRequest.builder().card_id(card_id).request_body(body).build()

    openapi.call(app, f"update card {card_id}", request)
