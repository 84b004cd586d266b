"""Declaring schedules in tests (the ``registry`` fixture of conftest forgets them after)."""

from __future__ import annotations

from typing import Any

from feishu_inbox import schedules
from feishu_inbox.schedules import ScheduleSpec


def noop(event: Any) -> None:
    """What the in-process test schedules run (never: those tests only enqueue)."""


def declare(name: str, cron: str = "* * * * *", **options: Any) -> ScheduleSpec:
    """Declare a schedule running ``noop``, in UTC unless ``tz`` says otherwise."""
    spec = schedules.declare(name, cron, noop, **{"tz": "UTC", **options})
    assert spec is not None, schedules.problems()
    return spec
