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
The ledger's rules and storage are in ``tasks/jobs.py``; this module is the framework's side.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from typing import Any, TypeVar

from django.core import checks

from ..errors import ConfigurationError, LedgerError
from ..ledger.retry import RetryPolicy
from .framework import framework

_fw = framework()
#: The framework's classes this module subclasses (from django.tasks or the backport).
_InvalidTask: Any = _fw.InvalidTask
_BaseTaskBackend: Any = _fw.BaseTaskBackend
F = TypeVar("F")

#: Matches task_jobs (kept here too: this module must not import the models at import time).
_RETRY_ATTRIBUTE = "_feishu_inbox_retry"
TIMEOUT_ATTRIBUTE = "_feishu_inbox_timeout"  # tasks/jobs.py reads it
_TASK_PATH_LIMIT = 123
_PARTITION_LIMIT = 255

#: This backend's path in settings.TASKS.
BACKEND = f"{__name__}.LedgerBackend"


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


class InvalidLedgerTask(_InvalidTask, LedgerError):
    """A task, its arguments or its ordering key cannot be stored in the ledger; nothing was
    enqueued. The framework's ``InvalidTask`` (callers catch that) with a catalogued code."""

    code = "invalid_task"

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        LedgerError.__init__(self, message, fix=fix)


class UnserializableTaskArguments(InvalidLedgerTask, TypeError):
    """A task's arguments are not JSON data; nothing was enqueued. A ``TypeError``, as the
    framework's own backends raise for them (code written against the framework catches that),
    and the framework's ``InvalidTask``."""


@contextmanager
def ordering_key(key: str) -> Iterator[None]:
    """Tasks enqueued inside this block (of one queue) with the same key run one at a time, in
    enqueue order; a failed or unknown one holds the later ones until an operator acts.
    Tasks enqueued outside any such block run in parallel."""
    if not isinstance(key, str) or not key:
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
        target = fn.func if isinstance(fn, _fw.Task) else fn  # above @task: its function
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
        target = fn.func if isinstance(fn, _fw.Task) else fn  # above @task: its function
        setattr(target, TIMEOUT_ATTRIBUTE, float(seconds))
        return fn

    return mark


def retry_policy_of(task: Any) -> RetryPolicy:
    """The task's ``@retry`` policy, else the tasks' default (run once)."""
    from . import jobs as task_jobs

    policy: RetryPolicy = getattr(task.func, _RETRY_ATTRIBUTE, None) or task_jobs.DEFAULT_POLICY
    return policy


class LedgerBackend(_BaseTaskBackend):
    """Tasks are ledger jobs: enqueued in the caller's transaction, run by ``runworker``."""

    #: ``run_after`` holds a task until then (the claim's due time; an idle worker wakes for it).
    supports_defer = True
    #: ``async def`` tasks run on the worker's event loop thread, beside sync ones.
    supports_async_task = True
    #: ``get_result()`` reads the ledger: one query for a task that has not run, two after.
    supports_get_result = True
    #: The claim takes due work by priority, then receipt; a priority never reorders the tasks
    #: of one ordering key (they run in enqueue order).
    supports_priority = True

    def validate_task(self, task: Any) -> None:
        super().validate_task(task)
        problems = []
        if len(task.module_path) > _TASK_PATH_LIMIT:
            problems.append(
                f"its module path {task.module_path!r} is longer than {_TASK_PATH_LIMIT} characters"
            )
        if not task.queue_name or ":" in task.queue_name or len(task.queue_name) > 64:
            problems.append(
                f"its queue name {task.queue_name!r} must be 1 to 64 characters without ':'"
            )
        if problems:
            raise InvalidLedgerTask(
                f"Task {task.module_path} cannot be stored in the ledger: "
                + "; ".join(problems)
                + ".",
                fix="Shorten the path, or rename the queue (in TASKS and in the task).",
            )

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        from . import jobs as task_jobs

        self.validate_task(task)
        try:
            args, kwargs = _fw.normalize_json(list(args)), _fw.normalize_json(dict(kwargs))
        except (TypeError, ValueError) as exc:
            raise UnserializableTaskArguments(
                f"The arguments of {task.module_path} are not JSON serializable ({exc}); "
                "nothing was enqueued.",
                fix="Pass ids, strings, numbers, lists and dicts; load objects in the task.",
            ) from exc
        result_id = uuid.uuid4().hex
        key = _ordering.get()
        partition = task_jobs.partition_key(task.queue_name, key, result_id)
        if len(partition) > _PARTITION_LIMIT:
            raise InvalidLedgerTask(
                f"The ordering key {key!r:.80} is too long for queue {task.queue_name!r} "
                f"(partition key {len(partition)} > {_PARTITION_LIMIT} characters).",
                fix="Use a shorter ordering key (an id, not a description).",
            )
        policy = retry_policy_of(task)
        stored = task_jobs.enqueue(
            result_id=result_id,
            task_path=task.module_path,
            queue=task.queue_name,
            ordering_key=key,
            payload={
                "args": args,
                "kwargs": kwargs,
                "backend": self.alias,
                "queue_name": task.queue_name,
                "priority": task.priority,
                "run_after": task.run_after.isoformat() if task.run_after else None,
                "takes_context": task.takes_context,
                "ordering_key": key,
            },
            run_after=task.run_after,
            priority=task.priority,
            max_attempts=policy.attempts,
        )
        result = _fw.TaskResult(
            task=task,
            id=result_id,
            status=_fw.TaskResultStatus.READY,
            enqueued_at=stored.received_at,  # the ledger's: what get_result() reads
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        _fw.task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        from . import jobs as task_jobs

        return task_jobs.read_result(result_id)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        from django.apps import apps

        found = list(super().check(**kwargs))
        if not apps.is_installed("feishu_inbox"):
            found.append(
                checks.Error(
                    f"Task backend {self.alias!r} is feishu_inbox.tasks.LedgerBackend, but "
                    "feishu_inbox is not in INSTALLED_APPS.",
                    hint="Add 'feishu_inbox' to INSTALLED_APPS and run migrate.",
                    id="feishu_inbox.E006",
                )
            )
        # Queue names are checked by feishu_inbox.checks (E007), from settings.TASKS.
        return found
