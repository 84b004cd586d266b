"""django.tasks tasks as ledger jobs (SPEC §9): how a task is stored, run and read back.

``tasks/__init__.py`` is the framework's side (the backend); this module is the ledger's side.
A task is a job of its own kind, with the same leases, fencing, effects, steps, retry policy,
admin and operator actions as a Feishu event:

- app ``django.tasks``; event id and dedupe key: the task result's id;
- event type ``task:<module path of the task function>``;
- partition key ``task:<queue>:<ordering key>``: tasks of one key (and queue) run one at a
  time, in enqueue order; without a key, ``task:<queue>:~<result id>``, a partition of its
  own, so tasks run in parallel. ``runworker --queue`` claims by this prefix;
- payload: the arguments, the backend, queue, priority, run_after and ordering key;
- the return value (when not None) is memoized as the job's step ``RETURN_STEP``, in the
  ledger until retention purges the job; so an attempt that returned but whose finish was lost
  (crash, database blink) never runs the task again, it returns the stored value.

Nothing here imports the framework, the models or the store at import time: the backend is
made when a task module is imported (``@task`` validates), perhaps before the apps are ready;
and the app registers this kind whether the site uses tasks or not.
"""

from __future__ import annotations

import time
import traceback
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..errors import Cancelled, LedgerError
from ..ledger.kinds import TASK_PREFIX, JobKind, queue_prefix
from ..ledger.retry import RetryPolicy
from ..runtime import context, steps
from ..task_jobs import (
    HandedBack,
    LeaseExpired,
    LeaseExpiredAfterSideEffect,
    TaskEnded,
    UncertainEffect,
    UnknownExpired,
    WorkerCrashed,
)

if TYPE_CHECKING:
    from ..ledger.rules import EnqueueResult
    from ..models import EventJob

APP = "django.tasks"
PREFIX = TASK_PREFIX
RETURN_STEP = "django.tasks:return_value"
#: The attribute ``tasks.retry`` sets on a task function.
RETRY_ATTRIBUTE = "_feishu_inbox_retry"
TIMEOUT_ATTRIBUTE = "_feishu_inbox_timeout"  # tasks.timeout() sets it
#: A task without its own retry policy runs once, as the framework's other backends do.
DEFAULT_POLICY = RetryPolicy(attempts=1)
#: Column lengths (models.EventJob): event_type 128, partition_key 255.
TASK_PATH_LIMIT = 128 - len(PREFIX)
PARTITION_LIMIT = 255


def partition_key(queue: str, ordering_key: str | None, result_id: str) -> str:
    return queue_prefix(queue) + (ordering_key if ordering_key is not None else f"~{result_id}")


def enqueue(
    *,
    result_id: str,
    task_path: str,
    queue: str,
    ordering_key: str | None,
    payload: dict[str, Any],
    run_after: datetime | None,
    priority: int,
    max_attempts: int,
) -> EnqueueResult:
    """Store a task as a job, in the caller's transaction if there is one (then it exists only
    if the caller commits, and PostgreSQL's NOTIFY is delivered at that commit). Returns the
    job's id and the receipt time the ledger keeps (one round trip for a plain task)."""
    from ..ledger import rules as ledger

    return ledger.enqueue_ranked(
        run_after=run_after,
        priority=priority,
        event_id=result_id,
        event_type=PREFIX + task_path,
        partition_key=partition_key(queue, ordering_key, result_id),
        payload=payload,
        app=APP,
        max_attempts=max_attempts,
    )


# --- running a task (the kind's handler, called by the worker) ------------------------------


def load_task(task_path: str) -> Any:
    """The Task object at this module path (what the worker runs)."""
    from django.utils.module_loading import import_string

    from .framework import framework

    found = import_string(task_path)
    if not isinstance(found, framework().Task):
        raise LedgerError(
            f"{task_path} is not a task (a {type(found).__name__}); the job cannot run.",
            fix="Decorate the function with @task, or cancel the job.",
        )
    return found


