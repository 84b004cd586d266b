"""What a workflow enqueues (SPEC §9f): a handler's event type with a payload, or a
django.tasks ``@task`` with its arguments — as a child, a batch member, a callback or a link.

    feishu_inbox.job("tool.search", {"q": "weather"})            # a handler's event type
    feishu_inbox.job(send_digest, {"user_id": 7})                  # a @task: its kwargs
    feishu_inbox.job(send_digest, [7], key=f"user:{user.pk}")      # its args; an ordering key

A bare event type or task is a job with no arguments. A spec is checked when it is made
(``WorkflowRefused``: nothing stored), and stored as JSON until its job is enqueued (a
callback's, when its batch fires; a link's, when the link before it completed).

What a job made by a workflow gets beside its own arguments:

- a callback: the batch's summary (``{"id", "total", "counts", "failed"}``), as
  ``payload["batch"]`` of a handler, or the keyword argument ``batch`` of a task;
- a chain's link after the first: the previous link's result, as ``payload["previous"]``, or
  a task's first positional argument (as Celery's chains pass it).
"""

from __future__ import annotations

import uuid
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import LedgerError, WorkflowRefused
from ..ledger import tenants
from ..ledger.kinds import TASK_PREFIX, WORKFLOW_EVENT_PREFIX

#: The longest event type, app and ordering key (the job's columns).
EVENT_TYPE_LIMIT, APP_LIMIT, KEY_LIMIT = 128, 64, 200


