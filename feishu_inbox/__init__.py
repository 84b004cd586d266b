"""feishu_inbox: a durable, ordered, exactly-once inbox for Feishu (Lark) webhook events."""

from __future__ import annotations

from .errors import (
    Cancelled,
    LeaseLost,
    NoWaiter,
    QuestionExpired,
    Superseded,
    TimedOut,
    WaitRefused,
    WaitTimedOut,
)
from .feishu.asks import Answer, ask
from .feishu.protocol import CardAction, EventKeys, card_callback, event_keys
from .feishu.replies import client, reply, send
from .feishu.streams import stream_reply, stream_send
from .ledger.limits import RateLimit
from .ledger.retry import RetryAfter, RetryAt, RetryPolicy
from .runtime.context import Event
from .runtime.handlers import checkpoint, effect
from .runtime.registry import handler
from .runtime.steps import step
from .runtime.waits import signal, sleep, sleep_until, wait_for
from .schedules import schedule

__version__ = "0.2.0"

__all__ = [
    "Answer",
    "Cancelled",
    "CardAction",
    "Event",
    "EventKeys",
    "LeaseLost",
    "NoWaiter",
    "QuestionExpired",
    "RateLimit",
    "RetryAfter",
    "RetryAt",
    "RetryPolicy",
    "Superseded",
    "TimedOut",
    "WaitRefused",
    "WaitTimedOut",
    "ask",
    "card_callback",
    "checkpoint",
    "client",
    "effect",
    "event_keys",
    "handler",
    "reply",
    "schedule",
    "send",
    "signal",
    "sleep",
    "sleep_until",
    "step",
    "stream_reply",
    "stream_send",
    "wait_for",
]
