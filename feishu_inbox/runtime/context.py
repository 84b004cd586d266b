"""What a running job is, as the worker and the handler API see it.

``Event`` is what a handler receives; ``JobContext`` is the worker's side of one running job
(its lease, its effects in flight, its steps), which ``effect``, ``checkpoint`` and ``step``
reach through ``current()`` while the worker runs the handler (between ``enter`` and
``leave``).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..errors import LeaseLost, TimedOut
from ..ledger import tenants

log = logging.getLogger("feishu_inbox.handlers")

#: Guards the creation of a ``Flag``'s event (rare: only a flag someone waits on has one).
_flag_events = threading.Lock()


class Flag:
    """A ``threading.Event`` that costs one attribute until someone waits on it.

    A job has four (lost, interrupt, cancelled, timed out), almost never set and rarely waited
    on; four real events were a tenth of a worker's CPU per no-op job (each is a condition and
    a lock). ``set`` and ``is_set`` never lock; ``wait`` makes the event on first use.
    """

    __slots__ = ("_event", "_set")

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        event = self._event  # read after the flag: a waiter that made it sees one or other
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        if self._set:
            return True
        if self._event is None:
            with _flag_events:
                if self._event is None:
                    self._event = threading.Event()
        if self._set:  # set while the event was being made: it may not have seen it
            self._event.set()
        return self._event.wait(timeout)


@dataclass(frozen=True)
class Event:
    job_id: int
    event_id: str
    event_type: str
    app: str
    payload: dict[str, Any]
    partition_key: str
    attempt: int
    private_message: bool
    #: When the ledger stored it (None where a caller built the event without it).
    received_at: datetime | None = None
    #: A coalescing handler's turn (``runtime/turns.py``: its messages); None otherwise.
    turn: Any = None
    #: Whose job it is (SPEC §9j): Feishu's tenant_key for an event; "" for none. A store
    #: app's replies use this tenant's token.
    tenant: str = ""


@dataclass
class JobContext:
    """The worker's side of one running job; handlers reach it through ``effect``/``checkpoint``."""

    lease: Any  # ledger.Lease (kept untyped here: this module must not import models)
    event: Event
    #: The lease's length, and when (monotonic) the request that last set it was sent: the
    #: worker's own, conservative estimate of how long the lease lasts.
    lease_seconds: float = 60.0
    renewed_at: float = field(default_factory=time.monotonic)
    started: float = field(default_factory=time.monotonic)
    lost: Flag = field(default_factory=Flag)
    #: A newer private message waits (SPEC §4); an operator cancelled the job.
    interrupt: Flag = field(default_factory=Flag)
    cancelled: Flag = field(default_factory=Flag)
    effects_started: bool = False
    #: The handler was called: from then on the job's end is the worker's to write (finish,
    #: fail, hand back), never a hand back for a database error before it (worker.py).
    handler_started: bool = False
    #: This attempt's effects in flight (the worker is the only writer of its job's count).
    effects_in_flight: int = 0
    #: Steps (SPEC §7): whether the job recorded any before, their results once read (None:
    #: not yet), and the names this attempt has run.
    has_steps: bool = False
    memo: dict[str, Any] | None = None
    steps_run: set[str] = field(default_factory=set)
    #: Steps running now (a step may hold effects), and whether an effect of this attempt
    #: began outside any step: a resumed run would repeat it, so the job may not wait (§9e).
    step_depth: int = 0
    unstepped_effect: bool = False
    #: The waits this attempt reached, in order (their default names: wait:1, wait:2, …).
    waits_run: list[str] = field(default_factory=list)
    #: Spawns of this attempt without a key, numbered in order (``spawn:1``…, SPEC §9f).
    spawned: int = 0
    #: The idempotent effects this attempt began (one key per name).
    idempotent_names: set[str] = field(default_factory=set)
    #: The worker is writing the attempt's end (finish, fail, hand back): a renewal refused
    #: from now on was refused because that end landed first, not because the lease was lost.
    #: A lease that really was lost the end's own write reports, as ``LeaseLost``.
    ending: bool = False
    #: The error type its finish keeps on a completed job (``Cancelled``, ``NoHandler``): a
    #: batched finish writes it too, so a cancelled tree's jobs end in the batch, not each on
    #: a connection of its own.
    finish_note: str = ""
    on_lost: Callable[[JobContext], None] | None = None
    #: Called by the worker once the attempt's end is written, with the job's state after it
    #: and the exception that ended it (None: the handler returned), inside the ``except``
    #: block of that exception (the django.tasks backend sends ``task_finished`` from it).
    on_end: Callable[[str, BaseException | None], None] | None = None
    #: The exception that ended the attempt (None: the handler returned), once it ended.
    ended_by: BaseException | None = None
    #: Cancels an async handler's task (the worker sets it while one runs).
    cancel_async: Callable[[], object] | None = None
    #: When (monotonic) the attempt times out (its handler's ``timeout``; None: never); set
    #: once the worker stopped it, so the handler's next checkpoint raises too.
    deadline: float | None = None
    timed_out: Flag = field(default_factory=Flag)
    #: The worker ended this attempt at its timeout while its thread still ran the handler;
    #: the thread has come back from it (both under the worker's lock of the count).
    abandoned: bool = False
    thread_done: bool = False
    #: The trace context stored with the job (``tracing.py``): its attempt's span's parent.
    trace_parent: str = ""
    #: A turn's handler's ``Coalesce`` (``runtime/turns.py``), once its turn is formed; a stop
    #: command waits behind it (its next safe point raises ``Stopped``); new messages wait to
    #: be merged at its next checkpoint.
    turn_spec: Any = None
    stop_requested: bool = False
    merge_waiting: bool = False
    #: It has cleanups (``on_finish``): the worker enqueues them once its end is written.
    cleanups: bool = False

    def lease_left(self) -> float:
        """Seconds the lease lasts by this worker's clock (it may be less by the database's)."""
        return self.renewed_at + self.lease_seconds - time.monotonic()

    def mark_lost(self, why: str) -> None:
        if not self.lost.is_set():
            self.lost.set()
            log.error("job %s lost its lease: %s", self.event.job_id, why)
            if self.on_lost:
                self.on_lost(self)

    def ensure_alive(self) -> None:
        if self.lost.is_set():
            raise LeaseLost(f"Job {self.event.job_id} lost its lease; stop working on it.")

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def ensure_in_time(self) -> None:
        """Raise ``TimedOut`` once the attempt ran past its handler's timeout."""
        if self.timed_out.is_set() or self.past_deadline():
            raise TimedOut(
                f"Job {self.event.job_id} ran past its handler's timeout of "
                f"{self.timeout_seconds:g}s."
            )

    @property
    def timeout_seconds(self) -> float:
        return 0.0 if self.deadline is None else self.deadline - self.started


_current: contextvars.ContextVar[JobContext] = contextvars.ContextVar("feishu_inbox_job")


def current() -> JobContext:
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError(
            "effect() and checkpoint() work only inside a handler run by the worker."
        ) from None


def enter(ctx: JobContext) -> contextvars.Token[JobContext]:
    """Make ``ctx`` the current job of this thread (or task) while its handler runs."""
    return _current.set(ctx)


def leave(token: contextvars.Token[JobContext]) -> None:
    """The handler returned: ``enter``'s job is no longer current."""
    _current.reset(token)


def _running_job_tenant() -> str | None:
    """The running handler's job's tenant (what it enqueues is its tenant's), else None."""
    ctx = _current.get(None)
    return None if ctx is None else ctx.event.tenant


tenants.read_running_job_tenant(_running_job_tenant)
