"""Waits (SPEC §9e): a job sleeps, or waits for a signal sent by key, holding no lease, slot
or thread, and resumes exactly once.

The lease holder's side: ``begin_wait`` (the wait's memo, a kept signal, or an open wait) and
``suspend`` (the job gives its slot, and by default its chat, back). Anyone's side: ``signal``,
inside the caller's transaction (no commit, no signal). The workers' side: ``time_out_due``
resolves the waits whose time came (a claim that finds nothing, and a busy claimer once a
second), ``purge_expired_signals``. The operators' side: ``signal_job``, ``time_out_now``
(cancel is the ledger's ``cancel``: it closes a waiting job's waits).

Each wait resolves once: one conditional update of its row (``open`` → ``delivered`` or
``timed_out``) decides who wins between a signal, its timeout and an operator.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .. import telemetry
from ..conf import checked_settings
from ..errors import InvalidState, JobNotFound, LeaseLost, LedgerError, NoWaiter
from ..store import Row, store
from ..store.base import aware
from ..store.waits import PARKED_PREFIX
from .fencing import why_not_held
from .kinds import describe_key
from .operators import Outcome
from .payloads import MAX_JSON_DEPTH, object_deeper_than

log = logging.getLogger("feishu_inbox.ledger")

#: Wait states (``waiting.WaitState``), as the store writes them.
OPEN, DELIVERED, TIMED_OUT = "open", "delivered", "timed_out"
#: Keys and names are stored in columns of these lengths.
KEY_LIMIT, NAME_LIMIT = 255, 128


@dataclass(frozen=True)
class WaitMemo:
    """A job's wait as recorded: open, delivered (with its payload) or timed out."""

    name: str
    key: str
    state: str
    payload: Any
    until: datetime | None
    #: Seconds from the wait's start to its resolution (None while open).
    waited: float | None = None
    #: Its row's id (a batch of children delivers it by id: SPEC §9f).
    wait_id: int = 0

    @classmethod
    def from_row(cls, name: str, row: Row) -> WaitMemo:
        payload = row["payload"]
        if isinstance(payload, str | bytes):
            payload = json.loads(payload)
        created, resolved = aware(row["created_at"]), aware(row["resolved_at"])
        waited = None if resolved is None else (resolved - created).total_seconds()
        return cls(
            name, row["key"], row["state"], payload, aware(row["until"]), waited, int(row["id"])
        )


def memo_of(job_id: int, name: str) -> WaitMemo | None:
    """The job's wait ``name`` as recorded now (None: it never waited so)."""
    row = store().job_wait(job_id, name)
    return None if row is None else WaitMemo.from_row(name, row)


@dataclass(frozen=True)
class Sent:
    """What ``signal`` did: delivered to a waiting job (``job_id``), or kept (``kept``)."""

    job_id: int | None = None
    kept: bool = False


def check_key(key: object) -> str:
    if not isinstance(key, str) or not key or len(key) > KEY_LIMIT:
        raise LedgerError(
            f"A signal's key must be a string of 1 to {KEY_LIMIT} characters (got {key!r:.80}).",
            fix="Name what the job waits for, e.g. f'payment:{order.id}'.",
        )
    return key