def run(event: context.Event) -> None:
    """Run the task of a claimed job; record its return value (a step) when it returns.

    The framework's ``task_started`` is sent before the task runs and ``task_finished`` once
    the ledger has written the attempt's end, if it is final (SUCCESSFUL or FAILED; a failure
    that is retried sends none): with them come the framework's own log records (its
    ``django.tasks`` logger: RUNNING, then SUCCESSFUL or FAILED with the traceback)."""
    from .framework import framework

    fw = framework()
    fw_task = load_task(event.event_type[len(PREFIX) :])
    ctx = context.current()
    found, _ = steps.memoized(ctx, RETURN_STEP)
    if found:  # an earlier attempt returned; its finish was lost
        return
    # A first attempt's result is made from what the worker holds; a retry's (its earlier
    # attempts' workers and errors) and a context's are read from the ledger.
    if fw_task.takes_context or event.attempt > 1:
        result = read_result(event.event_id)
    else:
        result = running_result(event, fw_task, ctx.lease.worker_id)
    sender = type(fw.task_backends[result.backend])  # the framework's backends send their class
    ctx.on_end = lambda state, error: _send_finished(sender, result, state, error)
    fw.task_started.send(sender=sender, task_result=result)
    args, kwargs = event.payload.get("args", []), event.payload.get("kwargs", {})
    if fw_task.takes_context:
        args = [fw.TaskContext(task_result=result), *args]
    started = time.monotonic()
    value = fw_task.call(*args, **kwargs)
    if value is not None:
        try:
            value = fw.normalize_json(value)
        except (TypeError, ValueError) as exc:  # not JSON data: the task fails
            raise TypeError(
                f"The return value of {fw_task.module_path} is not JSON serializable: object "
                f"of type {type(value).__name__} is not JSON serializable ({exc})."
            ) from exc
        steps.record(ctx, RETURN_STEP, value, time.monotonic() - started)
        object.__setattr__(result, "_return_value", value)


def running_result(event: context.Event, fw_task: Any, worker_id: str) -> Any:
    """The TaskResult of an attempt that starts now, made from what the worker holds (no
    query): what the signals carry and a ``takes_context`` task's context holds."""
    from django.utils import timezone

    from .framework import framework

    fw = framework()
    payload = event.payload
    now = timezone.now()
    return fw.TaskResult(
        task=_task_of(fw_task, payload),
        id=event.event_id,
        status=fw.TaskResultStatus.RUNNING,
        enqueued_at=event.received_at,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        backend=payload.get("backend"),
        errors=[],
        worker_ids=[worker_id],
    )


def _send_finished(sender: type, result: Any, state: str, error: BaseException | None) -> None:
    """The attempt's end is written: ``task_finished`` if the task will not run again."""
    from django.utils import timezone

    from ..models import Status
    from .framework import framework

    if state not in (Status.COMPLETED, Status.FAILED, Status.UNKNOWN):
        return  # retried (or handed back): it runs again, and finishes then
    fw = framework()
    ok = state == Status.COMPLETED and error is None
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(
        result, "status", fw.TaskResultStatus.SUCCESSFUL if ok else fw.TaskResultStatus.FAILED
    )
    if error is not None:
        class_path, text = describe_error(error)
        result.errors.append(fw.TaskError(exception_class_path=class_path, traceback=text))
    fw.task_finished.send(sender=sender, task_result=result)


def _task_of(fw_task: Any, payload: dict[str, Any]) -> Any:
    """The task as it was enqueued (its queue, priority, run_after and backend)."""
    run_after = payload.get("run_after")
    return fw_task.using(
        queue_name=payload.get("queue_name"),
        priority=payload.get("priority"),
        run_after=datetime.fromisoformat(run_after) if run_after else None,
        backend=payload.get("backend"),
    )


def policy(event_type: str) -> RetryPolicy | None:
    """The task's own retry policy (``tasks.retry``), else one attempt."""
    try:
        fw_task = load_task(event_type[len(PREFIX) :])
    except Exception:  # the code is gone: the job fails, its attempts say why
        return DEFAULT_POLICY
    return getattr(fw_task.func, RETRY_ATTRIBUTE, None) or DEFAULT_POLICY


def timeout(event_type: str) -> float | None:
    """The task's own ``@timeout``, in seconds (None: none)."""
    try:
        fw_task = load_task(event_type[len(PREFIX) :])
    except Exception:
        return None
    value = getattr(fw_task.func, TIMEOUT_ATTRIBUTE, None)
    return float(value) if isinstance(value, int | float) else None


def describe_error(error: BaseException) -> tuple[str, str]:
    """What a failed attempt of a task records: the exception's dotted class path and its
    traceback (the framework's TaskError), the end of it when it is long."""
    cls = type(error)
    text = "".join(traceback.format_exception(error))
    if len(text) > 4000:
        text = "…" + text[-3999:]
    return f"{cls.__module__}.{cls.__qualname__}"[:128], text


