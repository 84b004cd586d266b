"""feishu_inbox: a durable, ordered, exactly-once inbox for Feishu (Lark) webhook events."""

from __future__ import annotations

__version__ = "0.1.0"
