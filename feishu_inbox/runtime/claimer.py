"""Every way a worker's claims and finishes are written: the one file to open to change how.

A worker claims heads for its free slots (``claim``) and finishes each job it ran
(``finish``), the finish claiming its slot's next job on the same round trip. How finishes are
written is chosen once, when the worker starts (``Claimer.mode``):

- ``alone``: each slot writes its own finish at once (``ledger.finish_and_claim``);
- ``grouped`` (FINISH_TOGETHER): while one finish is written, the others that end meanwhile
  wait and go together, in one statement and one commit (``finishing.FinishGroup``);
- ``batched`` (BATCH_WINDOW > 0, the default): a slot leaves its finish in the batch and runs
  the next buffered job at once; the finishes that gathered and the next claims go in one
  statement and one commit (``ledger.finish_batch``), written by the main loop or by a slot
  with nothing left to run (``hand_over``). The batch and its buffer of claimed jobs are
  ``batching.Batch``.

A claim whose reply was lost may have taken jobs: its token is kept and the next claim looks
for them first (``ledger.claimed_with``). Claimed jobs that never start (the buffer waited too
long, the worker stops) are handed back here too, without spending an attempt (``give_back``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from .. import telemetry
from ..ledger import rules as ledger
from ..ledger import wakeups
from . import attempts, writes
from .batching import BUFFER_PATIENCE, Batch, Ended
from .context import JobContext
from .finishing import Finish, FinishGroup
from .state import DATABASE_AWAY, Crew, check_connection

log = logging.getLogger("feishu_inbox.worker")

#: A claimed job and when (monotonic) its lease was asked for.
Claimed = tuple[ledger.ClaimedJob, float]


class Claimer:
    """A worker's claims and finishes, and the claimed jobs it gives back unstarted."""

    def __init__(self, crew: Crew, *, batch_window: float, batch_size: int, together: bool):
        self._crew = crew
        options = crew.options
        #: BATCH_WINDOW > 0: finishes written together and jobs claimed ahead (batching.py).
        self.batch = Batch(batch_window, batch_size, crew.flags.wake) if batch_window else None
        # FINISH_TOGETHER: while one finish is written, the others wait and go together;
        # else every slot writes its own at once (a group never forms).
        self._group = FinishGroup(
            crew.lease_seconds,
            in_flight=1 if together else options.concurrency,
            keys=options.keys,
        )
        #: How finishes are written, in a word (the module's docstring).
        self.mode = "batched" if self.batch is not None else "grouped" if together else "alone"
        #: The tokens of claims whose reply was lost: their jobs may be ours (``claimed_with``).
        self._lost_tokens: list[str] = []
        #: Buffered jobs whose hand back failed (the database was away), each with when its
        #: claim was sent: tried again by the heartbeat (``hand_back_stale``), never started.
        self._unreturned: list[Claimed] = []
        #: Held while stale jobs are handed back: the heartbeat's, then the drain's.
        self.returning = threading.Lock()
        #: The room taken by the claims in flight (the main thread's, a slot's batch).
        self._reserved = 0
        #: Held while a claim reads and reserves its room, and when it ends (``claim``).
        self._claiming = threading.Lock()
        #: A place for each claim in flight: as many as the database runs side by side (two on
        #: PostgreSQL, one on SQLite).
        self.writers = threading.BoundedSemaphore(wakeups.concurrent_writers())

    # --- claims -------------------------------------------------------------------------

    def room(self, free: int) -> int:
        """How many jobs a claim may take: the free slots, and with batches the buffer's free
        places; never past --max-jobs."""
        options, slots = self._crew.options, self._crew.slots
        room = free - self._reserved
        if self.batch is not None:
            room += self.batch.ahead(options.concurrency) - self.batch.buffered()
        if options.max_jobs is not None:
            room = min(room, options.max_jobs - slots.claimed)
        return room

    def claim(
        self, free: int | None, ended: Sequence[Ended] = ()
    ) -> tuple[list[Claimed], list[str | None]]:
        """Claim what ``free`` slots and the buffer have room for (``room``; None: nothing),
        each job with when its lease was asked for (monotonic); with ``ended``, a batch: their
        finishes first, in the same statement and commit, and each one's status (empty when
        the batch failed).

        Two claims may be in flight at once, each on its own thread's connection (the main
        thread's batch, and a slot's that ran out of buffered jobs meanwhile): the database
        works on both, and each one's commit waits for its own WAL flush beside the other's.
        Only the bookkeeping is under ``_claiming``: the room is reserved there (counted as
        claimed, for ``--max-jobs``, until the claim returns), so two claims never take more
        than the room between them.

        While the database is away, a claim fails and the next one comes after a short backoff
        (never a long sleep: claims resume within a second of its return); a batch's finishes
        wait again, as retries. A claim whose reply was lost may have taken jobs: the next
        claim first looks for them by its token.
        """
        crew = self._crew
        sent = time.monotonic()
        with self._claiming:
            limit = 0 if free is None else max(self.room(free), 0)
            lost, self._lost_tokens = self._lost_tokens, []
            self._reserved += limit
            crew.slots.count(limit)
        recovered: list[ledger.ClaimedJob] = []
        statuses: list[str | None] = []
        jobs: list[ledger.ClaimedJob] = []
        token = ""
        try:
            check_connection()
            while lost:
                found = ledger.claimed_with(crew.worker_id, lost[0])
                lost.pop(0)
                if found:
                    log.warning("recovered %s jobs of a claim whose reply was lost", len(found))
                    crew.slots.count(len(found))
                    recovered += found
            if recovered and not ended:
                return [(job, sent) for job in recovered], []
            token = ledger.new_token()
            if ended:
                statuses, jobs = ledger.finish_batch(
                    crew.worker_id,
                    [(entry.ctx.lease, entry.ctx.finish_note) for entry in ended],
                    limit=max(limit - len(recovered), 0),
                    token=token,
                    lease_seconds=crew.lease_seconds,
                    keys=crew.keys,
                )
            else:
                jobs = ledger.claim(
                    crew.worker_id,
                    lease_seconds=crew.lease_seconds,
                    limit=limit,
                    token=token,
                    keys=crew.keys,
                )
            token = ""
        except DATABASE_AWAY as exc:
            telemetry.CLAIMS.labels("error").inc()
            crew.database.away("finish and claim" if ended else "claim", exc, since=sent)
            if self.batch is not None:
                self.batch.put_back(list(ended))
            return [(job, sent) for job in recovered], []
        finally:
            with self._claiming:  # the reservation ends; a reply that never came is kept
                self._reserved -= limit
                crew.slots.count(len(jobs) - limit)
                self._lost_tokens += lost + ([token] if token else [])
        crew.database.back()
        telemetry.CLAIMS.labels("jobs" if jobs else "empty").inc()
        return [(job, sent) for job in recovered + jobs], statuses

    # --- finishes -----------------------------------------------------------------------

    def finish(
        self, ctx: JobContext, *, superseded: bool = False, note: str = ""
    ) -> tuple[str, Claimed | None] | None:
        """Finish the job and, on the same round trip, claim this slot's next one: its state
        (with why it ended, when not by returning) and the next job, if any. None: the batch
        writes it (the slot then calls ``hand_over``)."""
        crew = self._crew
        ctx.ensure_alive()
        ctx.ending = True
        if self.batch is not None and not superseded:
            ctx.finish_note = note
            return None
        stopping = crew.flags.stop.is_set()
        reserved = 0 if stopping else crew.slots.reserve(crew.options.max_jobs)
        token = ledger.new_token()  # the same for every try: a lost reply's jobs are found
        sent = time.monotonic()

        def alone(retrying: bool) -> tuple[str, list[ledger.ClaimedJob]]:
            return writes.write(
                ctx,
                "finish",
                lambda again: ledger.finish_and_claim(
                    ctx.lease,
                    limit=reserved,
                    lease_seconds=crew.lease_seconds,
                    superseded=superseded,
                    note=note,
                    token=token,
                    retrying=retrying or again,
                    keys=crew.keys,
                ),
            )

        error_type = "Superseded" if superseded else note  # as ledger.finish writes it
        try:
            status, jobs = self._group.finish(
                Finish(ctx.lease, error_type, token if reserved else "", alone)
            )
        except BaseException:
            crew.slots.unreserve(reserved)
            if reserved:  # it may have landed, its reply lost: its next job is found later
                with self._claiming:
                    self._lost_tokens.append(token)
            raise
        crew.slots.unreserve(reserved - len(jobs))
        label = status + (" (Superseded)" if superseded else f" ({note})" if note else "")
        return label, (jobs[0], sent) if jobs else None

    def hand_over(
        self, entry: Ended, *, running: bool
    ) -> tuple[Claimed | None, list[Ended], list[str | None]]:
        """A slot's handler returned and its finish waits for the batch (``finish`` said
        None): the slot's next job (from the buffer, or from the batch this slot wrote
        itself), and the finishes that batch wrote with their statuses (to settle).

        With nothing buffered and no other slot running, the slot writes the batch itself
        (beside the main thread's, if one is in flight), and runs the job its claim brings (a
        busy chat's next one: one commit a job, no hand-over between threads)."""
        crew, batch = self._crew, self.batch
        assert batch is not None
        item = batch.ended(entry, take_next=running)
        ended: list[Ended] = []
        statuses: list[str | None] = []
        alone = len(crew.slots) == 1  # no other slot runs: none will add to it
        if item is None and running and alone and self.writers.acquire(blocking=False):
            claimed: list[Claimed] = []
            try:
                ended = batch.take_ended()
                free = crew.options.concurrency - len(crew.slots) + 1  # this one
                claimed, statuses = self.claim(free, ended)
            except Exception:  # not the database's (those ``claim`` handles): a bug
                log.exception("writing a batch failed; its finishes wait again")
                batch.put_back(ended)
                ended = []
            finally:
                self.writers.release()
            if claimed and crew.flags.stop.is_set():  # stopped meanwhile: nothing starts
                self.give_back(claimed, attempts.STOPPED)
            elif claimed:
                item = claimed[0]
                batch.buffer(claimed[1:])
        return item, ended, statuses

    @staticmethod
    def finish_fenced_out(entry: Ended) -> str:
        """A batch found this finish fenced out: written alone, it learns why (``LeaseLost``)
        or, retried, finds that it had landed."""
        return ledger.finish(entry.ctx.lease, note=entry.ctx.finish_note, retrying=entry.retrying)

    def write_ended(self) -> tuple[list[Ended], list[Claimed], list[str | None]]:
        """Write the batch's waiting finishes now, claiming nothing (the worker is ending):
        the finishes, the jobs a lost reply's claim had taken (found again), and the
        finishes' statuses (empty: the database is away, they wait again)."""
        assert self.batch is not None
        with self.writers:
            ended = self.batch.take_ended()
            found, statuses = self.claim(None, ended)
        return ended, found, statuses

    # --- claimed jobs that never start --------------------------------------------------

    def hand_back_stale(self) -> None:
        """Hand back the buffered jobs that waited too long for a slot (every slot is in a
        slow job), and try again those whose hand back failed (``give_back``). Once the
        worker stops, its drain does both."""
        if self.batch is None:
            return
        # Within a third of the lease too: a buffered job is never renewed.
        patience = min(BUFFER_PATIENCE, self._crew.lease_seconds / 3)
        with self.returning:
            if self._crew.flags.stop.is_set():
                return
            stale = self.batch.stale(now=time.monotonic(), patience=patience)
            self.give_back(stale, attempts.WAITED)

    def give_back(self, jobs: Sequence[Claimed], why: str) -> bool:
        """Hand back claimed jobs that never started (each with when its claim was sent), and
        those whose hand back failed before. One whose hand back fails (the database is away)
        is no slot's to run any more (the hand back may have landed, its reply lost: the job
        may be queued again, or another worker's): it is kept to be tried again, as a retry,
        while its lease lasts; never left to wait out its lease and run on a second attempt.
        True: none is left to try again."""
        with self._claiming:
            retries, self._unreturned = self._unreturned, []
        failed = [
            (job, sent) for job, sent in retries if not self._hand_back(job, why, retrying=True)
        ] + [(job, sent) for job, sent in jobs if not self._hand_back(job, why)]
        kept = []
        for job, sent in failed:
            if time.monotonic() - sent < self._crew.lease_seconds:
                kept.append((job, sent))
            else:
                log.warning("job %s not handed back before its lease ran out", job.id)
        with self._claiming:
            self._unreturned += kept
        return not kept

    def _hand_back(self, job: ledger.ClaimedJob, why: str, *, retrying: bool = False) -> bool:
        """False: the database is away, to be tried again."""
        answer = attempts.hand_back_unstarted(job, why, retrying=retrying)
        if answer == attempts.HANDED_BACK:
            self._crew.slots.count(-1)
        return answer != attempts.AWAY

    def give_back_the_rest(self) -> None:
        """As the worker stops: the jobs of claims whose reply was lost (no later claim will
        look for them), and those whose hand back failed, go back; while the database is
        away, tried again until their leases are about to end (as ``write_ended`` does)."""
        crew = self._crew
        delay = writes.RETRY_FIRST_DELAY
        until = time.monotonic() + crew.lease_seconds - writes.LEASE_MARGIN
        while True:
            with self._claiming:
                lost, self._lost_tokens = self._lost_tokens, []
            found: list[Claimed] = []
            for n, token in enumerate(lost):
                try:
                    check_connection()
                    jobs = ledger.claimed_with(crew.worker_id, token)
                    found += [(job, time.monotonic()) for job in jobs]
                except DATABASE_AWAY as exc:
                    log.warning("a lost claim's jobs not looked for yet (%s)", exc)
                    writes.drop_connection()
                    with self._claiming:
                        self._lost_tokens += lost[n:]
                    break
            done = self.give_back(found, attempts.STOPPED) and not self._lost_tokens
            left = until - time.monotonic()
            if done or left <= 0 or crew.database.gave_up:  # a --burst run gave up already
                if not done:
                    log.error("jobs left to their leases: the database stayed away")
                return
            time.sleep(min(delay, left))  # a backoff between tries, not a synchronisation
            delay = min(delay * 2, writes.RETRY_LONGEST_DELAY)

    # --- what tests and the drain look at -----------------------------------------------

    def pending(self) -> tuple[list[str], list[Claimed]]:
        """The tokens of claims whose reply was lost, and the jobs whose hand back failed."""
        with self._claiming:
            return list(self._lost_tokens), list(self._unreturned)

    def keep(self, *, lost_tokens: Sequence[str] = (), unreturned: Sequence[Claimed] = ()) -> None:
        """Remember a claim whose reply was lost, or jobs whose hand back failed."""
        with self._claiming:
            self._lost_tokens += lost_tokens
            self._unreturned += unreturned
