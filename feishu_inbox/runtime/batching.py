"""A worker's batch: finishes written together on a short window, and claims ahead of its slots.

With ``BATCH_WINDOW`` > 0 (the default), a slot whose handler returned does not write its
finish itself: it leaves it here and runs the next job of the worker's small local buffer at
once. The worker's main thread writes the finishes that gathered, and claims the next heads, in
one statement and one commit (``ledger.finish_batch``): when the oldest has waited the window,
when a slot has nothing left to run, or when a batch is full. So, with fast handlers, a commit
serves many jobs, and the database works on one batch while the slots run the next.

What does not change (docs/guarantees.md): a finish commits before its partition's next job
can be claimed (that partition stays ``running`` until then, and the claim that takes its next
job runs after the finish, in the same commit); an effect's start commits before the effect (a
handler's own writes never wait for a batch); a job's finish waits at most the window behind
any other job. A worker that dies between a handler's return and its batch's commit leaves
that job ``running``; its lease expires and it runs again, as after a crash before a single
finish: its effects' records stand, so an effect that completed is not repeated.

The buffer holds claimed jobs that wait for a slot, in their claim's order; while it holds jobs
of several tenants, a slot takes the first job of the tenant with the fewest jobs in it (the
claim shared the slots between the tenants, SPEC §9j: a light tenant's job never waits behind a
heavy tenant's buffered ones; each tenant's jobs keep their order). Its size follows the
handlers' speed: as many jobs as the slots finish in one window (none for slow handlers: a job
is never claimed to wait behind a long one), at most two batches (``2 * BATCH_SIZE``): once the
slots have run as many buffered jobs as are left, the batch goes and its claims refill the
buffer while the slots run the rest, so the database and the slots work side by side. Fast jobs
stay on the slots already running (a thread woken for each costs every job a share of the GIL);
a buffered job gets another free slot once no slot has taken from the buffer for a window (the
busy ones are in slow jobs), or when the busy slots cannot run the buffer within a window. A
buffered job that still waits after ``BUFFER_PATIENCE`` (every slot is stuck in a slow job) is
handed back, without spending an attempt, for any worker to take.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import dataclass

from .. import tracing
from ..ledger.rules import ClaimedJob
from .context import JobContext

#: How long a claimed job may wait in the buffer for a slot before it is handed back (s).
BUFFER_PATIENCE = 1.0
#: Weight of the newest job in the running mean of the time a job holds its slot.
_NEWEST = 0.2
#: Fewest finishes a refill of a half-run buffer writes (fewer: the window decides).
_LEAST_REFILL = 8


@dataclass(eq=False)
class Ended:
    """A job whose handler returned, waiting for its finish to be written."""

    ctx: JobContext
    span: tracing.Span
    #: Seconds from its start to its handler's return.
    took: float
    #: Its batch's statement failed once: the finish may have landed (its reply was lost).
    retrying: bool = False


class Batch:
    """The finishes waiting to be written and the claimed jobs waiting for a slot."""

    def __init__(self, window: float, size: int, wake: threading.Event) -> None:
        self.window = window
        self.size = size
        self._wake = wake
        self._lock = threading.Lock()
        self._ended: list[Ended] = []
        self._oldest: float | None = None
        #: Claimed jobs, each with when its claim was sent (monotonic).
        self._buffer: deque[tuple[ClaimedJob, float]] = deque()
        #: How many buffered jobs each tenant has (a slot takes from the tenant of fewest).
        self._tenants: Counter[str] = Counter()
        #: Running mean of the seconds a job holds its slot (None: none ran yet).
        self._job_seconds: float | None = None
        #: The main thread was woken to refill the buffer since the last batch was taken.
        self._refill_asked = False
        #: When (monotonic) a slot last took a buffered job, or jobs came into an empty buffer:
        #: a buffer that made no progress for a window has its slots stuck in slow jobs.
        self._progress = time.monotonic()

    # --- the slots' side -----------------------------------------------------------------

    def ended(self, entry: Ended, *, take_next: bool) -> tuple[ClaimedJob, float] | None:
        """Leave a finish to be written; the buffer's next job for this slot (if
        ``take_next`` and there is one)."""
        with self._lock:
            self._ended.append(entry)
            first = self._oldest is None
            if first:
                self._oldest = time.monotonic()
            seconds = self._job_seconds
            self._job_seconds = (
                entry.took if seconds is None else seconds + _NEWEST * (entry.took - seconds)
            )
            following = self._take() if take_next and self._buffer else None
            if following is not None:
                self._progress = time.monotonic()
            full = len(self._ended) >= self.size
            refill = not self._refill_asked and self._refill_due()
            if refill:
                self._refill_asked = True
        # The main thread: a window starts while this slot goes on, the batch is full, the
        # buffer is half run, or the worker stops. A slot with nothing buffered writes the
        # batch itself (or, when no writer's place is free, frees its slot, which wakes it).
        if (full or refill or not take_next or (first and following is not None)) and (
            not self._wake.is_set()  # set already: the main thread looks again after clearing it
        ):
            self._wake.set()
        return following

    def _take(self) -> tuple[ClaimedJob, float]:
        """The next buffered job for a slot: the first, or with several tenants buffered the
        first of the tenant with the fewest. The caller holds the lock; the buffer has one."""
        tenants = self._tenants
        if len(tenants) > 1:
            fewest = min(tenants, key=tenants.__getitem__)
            at = next(n for n, (job, _) in enumerate(self._buffer) if job.tenant == fewest)
            item = self._buffer[at]
            del self._buffer[at]
        else:
            item = self._buffer.popleft()
        self._counted(item[0].tenant, -1)
        return item

    def _counted(self, tenant: str, change: int) -> None:
        left = self._tenants[tenant] + change
        if left > 0:
            self._tenants[tenant] = left
        else:
            del self._tenants[tenant]

    def _refill_due(self) -> bool:
        """The slots have run as many buffered jobs as are left: the batch goes now, so its
        claims arrive while the slots run the rest (the database works on one batch while
        the slots run the next, instead of after them). The caller holds the lock."""
        return bool(self._buffer) and len(self._ended) >= max(len(self._buffer), _LEAST_REFILL)

    # --- the main thread's side ----------------------------------------------------------

    def due(self, *, slot_idle: bool) -> bool:
        """Whether the finishes should be written now: the oldest waited the window, the
        batch is full, or a slot has nothing to run (nothing is buffered for it)."""
        with self._lock:
            if self._oldest is None:
                return False
            if slot_idle and not self._buffer:
                return True
            return (
                len(self._ended) >= self.size
                or self._refill_due()
                or time.monotonic() - self._oldest >= self.window
            )

    def deadline(self) -> float | None:
        """When (monotonic) the oldest waiting finish's window ends, or the window since a slot
        last took from the buffer (another slot may be needed then); None: nothing waits."""
        with self._lock:
            ends = [] if self._oldest is None else [self._oldest + self.window]
            if self._buffer:
                ends.append(self._progress + self.window)
            return min(ends, default=None)

    def needs_slot(self, busy: int) -> bool:
        """Whether a buffered job should start on another free slot, with ``busy`` slots
        running: not while those run the buffer within a window by themselves (fast handlers:
        each thread woken costs every job some of the GIL), but once no slot has taken from the
        buffer for a window (the busy slots are in slow jobs), and always for slow handlers."""
        with self._lock:
            if not self._buffer:
                return False
            seconds = self._job_seconds
            if busy == 0 or seconds is None:
                return True
            if time.monotonic() - self._progress >= self.window:
                return True
            return busy * self.window < len(self._buffer) * seconds

    def take_ended(self) -> list[Ended]:
        with self._lock:
            taken, self._ended, self._oldest = self._ended, [], None
            self._refill_asked = False
            return taken

    def put_back(self, entries: list[Ended]) -> None:
        """A batch's statement failed: its finishes wait again, first, as retries."""
        if not entries:
            return
        for entry in entries:
            entry.retrying = True
        with self._lock:
            self._ended[:0] = entries
            self._oldest = time.monotonic() if self._oldest is None else self._oldest

    def waiting(self) -> int:
        with self._lock:
            return len(self._ended)

    def ahead(self, concurrency: int) -> int:
        """How many jobs to hold in the buffer beyond the slots: what they finish in a window."""
        with self._lock:
            seconds = self._job_seconds
        if seconds is None:
            return 0  # nothing known yet: claim for the free slots only
        return min(2 * self.size, int(concurrency * self.window / max(seconds, 1e-6)))

    def buffer(self, jobs: list[tuple[ClaimedJob, float]]) -> None:
        with self._lock:
            if not self._buffer:
                self._progress = time.monotonic()
            self._buffer.extend(jobs)
            self._tenants.update(job.tenant for job, _ in jobs)

    def next_buffered(self) -> tuple[ClaimedJob, float] | None:
        with self._lock:
            if not self._buffer:
                return None
            self._progress = time.monotonic()
            return self._take()

    def buffered(self) -> int:
        with self._lock:
            return len(self._buffer)

    def stale(
        self, *, now: float, patience: float = BUFFER_PATIENCE
    ) -> list[tuple[ClaimedJob, float]]:
        """Take the buffered jobs (each with when its claim was sent) that waited past
        ``patience`` seconds since their claim was sent (to hand them back)."""
        with self._lock:
            kept = deque(item for item in self._buffer if now - item[1] < patience)
            gone = [item for item in self._buffer if now - item[1] >= patience]
            self._buffer = kept
            for job, _ in gone:
                self._counted(job.tenant, -1)
        return gone

    def take_buffered(self) -> list[tuple[ClaimedJob, float]]:
        """Empty the buffer (the worker stops: its jobs are handed back), each job with when
        its claim was sent."""
        with self._lock:
            gone = list(self._buffer)
            self._buffer.clear()
            self._tenants.clear()
        return gone
