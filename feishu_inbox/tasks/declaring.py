"""How a task declares its retry policy and timeout (``@retry``, ``@timeout`` under
``@task``), read by the ledger's side (``jobs``) and the schedules. Needs no tasks framework at
import time: a site without the ``tasks`` extra may import it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from ..errors import ConfigurationError
from ..ledger.retry import RetryPolicy

F = TypeVar("F")

#: Matches task_jobs (kept here too: this module must not import the models at import time).
RETRY_ATTRIBUTE = "_feishu_inbox_retry"
TIMEOUT_ATTRIBUTE = "_feishu_inbox_timeout"  # tasks/jobs.py reads it


def function_of(fn: Any) -> Any:
    """The function under ``@task`` (a decorator above it receives the Task), else ``fn``."""
    from .framework import framework

    try:
        task_class = framework().Task
    except ConfigurationError:  # no framework: fn cannot be a Task
        return fn
    return fn.func if isinstance(fn, task_class) else fn


def retry(policy: RetryPolicy) -> Callable[[F], F]:
    """Declare a task's retry policy: put ``@retry(RetryPolicy(...))`` under ``@task``.
    Without one a task runs once (an exception makes it FAILED), as on other backends."""
    problems = policy.problems() if isinstance(policy, RetryPolicy) else ["not a RetryPolicy"]
    if problems:
        raise ConfigurationError(
            f"Invalid task retry policy {policy!r}: " + "; ".join(problems) + ".",
            fix="Pass a valid RetryPolicy: @retry(RetryPolicy(attempts=5)).",
        )

    def mark(fn: F) -> F:
        target = function_of(fn)
        setattr(target, RETRY_ATTRIBUTE, policy)
        return fn

    return mark


def timeout(limit: timedelta | float) -> Callable[[F], F]:
    """Declare a task's timeout (a ``timedelta`` or seconds): put ``@timeout(...)`` under
    ``@task``. An attempt still running then is stopped as a handler's is (README "What a
    handler does") and retried by the task's ``@retry`` policy."""
    seconds = limit.total_seconds() if isinstance(limit, timedelta) else limit
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise ConfigurationError(
            f"Invalid task timeout {limit!r}.",
            fix="Pass a positive timedelta or number of seconds: @timeout(timedelta(minutes=5)).",
        )

    def mark(fn: F) -> F:
        target = function_of(fn)
        setattr(target, TIMEOUT_ATTRIBUTE, float(seconds))
        return fn

    return mark


def retry_policy_of(task: Any) -> RetryPolicy:
    """The task's ``@retry`` policy, else the tasks' default (run once)."""
    from . import jobs as task_jobs

    policy: RetryPolicy = getattr(task.func, RETRY_ATTRIBUTE, None) or task_jobs.DEFAULT_POLICY
    return policy
