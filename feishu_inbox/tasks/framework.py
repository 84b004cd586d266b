"""The tasks framework this site has: Django 6's ``django.tasks``, else the ``django-tasks``
backport of Django 5.2 (``pip install django-tasks``, the ``tasks`` extra). Both offer the
same API under two package names; this module names what ``tasks/__init__.py`` and
``tasks/jobs.py`` use, from whichever is present (``django.tasks`` first).
"""

from __future__ import annotations

from importlib import import_module
from types import SimpleNamespace
from typing import Any

from ..errors import ConfigurationError

_loaded: list[Any] = []


def framework() -> Any:
    """The framework's names: Task, TaskResult, TaskResultStatus, TaskContext, TaskError,
    BaseTaskBackend, InvalidTask, TaskResultDoesNotExist, task_backends, the priority bounds,
    the three signals, normalize_json, get_module_path, and ``package`` (which one it is)."""
    if not _loaded:
        _loaded.append(_load())
    return _loaded[0]


def _load() -> Any:
    try:
        import_module("django.tasks.base")
    except ImportError:
        return _backport()
    return _names(
        "django.tasks",
        invalid_task="InvalidTask",
        normalize_json=import_module("django.utils.json").normalize_json,
        get_module_path=lambda value: f"{value.__module__}.{value.__qualname__}",
    )


def _backport() -> Any:
    try:
        import_module("django_tasks.base")
    except ImportError:
        raise ConfigurationError(
            "feishu_inbox.tasks needs Django's tasks framework: Django 6's django.tasks, or on "
            "Django 5.2 the django-tasks backport, and neither is installed.",
            fix="pip install django-tasks (the tasks extra), or upgrade to Django 6.",
        ) from None
    utils = import_module("django_tasks.utils")
    return _names(
        "django_tasks",
        invalid_task="InvalidTaskError",
        normalize_json=utils.normalize_json,
        get_module_path=utils.get_module_path,
    )


def _names(
    package: str, *, invalid_task: str, normalize_json: Any, get_module_path: Any
) -> SimpleNamespace:
    """The same names from either package (only where they differ are they passed in)."""
    base = import_module(f"{package}.base")
    exceptions = import_module(f"{package}.exceptions")
    signals = import_module(f"{package}.signals")
    return SimpleNamespace(
        package=package,
        Task=base.Task,
        TaskResult=base.TaskResult,
        TaskResultStatus=base.TaskResultStatus,
        TaskContext=base.TaskContext,
        TaskError=base.TaskError,
        BaseTaskBackend=import_module(f"{package}.backends.base").BaseTaskBackend,
        InvalidTask=getattr(exceptions, invalid_task),
        TaskResultDoesNotExist=exceptions.TaskResultDoesNotExist,
        task_backends=import_module(package).task_backends,
        TASK_MIN_PRIORITY=base.TASK_MIN_PRIORITY,
        TASK_MAX_PRIORITY=base.TASK_MAX_PRIORITY,
        task_enqueued=signals.task_enqueued,
        task_started=signals.task_started,
        task_finished=signals.task_finished,
        normalize_json=normalize_json,
        get_module_path=get_module_path,
    )