def payload_text(payload: Any) -> str | None:
    """A signal's payload as the JSON text the ledger stores; refused if it is not JSON data."""
    if payload is None:
        return None
    if object_deeper_than(payload, MAX_JSON_DEPTH):
        raise LedgerError(f"A signal's payload may nest at most {MAX_JSON_DEPTH} levels.")
    try:
        return json.dumps(payload, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise LedgerError(
            f"A signal's payload must be JSON data, not {type(payload).__name__} ({exc}).",
            fix="Send dicts, lists, strings, numbers, booleans or None.",
        ) from exc


# --- the lease holder ------------------------------------------------------------------------


def begin_wait(
    lease: Any,
    *,
    name: str,
    key: str,
    seconds: float | None,
    hold_chat: bool,
    lease_seconds: float | None = None,
    ask: dict[str, Any] | None = None,
) -> WaitMemo:
    """The job's wait ``name``: what an earlier run recorded, a kept signal taken now, or a
    new open wait (the handler then suspends). Fenced: ``LeaseLost`` once the lease is gone.
    ``ask``: a card question's rule (its choices and who may answer: ``answer_question``)."""
    found = store().begin_wait(
        lease,
        name=name,
        key=key,
        seconds=seconds,
        hold_chat=hold_chat,
        lease_seconds=lease_seconds or checked_settings().LEASE_SECONDS,
        ask=None if ask is None else json.dumps(ask, ensure_ascii=False),
    )
    if found is None:
        raise LeaseLost(f"Cannot wait in job {lease.job_id}: its lease is lost.")
    return WaitMemo.from_row(name, found)


def suspend(lease: Any, *, name: str, what: str, retrying: bool = False) -> str:
    """The job starts to wait (``waiting``), or is due again at once when its wait was
    resolved meanwhile (``queued``). ``InvalidState`` when an effect of it is open (nothing
    changed), ``LeaseLost`` when the lease is gone. ``retrying``: a try whose reply was lost
    may have landed (its attempt's record says so)."""
    status = store().suspend(lease, name=name, message=f"Waiting for {what}.")
    if status is None and retrying:
        status = store().ended_with(lease)
    if status is not None:
        telemetry.WAITS.labels("suspended").inc()
        return status
    why = why_not_held(lease)
    if why is not None:
        raise LeaseLost(f"Cannot suspend job {lease.job_id}: {why}.")
    raise InvalidState(
        f"Job {lease.job_id} cannot wait: an effect of it is in flight or uncertain, or an "
        "operator cancelled it.",
        fix="Wait only after every effect has ended, each inside a step.",
    )


# --- anyone ----------------------------------------------------------------------------------


def signal(key: str, payload: Any = None, *, keep: bool | float | timedelta = True) -> Sent:
    """Deliver ``payload`` to the job that waits for ``key`` (the oldest, if several do),
    inside the caller's transaction: the job resumes once it commits, never if it rolls back.

    With no job waiting: ``keep=True`` keeps the signal for the first job that will wait for
    the key, for ``SIGNAL_KEEP`` (default one day), or for ``keep`` seconds / a timedelta;
    ``keep=False`` refuses it (``NoWaiter``) and changes nothing.
    """
    check_key(key)
    text = payload_text(payload)
    keep_seconds = _keep_seconds(keep)
    sent = store().send_signal(key, text, keep_seconds)
    if sent.get("job_id") is not None:
        telemetry.WAITS.labels("signalled").inc()
        return Sent(job_id=int(sent["job_id"]))
    if sent.get("kept"):
        telemetry.WAITS.labels("kept").inc()
        return Sent(kept=True)
    raise NoWaiter(f"No job waits for the signal {key!r}; it was not kept (keep=False).")


def _keep_seconds(keep: bool | float | timedelta) -> float | None:
    if keep is False:
        return None
    if keep is True:
        return checked_settings().SIGNAL_KEEP.total_seconds()
    seconds = keep.total_seconds() if isinstance(keep, timedelta) else keep
    if not isinstance(seconds, int | float) or not seconds > 0:
        raise LedgerError(
            f"keep must be True, False, a positive number of seconds or a timedelta "
            f"(got {keep!r}).",
            fix="keep=True keeps a signal nobody waits for yet for SIGNAL_KEEP.",
        )
    return float(seconds)


#: What a click on a card question's button did (``answer_question``): only ``DECIDED``
#: changed anything.
DECIDED, ALREADY_DECIDED, EXPIRED, NOT_YOURS, NOT_A_CHOICE = (
    "decided",
    "already_decided",
    "expired",
    "not_yours",
    "not_a_choice",
)


def answer_question(key: str, *, open_id: str, choice: str, at: datetime) -> str:
    """A click on a button of the card question ``key`` (``feishu_inbox.ask``) by ``open_id``,
    decided in one transaction under the key's lock, so two clicks make one decision: the
    first allowed click of a choice delivers ``{"choice", "open_id", "at"}`` to the waiting
    job (``DECIDED``); any other changes nothing and says why (``ALREADY_DECIDED``,
    ``EXPIRED``: timed out, cancelled or unknown, ``NOT_YOURS``, ``NOT_A_CHOICE``)."""
    check_key(key)
    payload = {"choice": choice, "open_id": open_id, "at": at.isoformat()}
    text = json.dumps(payload, ensure_ascii=False)
    outcome = store().answer_question(key, open_id, choice, text)
    telemetry.WAITS.labels(f"click_{outcome}").inc()
    return outcome


# --- the workers -----------------------------------------------------------------------------


def time_out_due(limit: int = 100) -> int:
    """Resolve the open waits whose time came (sleeps end; waits for a signal time out) and
    resume their jobs. Returns how many this call resolved (another worker may win some)."""
    resolved = 0
    for wait_id in store().due_waits(limit):
        if store().resolve_wait(wait_id, state=TIMED_OUT, payload=None):
            resolved += 1
    if resolved:
        telemetry.WAITS.labels("timed_out").inc(resolved)
    return resolved


def deliver(wait_id: int, payload: Any) -> bool:
    """Deliver ``payload`` to the open wait ``wait_id`` (a batch of children did: SPEC §9f),
    in the caller's transaction; False when it was resolved already (timed out, cancelled)."""
    return store().resolve_wait(wait_id, state=DELIVERED, payload=payload_text(payload))


def purge_expired_signals() -> int:
    return store().purge_expired_signals()


# --- operators -------------------------------------------------------------------------------


def signal_job(job_id: int, payload: Any = None) -> bool:
    """An operator delivers ``payload`` to a waiting job's open wait (its key's other
    waiters untouched). False when it waits for nothing (resolved meanwhile: nothing moved)."""
    return _resolve_open(job_id, DELIVERED, payload_text(payload))


def time_out_now(job_id: int) -> bool:
    """An operator ends a waiting job's wait now: a sleep ends, a wait for a signal times
    out (the handler sees ``WaitTimedOut``). False when it waits for nothing."""
    return _resolve_open(job_id, TIMED_OUT, None)


def resume_jobs(job_ids: Iterable[int], payload: Any = None) -> Outcome:
    """An operator's "resume": each waiting job's open wait is delivered ``payload`` (the
    handler's ``wait_for`` returns it; a sleep ends) and the job is due now. A job that does
    not wait is refused, and stays as it was."""
    text = payload_text(payload)
    return _each(job_ids, "resume", lambda job_id: _resolve_open(job_id, DELIVERED, text))


def time_out_jobs(job_ids: Iterable[int]) -> Outcome:
    """An operator's "time out": each waiting job's wait ends now (a sleep ends, a wait for a
    signal raises ``WaitTimedOut`` in the handler). A job that does not wait is refused."""
    return _each(job_ids, "time out", lambda job_id: _resolve_open(job_id, TIMED_OUT, None))


def _each(job_ids: Iterable[int], doing: str, resolve: Callable[[int], bool]) -> Outcome:
    outcome = Outcome()
    for job_id in dict.fromkeys(job_ids):
        try:
            done = resolve(job_id)
        except JobNotFound:
            outcome.refused[job_id] = JobNotFound(f"Cannot {doing} job {job_id}: no such job.")
            continue
        if done:
            outcome.done.append(job_id)
        else:
            status = store().lease_state(job_id)
            now = "" if status is None else f"it is {status['status']}"
            outcome.refused[job_id] = InvalidState(
                f"Cannot {doing} job {job_id}: {now or 'it is gone'}; only a waiting job can be.",
                fix="Look at the job: it may have resumed or ended meanwhile.",
            )
    return outcome


def _resolve_open(job_id: int, state: str, payload: str | None) -> bool:
    wait = store().open_wait_of_job(job_id)
    if wait is None:
        if store().lease_state(job_id) is None:
            raise JobNotFound(f"No job #{job_id}.")
        return False
    done = store().resolve_wait(int(wait["id"]), state=state, payload=payload)
    if done:
        telemetry.WAITS.labels("by_operator").inc()
    return done


@dataclass(frozen=True)
class WaitView:
    """What a job waits for, as operators see it (admin, ``inbox list`` and ``show``)."""

    name: str
    key: str
    state: str
    since: datetime
    until: datetime | None
    chat: str
    holds_chat: bool

    @property
    def what(self) -> str:
        return describe_key(self.key, signal="signal", time="its time (a sleep)")


def waits_of(job_ids: list[int]) -> dict[int, WaitView]:
    """The latest wait of each of these jobs (one query)."""
    return {
        job_id: WaitView(
            name=row["name"],
            key=row["key"],
            state=row["state"],
            since=aware(row["created_at"]),
            until=aware(row["until"]),
            chat=row["partition_key"],
            holds_chat=bool(row["hold_chat"]),
        )
        for job_id, row in store().waits_of_jobs(job_ids).items()
    }


def is_parked(partition_key: str) -> bool:
    """A waiting job's partition when it gave its chat back (operators show its chat)."""
    return partition_key.startswith(PARKED_PREFIX)
