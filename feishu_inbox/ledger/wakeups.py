"""How workers are woken and how many of their claims the database runs side by side.

PostgreSQL pushes a notice when a head becomes claimable, a running job is cancelled or may be
superseded, or a schedule changes (LISTEN/NOTIFY); SQLite pushes none and its workers poll.
The runtime reaches these through here, never through the store.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..store import store
from ..store.schema import BATCHES_NOTICE, SCHEDULES_NOTICE, STOPPING_NOTICE

__all__ = [
    "BATCHES_NOTICE",
    "SCHEDULES_NOTICE",
    "STOPPING_NOTICE",
    "concurrent_writers",
    "listen",
    "notify_stopping",
]


#: Set when PostgreSQL said a batch member ended (``BATCHES_NOTICE``): the next claim of this
#: process folds the batches' events first (``workflows.fire_ready``).
batches_due = threading.Event()


def listen(
    wake: Callable[[str], None], done: threading.Event, listening: Callable[[bool], None]
) -> None:
    """Call ``wake(notice)`` for every notice until ``done`` (a partition key's prefix,
    ``SCHEDULES_NOTICE`` or ``STOPPING_NOTICE``); returns at once where the database sends
    none. ``listening(True)`` says notices arrive (a worker may then sleep long),
    ``listening(False)`` that they stopped (it polls again)."""
    store().listen(wake, done, listening)


def notify_stopping() -> None:
    """Wake this process's own listener, which waits on its socket, so that it can end."""
    store().notify(STOPPING_NOTICE)


def concurrent_writers() -> int:
    """How many claims the database runs side by side (PostgreSQL: two; SQLite: one)."""
    return store().concurrent_writers
