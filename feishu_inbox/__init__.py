"""feishu_inbox: a durable, ordered, exactly-once inbox for Feishu (Lark) webhook events."""

from __future__ import annotations

from .errors import LeaseLost, Superseded
from .feishu import CardAction, EventKeys, card_callback, event_keys
from .handlers import Event, checkpoint, effect, handler

__version__ = "0.1.0"

__all__ = [
    "CardAction",
    "Event",
    "EventKeys",
    "LeaseLost",
    "Superseded",
    "card_callback",
    "checkpoint",
    "effect",
    "event_keys",
    "handler",
]
