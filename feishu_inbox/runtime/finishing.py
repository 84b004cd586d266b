"""Finishes that end together go to the database together: one statement, one commit.

A worker's slots finish on their own threads. A finish that finds no other finish of its worker
being written goes at once, alone, as it always did (``ledger.finish_and_claim``): nobody ever
waits for company. A finish that finds one in flight waits for it; then the finishes that
gathered meanwhile go together (``finish_together``), written by one of them. When the
database is the bottleneck, finishes gather by themselves, and each commit serves several jobs.

Each finish of a batch is fenced on its own: one whose lease was lost is refused alone (its
slot then finishes alone, to learn why), and the others go on. When the batch's statement
fails (the database blinked, and its reply may have been lost after the commit), every finish
of it is tried again alone, as a retry: one that landed is found by its lease token and its
next job by its own claim token (``ledger.finish_and_claim`` with ``retrying``); one that did
not land, lands now. A finish is never lost silently, and none applies twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..ledger.rules import EVERY_KEY, ClaimedJob, KeyFilter, Lease, finish_together
from . import writes

log = logging.getLogger("feishu_inbox.worker")

#: What a finish returns: the job's status and the slot's next job(s).
Finished = tuple[str, list[ClaimedJob]]


@dataclass(eq=False)
class Finish:
    """One slot's finish: what to write, and how to write it alone (``alone(retrying)``)."""

    lease: Lease
    error_type: str
    #: The lease token of the slot's next claim; "" claims nothing.
    token: str
    alone: Callable[[bool], Finished]
    done: Finished | None = None
    #: Set when the slot must finish alone; True: as a retry (the batch may have landed).
    alone_retrying: bool | None = None


class FinishGroup:
    """Gathers a worker's finishes while ``in_flight`` are being written (group commit). The
    worker passes 1 with FINISH_TOGETHER, else its slot count: then every slot writes its own
    finish at once, and no group forms."""

    def __init__(
        self, lease_seconds: float, *, in_flight: int = 1, keys: KeyFilter = EVERY_KEY
    ) -> None:
        self._lease_seconds = lease_seconds
        self._keys = keys
        self._in_flight = in_flight
        self._writing = 0
        self._waiting: list[Finish] = []
        self._changed = threading.Condition()

    def finish(self, mine: Finish) -> Finished:
        with self._changed:
            self._waiting.append(mine)
            while not self._settled(mine) and self._writing >= self._in_flight:
                self._changed.wait()
            batch: list[Finish] = []
            if not self._settled(mine):  # nobody took mine: write what waits, mine too
                batch, self._waiting = self._waiting, []
                self._writing += 1
        if batch:
            try:
                if batch == [mine]:  # alone, as always, and in flight meanwhile
                    return mine.alone(False)
                self._write(batch)
            finally:
                with self._changed:
                    self._writing -= 1
                    for finish in batch:  # unsettled if writing it raised: each retries alone
                        if finish is not mine and not self._settled(finish):
                            finish.alone_retrying = True
                    self._changed.notify_all()
        with self._changed:
            while not self._settled(mine):
                self._changed.wait()
        if mine.done is not None:
            return mine.done
        return mine.alone(bool(mine.alone_retrying))

    @staticmethod
    def _settled(finish: Finish) -> bool:
        return finish.done is not None or finish.alone_retrying is not None

    def _write(self, batch: list[Finish]) -> None:
        """Write a batch; each of its finishes is then done, or told to finish alone."""
        try:
            ended = finish_together(
                [(f.lease, f.error_type, f.token) for f in batch],
                lease_seconds=self._lease_seconds,
                keys=self._keys,
            )
        except Exception as exc:  # each one is retried alone: one that landed is found
            log.warning("%s finishes together failed (%s); each is tried alone", len(batch), exc)
            if writes.transient(exc):
                writes.drop_connection()
            self._settle(batch, retrying=True)
            return
        with self._changed:
            for finish, (status, jobs) in zip(batch, ended, strict=True):
                if status is None:  # its lease was lost: alone, it learns why
                    finish.alone_retrying = False
                else:
                    finish.done = (status, jobs)
            self._changed.notify_all()

    def _settle(self, batch: list[Finish], *, retrying: bool) -> None:
        with self._changed:
            for finish in batch:
                finish.alone_retrying = retrying
            self._changed.notify_all()
