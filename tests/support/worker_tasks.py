"""django.tasks tasks for the tests (module level: the worker imports them by path).

Each records what it does to ``$WORKER_TEST_DIR/events.log`` (as ``worker_handlers.py``), so a
test can wait on it, and may wait on a gate file the test creates.
"""

from __future__ import annotations

import os
import time
from typing import Any

import feishu_inbox
from feishu_inbox.ledger.retry import RetryPolicy
from feishu_inbox.tasks import retry, timeout
from tests.support.worker_handlers import record, wait_gate

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef]


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def noop() -> None:
    return None


@task(queue_name="emails")
def send_email(to: str) -> str:
    record("email", to, os.getpid())
    return f"sent to {to}"


@task
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@task
@retry(RetryPolicy(attempts=2, backoff="fixed", delay=1, jitter=False))
def nightly_report() -> str:
    """What a schedule declared in settings runs (tests/schedules/test_schedules.py)."""
    return "report sent"


@task
def fail(message: str) -> None:
    raise ValueError(message)


@task
@retry(RetryPolicy(attempts=3, backoff="fixed", delay=0.1, jitter=False))
def flaky(name: str, failures: int) -> str:
    """Fails ``failures`` times (counted in the log), then returns."""
    record("flaky", name, os.getpid())
    from tests.support.worker_handlers import DIR

    lines = (DIR / "events.log").read_text().splitlines()
    seen = sum(1 for line in lines if line.split()[:2] == ["flaky", name])
    if seen <= failures:
        raise RuntimeError(f"failure {seen}")
    return f"{name} after {seen}"


@task
def returns_object() -> object:
    return object()


@task(takes_context=True)
def with_context(context: Any, label: str) -> dict[str, Any]:
    return {"label": label, "attempt": context.attempt, "id": context.task_result.id}


@task
async def async_add(a: int, b: int) -> int:
    return a + b


@task
async def async_effect(a: int) -> int:
    """An async task whose effect's ledger writes run on the event loop's executor threads."""
    async with feishu_inbox.effect("add"):
        return a + 1


@task
def logged(name: str, pause: float = 0.0) -> str:
    """Records its start and end (with the time), for ordering tests."""
    record("task_start", name, os.getpid(), time.monotonic_ns())
    if pause:
        time.sleep(pause)  # the work a task does, not synchronisation
    record("task_end", name, os.getpid(), time.monotonic_ns())
    return name


@task
@retry(RetryPolicy(attempts=2, backoff="fixed", delay=0.1, jitter=False))
def gated(name: str) -> str:
    """Waits on the gate ``name`` (a test kills its worker meanwhile)."""
    record("task_start", name, os.getpid(), time.monotonic_ns())
    wait_gate(name)
    record("task_end", name, os.getpid(), time.monotonic_ns())
    return name


@task
def gated_effect(name: str) -> str:
    """Waits on the gate ``name`` inside an effect (a test kills its worker meanwhile)."""
    with feishu_inbox.effect():
        record("in_effect", name, os.getpid())
        wait_gate(name)
    return name


@task
def stamp() -> None:
    """Records when it started (monotonic ns), for the enqueue-to-start latency test."""
    record("stamp", os.getpid(), time.monotonic_ns())


@timeout(1.5)
@task
def hangs(seconds: float) -> None:
    """Sleeps past its timeout of 1.5 s without a checkpoint: the worker stops it."""
    time.sleep(seconds)


@task
def collect(batch: dict[str, Any], tag: str = "") -> int:
    """A batch's callback: records the summary it was given (tests/workflows)."""
    record("collected", tag, batch["id"], batch["total"], sorted(batch["counts"].items()))
    return int(batch["total"])
