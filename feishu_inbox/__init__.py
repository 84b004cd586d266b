"""feishu_inbox: a durable, ordered, exactly-once inbox for Feishu (Lark) webhook events."""

from __future__ import annotations

from .feishu import CardAction, EventKeys, card_callback, event_keys

__version__ = "0.1.0"

__all__ = ["CardAction", "EventKeys", "card_callback", "event_keys"]
