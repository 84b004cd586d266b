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
framework's side is ``backend`` (``LedgerBackend``, ``ordering_key``); ``declaring`` holds
``@retry`` and ``@timeout``; ``framework`` finds whichever tasks
framework the site has (Django 6's, or the backport). This module imports neither the
framework nor the backend: a site without the ``tasks`` extra imports it (the admin's queue
filter, the system checks) and never needs ``django-tasks``; ``LedgerBackend`` and its errors
load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .declaring import TIMEOUT_ATTRIBUTE, retry, retry_policy_of, timeout

if TYPE_CHECKING:
    from .backend import (
        InvalidLedgerTask,
        LedgerBackend,
        UnserializableTaskArguments,
        current_ordering_key,
        ordering_key,
    )

__all__ = [
    "BACKEND",
    "TIMEOUT_ATTRIBUTE",
    "InvalidLedgerTask",
    "LedgerBackend",
    "UnserializableTaskArguments",
    "current_ordering_key",
    "ordering_key",
    "retry",
    "retry_policy_of",
    "timeout",
]


#: This backend's path in settings.TASKS.
BACKEND = f"{__name__}.LedgerBackend"
#: The names of tasks/backend.py, which subclass the framework's: loaded when first asked for
#: (Django's import_string of BACKEND, a site's ``except InvalidLedgerTask``).
_BACKEND_NAMES = (
    "InvalidLedgerTask",
    "LedgerBackend",
    "UnserializableTaskArguments",
    "current_ordering_key",
    "ordering_key",
)


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
