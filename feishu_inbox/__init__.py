"""feishu_inbox: a durable, ordered, exactly-once inbox for Feishu (Lark) webhook events."""

from __future__ import annotations

from .backfills import backfill, export
from .errors import (
    Cancelled,
    ChildFailed,
    LeaseLost,
    NoWaiter,
    QuestionExpired,
    Superseded,
    TimedOut,
    WaitRefused,
    WaitTimedOut,
    WorkflowRefused,
)
from .feishu.asks import Answer, ask
from .feishu.protocol import CardAction, EventKeys, card_callback, event_keys
from .feishu.replies import client, reply, send
from .feishu.streams import stream_reply, stream_send
from .feishu.turns import stop_button, typing
from .ledger.limits import RateLimit
from .ledger.retry import RetryAfter, RetryAt, RetryPolicy
from .ledger.tenants import tenant
from .runtime.context import Event
from .runtime.handlers import checkpoint, effect
from .runtime.registry import handler
from .runtime.steps import step
from .runtime.turns import Coalesce, Stopped, Turn
from .runtime.waits import signal, sleep, sleep_until, wait_for
from .schedules import schedule
from .workflows import (
    BatchHandle,
    Child,
    JobSpec,
    batch,
    chain,
    job,
    outcomes,
    spawn,
    spawn_jobs,
    spawn_many,
    wait_all,
    wait_any,
)
from .workflows.cleanup import on_finish

__version__ = "0.2.0"

__all__ = [
    "Answer",
    "BatchHandle",
    "Cancelled",
    "CardAction",
    "Child",
    "ChildFailed",
    "Coalesce",
    "Event",
    "EventKeys",
    "JobSpec",
    "LeaseLost",
    "NoWaiter",
    "QuestionExpired",
    "RateLimit",
    "RetryAfter",
    "RetryAt",
    "RetryPolicy",
    "Stopped",
    "Superseded",
    "TimedOut",
    "Turn",
    "WaitRefused",
    "WaitTimedOut",
    "WorkflowRefused",
    "ask",
    "backfill",
    "batch",
    "card_callback",
    "chain",
    "checkpoint",
    "client",
    "effect",
    "event_keys",
    "export",
    "handler",
    "job",
    "on_finish",
    "outcomes",
    "reply",
    "schedule",
    "send",
    "signal",
    "sleep",
    "sleep_until",
    "spawn",
    "spawn_jobs",
    "spawn_many",
    "step",
    "stop_button",
    "stream_reply",
    "stream_send",
    "tenant",
    "typing",
    "wait_all",
    "wait_any",
    "wait_for",
]
