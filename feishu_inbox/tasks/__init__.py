"""A ``django.tasks`` backend on the ledger (SPEC §9): a site's own background work gets the
leases, fencing, effects, steps, retry policies, worker, admin and operator actions of Feishu
events.

    TASKS = {
        "default": {
            "BACKEND": "feishu_inbox.tasks.LedgerBackend",
            "QUEUES": ["default", "emails"],
        }
    }

    from django.tasks import task            # Django 6; on 5.2: from django_tasks import task
    from feishu_inbox.tasks import ordering_key, retry

    @task
    @retry(RetryPolicy(attempts=5, backoff="exponential", delay=10))
    def send_digest(user_id: int) -> int: ...

    with transaction.atomic():
        order.save()
        with ordering_key(f"user:{order.user_id}"):   # one at a time per user, in order
            send_digest.enqueue(order.user_id)          # exists only if this block commits

``manage.py runworker`` runs tasks beside Feishu events (``--queue`` for some queues only).
The ledger's side is ``jobs`` (a task stored, run and read back, as a kind of job); the
framework's side is ``backend`` (``LedgerBackend``); ``framework`` finds whichever tasks
framework the site has (Django 6's, or the backport). This module imports neither the
framework nor the backend: a site without the ``tasks`` extra imports it (the admin's queue
filter, the system checks) and never needs ``django-tasks``; ``LedgerBackend`` and its errors
load on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import ConfigurationError
from ..ledger.retry import RetryPolicy

if TYPE_CHECKING:
    from .backend import InvalidLedgerTask, LedgerBackend, UnserializableTaskArguments

__all__ = [
    "BACKEND",
    "InvalidLedgerTask",
    "LedgerBackend",
    "UnserializableTaskArguments",
    "ordering_key",
    "retry",
    "timeout",
]

F = TypeVar("F")

#: Matches task_jobs (kept here too: this module must not import the models at import time).
_RETRY_ATTRIBUTE = "_feishu_inbox_retry"
TIMEOUT_ATTRIBUTE = "_feishu_inbox_timeout"  # tasks/jobs.py reads it

#: This backend's path in settings.TASKS.
BACKEND = f"{__name__}.LedgerBackend"
#: The names of tasks/backend.py, which subclass the framework's: loaded when first asked for
#: (Django's import_string of BACKEND, a site's ``except InvalidLedgerTask``).
_BACKEND_NAMES = ("InvalidLedgerTask", "LedgerBackend", "UnserializableTaskArguments")


def __getattr__(name: str) -> Any:
    if name in _BACKEND_NAMES:
        from . import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def bad_queue_names(queues: list[str]) -> list[str]:
    """Queue names the ledger cannot use: its partition keys are ``task:<queue>:…``."""
    return sorted(q for q in queues if not isinstance(q, str) or not q or ":" in q or len(q) > 64)


def configured_queues() -> list[str]:
    """The queues of every task backend of this site that is the ledger."""
    from django.conf import settings

    found: set[str] = set()
    for params in getattr(settings, "TASKS", {}).values():
        if params.get("BACKEND") == BACKEND:
            found.update(params.get("QUEUES") or ["default"])
    return sorted(found)


_ordering: ContextVar[str | None] = ContextVar("feishu_inbox_task_ordering", default=None)


def current_ordering_key() -> str | None:
    """The key of the innermost ``ordering_key`` block around the caller, else None."""
    return _ordering.get()


def _function_of(fn: Any) -> Any:
    """The function under ``@task`` (a decorator above it receives the Task), else ``fn``."""
    from .framework import framework

    try:
        task_class = framework().Task
    except ConfigurationError:  # no framework: fn cannot be a Task
        return fn
    return fn.func if isinstance(fn, task_class) else fn


@contextmanager
def ordering_key(key: str) -> Iterator[None]:
    """Tasks enqueued inside this block (of one queue) with the same key run one at a time, in
    enqueue order; a failed or unknown one holds the later ones until an operator acts.
    Tasks enqueued outside any such block run in parallel."""
    if not isinstance(key, str) or not key:
        from .backend import InvalidLedgerTask

        raise InvalidLedgerTask(
            f"An ordering key must be a non-empty string (got {key!r:.80}).",
            fix="Name what the tasks share, e.g. ordering_key(f'user:{user.pk}').",
        )
    token = _ordering.set(key)
    try:
        yield
    finally:
        _ordering.reset(token)


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
        target = _function_of(fn)
        setattr(target, _RETRY_ATTRIBUTE, policy)
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
        target = _function_of(fn)
        setattr(target, TIMEOUT_ATTRIBUTE, float(seconds))
        return fn

    return mark


def retry_policy_of(task: Any) -> RetryPolicy:
    """The task's ``@retry`` policy, else the tasks' default (run once)."""
    from . import jobs as task_jobs

    policy: RetryPolicy = getattr(task.func, _RETRY_ATTRIBUTE, None) or task_jobs.DEFAULT_POLICY
    return policy