@dataclass(frozen=True)
class JobSpec:
    """One job a workflow will enqueue (``feishu_inbox.job``)."""

    #: The handler's event type, or the task's module path.
    target: str
    is_task: bool = False
    payload: dict[str, Any] = field(default_factory=dict)
    args: list[Any] = field(default_factory=list)
    #: An ordering key: jobs of one key run one at a time, in order (None: in parallel).
    key: str | None = None
    #: The Feishu app a handler's job is for (None: its parent's, else "default").
    app: str | None = None
    #: Whose job it is (SPEC §9j; None: the tenant of whoever stores the spec: the enclosing
    #: ``feishu_inbox.tenant`` block's, or the running handler's job's).
    tenant: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The stored form; its tenant is decided now, by whoever stores it (a callback that
        fires later, outside any handler, is still the batch maker's tenant's). With
        TENANT_REQUIRED, a spec whose maker declares none is refused now
        (``job_tenant_required``, in the maker's transaction), never when a worker enqueues
        it later, where the refusal would stop the chain or the batch's callback."""
        return {
            "target": self.target,
            "task": self.is_task,
            "payload": self.payload,
            "args": self.args,
            "key": self.key,
            "app": self.app,
            "tenant": tenants.resolve(self.tenant, what=f"A workflow's job {self.target!r}"),
        }


def job(
    kind_or_task: Any,
    payload: dict[str, Any] | list[Any] | None = None,
    *,
    key: str | None = None,
    app: str | None = None,
    tenant: str | None = None,
) -> JobSpec:
    """A job spec: ``kind_or_task`` is a handler's event type (``payload``: its event's
    payload, a dict) or a ``@task`` (``payload``: its keyword arguments, a dict, or its
    positional arguments, a list). ``tenant``: whose job it is (None: its maker's)."""
    spec = _job(kind_or_task, payload, key=key, app=app)
    if tenant is None:
        return spec
    try:
        tenants.check(tenant)
    except LedgerError as exc:
        raise WorkflowRefused(exc.message, fix=exc.fix) from None
    return replace(spec, tenant=tenant)


def _job(
    kind_or_task: Any,
    payload: dict[str, Any] | list[Any] | None,
    *,
    key: str | None,
    app: str | None,
) -> JobSpec:
    if key is not None and (not isinstance(key, str) or not key or len(key) > KEY_LIMIT):
        raise WorkflowRefused(
            f"A job's key must be a string of 1 to {KEY_LIMIT} characters (got {key!r:.80}).",
            fix="Name what the jobs share, e.g. key=f'order:{order.pk}'.",
        )
    if app is not None and (not isinstance(app, str) or not app or len(app) > APP_LIMIT):
        raise WorkflowRefused(f"A job's app must be an app's name (got {app!r:.80}).")
    if isinstance(kind_or_task, str):
        return _handler_spec(kind_or_task, payload, key, app)
    task_path = _task_path(kind_or_task)
    args: list[Any]
    kwargs: dict[str, Any]
    if payload is None:
        args, kwargs = [], {}
    elif isinstance(payload, dict):
        args, kwargs = [], payload
    elif isinstance(payload, list | tuple):
        args, kwargs = list(payload), {}
    else:
        raise WorkflowRefused(
            f"A task's arguments are a dict (keyword) or a list (positional), not "
            f"{type(payload).__name__}.",
            fix="e.g. job(send_digest, {'user_id': 7}) or job(send_digest, [7]).",
        )
    return JobSpec(task_path, True, kwargs, args, key, app)


def _handler_spec(event_type: str, payload: Any, key: str | None, app: str | None) -> JobSpec:
    if not event_type or len(event_type) > EVENT_TYPE_LIMIT or event_type.startswith(TASK_PREFIX):
        raise WorkflowRefused(
            f"{event_type!r:.80} is not a handler's event type (1 to {EVENT_TYPE_LIMIT} "
            f"characters, not starting with {TASK_PREFIX!r}).",
            fix="Name the event type of a @feishu_inbox.handler, or pass the @task itself.",
        )
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise WorkflowRefused(
            f"A handler's job takes a dict payload, not {type(payload).__name__}.",
            fix="Wrap the values: {'items': [...]}.",
        )
    return JobSpec(event_type, False, payload, [], key, app)


def _task_path(task: Any) -> str:
    from ..tasks.framework import framework

    fw = framework()
    if not isinstance(task, fw.Task):
        raise WorkflowRefused(
            f"A workflow runs a handler's event type (a string) or a @task, not "
            f"{type(task).__name__}.",
            fix="Pass 'my.event_type' or a function decorated with @task.",
        )
    from ..tasks.backend import LedgerBackend

    backend = fw.task_backends[task.backend]
    if not isinstance(backend, LedgerBackend):
        raise WorkflowRefused(
            f"Task {task.module_path} runs on backend {task.backend!r}, which is not the "
            "ledger's: its end could not be counted.",
            fix="Use a task of a feishu_inbox.tasks.LedgerBackend backend (settings.TASKS).",
        )
    return str(task.module_path)


def spec_of(value: Any) -> dict[str, Any]:
    """A spec's stored form, from a ``JobSpec``, an event type or a task."""
    if isinstance(value, JobSpec):
        return value.as_dict()
    return job(value).as_dict()


# --- enqueue (the ledger calls this when a spawn, a batch or a firing needs a job) ------------


def enqueue(spec: dict[str, Any], extra: dict[str, Any]) -> int:
    """Enqueue a stored spec, in the caller's transaction; returns the job's id."""
    if spec["task"]:
        return _enqueue_task(spec, extra)
    from ..ledger import rules as ledger

    if "parent" in extra:  # a child: its name makes it the same job whatever happens
        event_id = (
            f"{WORKFLOW_EVENT_PREFIX}{extra['parent']}.{extra['generation']}:"
            f"{extra['name']}:{extra['index']}"
        )
        if len(event_id) > 128:
            event_id = f"{WORKFLOW_EVENT_PREFIX}{uuid.uuid4().hex}"
    else:
        event_id = f"{WORKFLOW_EVENT_PREFIX}{uuid.uuid4().hex}"
    payload = dict(spec["payload"])
    if "batch" in extra and isinstance(extra["batch"], dict):
        payload["batch"] = extra["batch"]
    if "previous" in extra:
        payload["previous"] = extra["previous"]
    if extra.get("ordered"):
        partition = str(extra["partition_key"])
    elif spec["key"]:
        partition = f"{WORKFLOW_EVENT_PREFIX}{spec['key']}"
    else:
        partition = f"{WORKFLOW_EVENT_PREFIX}~{event_id[len(WORKFLOW_EVENT_PREFIX) :]}"[:255]
    stored = ledger.enqueue(
        event_id=event_id,
        event_type=spec["target"],
        partition_key=partition,
        payload=payload,
        app=spec["app"] or extra.get("app") or "default",
        tenant=spec.get("tenant"),
    )
    return stored.job_id


def _enqueue_task(spec: dict[str, Any], extra: dict[str, Any]) -> int:
    from ..tasks import jobs as task_jobs
    from ..tasks.backend import ordering_key
    from ..tasks.framework import framework

    task = task_jobs.load_task(spec["target"])
    backend = framework().task_backends[task.backend]
    args, kwargs = list(spec["args"]), dict(spec["payload"])
    if "previous" in extra:
        args = [extra["previous"], *args]
    if "batch" in extra and isinstance(extra["batch"], dict):
        kwargs["batch"] = extra["batch"]
    with tenants.tenant(spec["tenant"]) if spec.get("tenant") is not None else nullcontext():
        if spec["key"]:
            with ordering_key(spec["key"]):
                return int(backend.store_task(task, args, kwargs)[1])
        return int(backend.store_task(task, args, kwargs)[1])
