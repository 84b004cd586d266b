"""feishu_inbox: a durable, ordered, exactly-once inbox for Feishu (Lark) webhook events."""

from __future__ import annotations

from .errors import Cancelled, LeaseLost, Superseded, TimedOut
from .feishu.protocol import CardAction, EventKeys, card_callback, event_keys
from .feishu.replies import client, reply, send
from .feishu.streams import stream_reply, stream_send
from .ledger.limits import RateLimit
from .ledger.retry import RetryAfter, RetryAt, RetryPolicy
from .runtime.context import Event
from .runtime.handlers import checkpoint, effect
from .runtime.registry import handler
from .runtime.steps import step
from .schedules import schedule

__version__ = "0.2.0"

__all__ = [
    "Cancelled",
    "CardAction",
    "Event",
    "EventKeys",
    "LeaseLost",
    "RateLimit",
    "RetryAfter",
    "RetryAt",
    "RetryPolicy",
    "Superseded",
    "TimedOut",
    "card_callback",
    "checkpoint",
    "client",
    "effect",
    "event_keys",
    "handler",
    "reply",
    "schedule",
    "send",
    "step",
    "stream_reply",
    "stream_send",
]