#: django.tasks tasks, as a kind of job (registered in ``AppConfig.ready``).
TASK_KIND = JobKind(
    "task",
    "django.tasks tasks",
    PREFIX,
    run=run,
    policy=policy,
    timeout=timeout,
    describe_error=describe_error,
    can_wait=False,  # the framework's result has no waiting state: a wait is refused
)


# --- reading a result ---------------------------------------------------------------------------


_LEDGER_CAUSES = {
    c.__name__: c
    for c in (
        LeaseExpired,
        WorkerCrashed,
        LeaseExpiredAfterSideEffect,
        UncertainEffect,
        HandedBack,
        UnknownExpired,
    )
}


def error_class_path(error_type: str) -> str:
    """A dotted exception class path for an error type the ledger recorded."""
    if "." in error_type:
        return error_type
    if error_type == "Cancelled":
        return f"{Cancelled.__module__}.Cancelled"
    cls = _LEDGER_CAUSES.get(error_type, TaskEnded)
    return f"{cls.__module__}.{cls.__qualname__}"


def task_status(job: EventJob) -> str:
    """The framework's status of a job: READY, RUNNING, SUCCESSFUL or FAILED.

    ``unknown`` reads FAILED (it will not run again by itself: an operator decides); a job an
    operator reconciled as applied reads SUCCESSFUL; cancelled or discarded ones read FAILED.
    """
    from ..models import Resolution, Status

    if job.status in (Status.QUEUED, Status.RETRY_WAIT):
        return "READY"
    if job.status == Status.RUNNING:
        return "RUNNING"
    if job.status == Status.COMPLETED and (
        not job.error_type or job.resolution == Resolution.APPLIED
    ):
        return "SUCCESSFUL"
    return "FAILED"


def find_job(result_id: str) -> EventJob | None:
    from ..models import EventJob

    return EventJob.objects.filter(app=APP, dedupe_key=result_id).first()


def read_result(result_id: str) -> Any:
    """The framework's TaskResult of a task, read from the ledger (raises the framework's
    TaskResultDoesNotExist when there is no such task, or it was purged)."""
    from django.db.models import JSONField, OuterRef, Subquery

    from ..models import Attempt, EventJob, Status, Step
    from .framework import framework

    fw = framework()
    job = None
    if isinstance(result_id, str):
        # the return value on the same round trip; the attempts only of a job that ran
        returned = Step.objects.filter(job_id=OuterRef("pk"), name=RETURN_STEP)
        job = (
            EventJob.objects.filter(app=APP, dedupe_key=result_id)
            .annotate(
                return_value=Subquery(returned.values("result")[:1], output_field=JSONField())
            )
            .first()
        )
    if job is None:
        raise fw.TaskResultDoesNotExist(result_id)
    payload = job.payload
    ran = job.attempt > 0 or job.claimed_at is not None
    attempts = list(Attempt.objects.filter(job_id=job.pk).order_by("number", "id")) if ran else []
    status = task_status(job)
    errors = [
        fw.TaskError(exception_class_path=error_class_path(a.error_type), traceback=a.error_message)
        for a in attempts
        if a.error_type
    ]
    if status == "FAILED" and job.error_type and not any(a.error_type for a in attempts[-1:]):
        errors.append(
            fw.TaskError(
                exception_class_path=error_class_path(job.error_type),
                traceback=job.error_message,
            )
        )
    worker_ids = [a.worker_id for a in attempts]
    if job.status == Status.RUNNING:
        worker_ids.append(job.worker_id)
    fw_task = _task_of(load_task(job.event_type[len(PREFIX) :]), payload)
    result = fw.TaskResult(
        task=fw_task,
        id=result_id,
        status=fw.TaskResultStatus(status),
        enqueued_at=job.received_at,
        started_at=attempts[0].started_at if attempts else job.claimed_at,
        finished_at=job.finished_at if status in ("SUCCESSFUL", "FAILED") else None,
        last_attempted_at=job.claimed_at,
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        backend=payload.get("backend"),
        errors=errors,
        worker_ids=worker_ids,
    )
    if status == "SUCCESSFUL":
        object.__setattr__(result, "_return_value", job.return_value)
    return result
