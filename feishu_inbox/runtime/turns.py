"""Conversation turns (SPEC §9g), the worker's side: a chat's burst of messages run as one job.

    @feishu_inbox.handler("im.message.receive_v1", coalesce=feishu_inbox.Coalesce(quiet=0.6))
    def answer(event):
        question = event.turn.text               # every message of the burst, in order

How a turn is formed, when a worker claims a chat's first waiting message (``begin``):

1. The turn's step ``turn`` recorded by an earlier attempt (or before a replay) is the turn:
   its membership never changes once recorded.
2. Else the worker reads what waits behind the message in its chat (``ledger.turns.behind``):
   the messages of the same type that follow it, up to ``max_messages`` and ``max_chars``;
   a recall of any of them (a recalled message leaves the turn); a stop command (the burst
   ends ``Stopped``, nothing runs). Another kind of event ends the burst: nothing is run out
   of its chat's order.
3. Until the chat has been quiet for ``quiet`` seconds since its newest message (and at most
   ``max_wait`` after the first), the job goes back to wait, without spending an attempt.
4. Then the messages behind are taken into the turn and the turn recorded, in one fenced
   transaction (``ledger.turns.take``). A turn whose every message was recalled ends
   ``Recalled`` without running; a message past the handler's ``stale_after`` is skipped,
   answered with a short notice, or run anyway (``on_stale``).

While a turn runs, the heartbeat looks behind it twice a second (``look_behind``): a stop
command stops it (``Stopped``, a ``Cancelled``, at its next safe point — a checkpoint, an
effect's start, a streamed card's write); a recall of one of its messages is flagged on
``event.turn.recalled`` or cancels it (``on_recall``); a new message queues as the next turn,
is merged into this one at its next checkpoint (``during="merge"``: ``event.turn.messages``
grows), or supersedes it (``during="supersede"``).

What a message is (its text, id, sender, when it was sent) is read by a ``MessageReader``:
Feishu's is set by ``feishu/turns.py``; this module knows no payload's shape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from django.db import DatabaseError

from ..errors import Cancelled, Concluded, Deferred

if TYPE_CHECKING:
    from .context import Event, JobContext

log = logging.getLogger("feishu_inbox.turns")

#: The step a turn's membership is recorded as; a merge adds ``turn+1``, ``turn+2``…
MEMO = "turn"
DURING = ("queue", "merge", "supersede")
ON_RECALL = ("flag", "cancel")
ON_STALE = ("skip", "notice", "run")
#: The longest quiet window or wait of a burst (a turn waits for people typing, not hours).
MAX_SECONDS = 300.0
DEFAULT_NOTICE = "Sorry, this message reached me too late to answer; please send it again."


class Stopped(Cancelled):
    """A stop command (or the card's stop button) ended the running turn at a safe point."""


@dataclass(frozen=True)
class Message:
    """One message of a turn."""

    job_id: int
    event_id: str
    message_id: str
    text: str
    sender: str = ""
    #: When it was sent (epoch seconds, the sender's side; None: not said).
    sent_at: float | None = None
    msg_type: str = "text"

    def as_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "event_id": self.event_id,
            "message_id": self.message_id,
            "text": self.text,
            "sender": self.sender,
            "sent_at": self.sent_at,
            "msg_type": self.msg_type,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Message:
        known: dict[str, Any] = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@dataclass
class Turn:
    """What a coalescing handler's event holds: ``event.turn``."""

    messages: list[Message]
    #: Ids of its messages recalled while it ran (``on_recall="flag"``).
    recalled: set[str] = field(default_factory=set)
    #: Messages merged into it while it ran (``during="merge"``), in order.
    merged: int = 0
    #: How it ended without running, once decided ("Stopped", "Recalled", "Stale"; "": it runs).
    end: str = ""
    #: Merge steps recorded (``turn+1``…).
    merges: int = 0

    @property
    def live(self) -> list[Message]:
        """Its messages that were not recalled, in receipt order."""
        recalled = set(self.recalled)  # (the heartbeat's thread adds to it)
        return [m for m in self.messages if m.message_id not in recalled]

    @property
    def text(self) -> str:
        """The texts of its live messages, one a line."""
        return "\n".join(m.text for m in self.live if m.text)

    @property
    def last(self) -> Message | None:
        """Its newest live message: the one a reply answers."""
        live = self.live
        return live[-1] if live else None

    @property
    def message_ids(self) -> list[str]:
        return [m.message_id for m in self.messages]

    def as_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "messages": [m.as_json() for m in self.messages],
            "recalled": sorted(set(self.recalled)),
        }
        if self.end:
            found["end"] = self.end
        return found


class MessageReader(Protocol):
    """How a transport's payloads read as messages (``feishu/turns.py``)."""

    def message(self, job_id: int, event_id: str, event_type: str, payload: Any) -> Message | None:
        """The message this event carries, or None when it carries none."""

    def recalled(self, event_type: str, payload: Any) -> str | None:
        """The id of the message this event recalls, or None when it recalls none."""

    def sent_at(self, payload: Any) -> float | None:
        """When the event was made (epoch seconds), by the sender's clock."""


@dataclass(frozen=True)
class Coalesce:
    """A handler's turns: ``@handler("im.message.receive_v1", coalesce=Coalesce(...))``.

    ``quiet``: seconds without a new message that end a burst; ``max_wait``: seconds after its
    first message a burst ends anyway; ``max_messages``, ``max_chars``: a turn's size;
    ``during``: what a message that arrives while the chat's turn runs does — ``"queue"``
    (the next turn), ``"merge"`` (into this one, at its next checkpoint), ``"supersede"``
    (this one stops); ``on_recall``: a running turn's recalled message is ``"flag"``-ged on
    ``event.turn.recalled`` or ``"cancel"``-s it; ``stop_commands``: texts that stop the
    chat's turn; ``on_recalled_reply``: a reply to a message recalled meanwhile is
    ``"send"``-t to the chat instead, or ``"drop"``-ped (the turn ends ``Recalled``)."""

    quiet: float = 0.6
    max_wait: float = 2.0
    max_messages: int = 8
    max_chars: int = 4000
    during: str = "queue"
    on_recall: str = "flag"
    stop_commands: tuple[str, ...] = ("/stop",)
    on_recalled_reply: str = "drop"
    reader: MessageReader | None = None

    def problems(self, event_type: str) -> list[str]:
        found = []
        for name in ("quiet", "max_wait"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 <= value <= MAX_SECONDS
            ):
                found.append(
                    f"{name} of {event_type!r} must be a number of seconds from 0 to "
                    f"{MAX_SECONDS:g} (got {value!r})"
                )
        for name in ("max_messages", "max_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                found.append(f"{name} of {event_type!r} must be a whole number >= 1")
        if self.during not in DURING:
            found.append(f"during of {event_type!r} must be one of {', '.join(DURING)}")
        if self.on_recall not in ON_RECALL:
            found.append(f"on_recall of {event_type!r} must be one of {', '.join(ON_RECALL)}")
        if self.on_recalled_reply not in ("send", "drop"):
            found.append(f"on_recalled_reply of {event_type!r} must be 'send' or 'drop'")
        commands = self.stop_commands
        if not isinstance(commands, tuple | list) or not all(
            isinstance(c, str) and c.strip() for c in commands
        ):
            found.append(f"stop_commands of {event_type!r} must be a tuple of non-empty texts")
        return found

    def is_stop(self, message: Message) -> bool:
        """Whether the message is one of the stop commands (its text, trimmed)."""
        return message.text.strip() in {c.strip() for c in self.stop_commands}


@dataclass(frozen=True)
class StartDeadline:
    """A handler's ``stale_after``: a message first claimed later than this after it was sent
    is skipped (``"skip"``), answered with ``notice`` (``"notice"``), or run (``"run"``)."""

    seconds: float
    policy: str = "skip"
    notice: str = DEFAULT_NOTICE

    @classmethod
    def of(cls, after: timedelta | float, policy: str, notice: str) -> StartDeadline:
        seconds = after.total_seconds() if isinstance(after, timedelta) else after
        return cls(float(seconds), policy, notice)

    def problems(self, event_type: str) -> list[str]:
        found = []
        if not 0 < self.seconds < float("inf"):
            found.append(f"stale_after of {event_type!r} must be a positive duration")
        if self.policy not in ON_STALE:
            found.append(f"on_stale of {event_type!r} must be one of {', '.join(ON_STALE)}")
        if not isinstance(self.notice, str) or not self.notice.strip():
            found.append(f"stale_notice of {event_type!r} must be a non-empty text")
        return found


#: The transport's reader and its notice sender (``feishu/turns.py`` sets both at import).
_reader: list[MessageReader] = []
_notifier: list[Callable[[Event, str], None]] = []


def set_transport(reader: MessageReader, notify: Callable[[Event, str], None]) -> None:
    _reader[:] = [reader]
    _notifier[:] = [notify]


def reader_of(spec: Coalesce | None) -> MessageReader:
    if spec is not None and spec.reader is not None:
        return spec.reader
    if not _reader:
        raise RuntimeError("No message reader: import feishu_inbox before running turns.")
    return _reader[0]


# --- a turn begins (the executor, before the handler) --------------------------------------


def begin(ctx: JobContext, spec: Coalesce | None, deadline: StartDeadline | None) -> None:
    """Form the job's turn (``spec``) and keep its start deadline; sets ``ctx.event.turn``.
    Raises ``Deferred`` (the burst is not over), ``Concluded`` (it ends without running)."""
    from ..ledger import turns as ledger_turns
    from . import writes

    event = ctx.event
    reader = reader_of(spec)
    recorded = _recorded(ctx) if spec is not None else None
    if recorded is not None and spec is not None:  # decided before: the same, whatever came
        _conclude_if_ended(ctx, recorded, deadline)
        ctx.turn_spec = spec
        ctx.event = replace(event, turn=recorded)
        return
    head = reader.message(event.job_id, event.event_id, event.event_type, event.payload)
    if spec is None or head is None:  # a start deadline alone
        if deadline is not None:
            now = writes.write(ctx, "read the clock for", lambda _: _db_clock())
            if _late(deadline, reader.sent_at(event.payload), now, ctx):
                _late_start(ctx, deadline)
        return
    if spec.is_stop(head):  # the command itself: it stopped what ran, if anything did
        _count(event, "stopped")
        raise Concluded("StopCommand", f"Job {event.job_id} is a stop command.")
    for _ in range(3):
        now, rows = writes.write(
            ctx,
            "look behind",
            lambda _: ledger_turns.behind(
                event.job_id, event.partition_key, spec.max_messages * 4 + 16
            ),
        )
        burst = _burst(spec, reader, head, event, rows)
        turn = Turn([head, *burst.members])
        turn.recalled = burst.recalled & {m.message_id for m in turn.messages}
        try:
            if deadline and deadline.policy != "run" and _late(deadline, head.sent_at, now, ctx):
                # the late ones (a prefix: they came in order) end with it; the rest wait
                late = [m for m in burst.members if _late(deadline, m.sent_at, now, ctx)]
                turn.messages, turn.end = [head, *burst.members[: len(late)]], "Stale"
                _take(ctx, spec, turn)
                _stale(ctx, deadline)
            if burst.stop:
                turn.end = "Stopped"
                _take(ctx, spec, turn)
                _conclude_if_ended(ctx, turn, deadline)
            ready_at = burst.ready_at(spec, event.received_at)
            if not burst.full and ready_at is not None and now < ready_at:
                wait = (ready_at - now).total_seconds()
                raise Deferred(wait, f"Coalescing the chat's messages for {wait:.2f}s more.")
            if not turn.live:
                turn.end = "Recalled"
            _take(ctx, spec, turn)
        except ledger_turns.TurnChanged:
            continue  # an operator ended one of them meanwhile: nothing was taken
        _conclude_if_ended(ctx, turn, deadline)
        if deadline is not None and _late(deadline, head.sent_at, now, ctx):
            _late_start(ctx, deadline)  # on_stale="run" (another policy concluded above)
        else:
            _count(event, "run")
        ctx.turn_spec = spec
        ctx.event = replace(event, turn=turn)
        return
    raise Deferred(0.1, "The chat's messages changed while the turn was formed; looking again.")


def _conclude_if_ended(ctx: JobContext, turn: Turn, deadline: StartDeadline | None) -> None:
    """A turn decided to end without running ends so, on every attempt that reads it."""
    if turn.end == "Stale" and deadline is not None:
        _stale(ctx, deadline)
    if turn.end == "Stopped":
        _count(ctx.event, "stopped")
        raise Concluded("Stopped", "A stop command came before the turn ran.")
    if turn.end == "Recalled" or not turn.live:
        _count(ctx.event, "recalled")
        raise Concluded("Recalled", "Every message of the turn was recalled before it ran.")


@dataclass
class _Burst:
    members: list[Message] = field(default_factory=list)
    recalled: set[str] = field(default_factory=set)
    newest: Any = None  # when the newest member was stored (the database's clock)
    stop: bool = False
    full: bool = False

    @property
    def ids(self) -> set[str]:
        return {m.message_id for m in self.members}

    def ready_at(self, spec: Coalesce, first: Any) -> Any:
        if first is None:
            return None
        newest = self.newest or first
        return min(newest + timedelta(seconds=spec.quiet), first + timedelta(seconds=spec.max_wait))


def _burst(spec: Coalesce, reader: MessageReader, head: Message, event: Event, rows: Any) -> _Burst:
    """The messages behind ``head`` that are its burst (``spec``'s limits), the recalls among
    what waits, and whether a stop command or another event ends it."""
    from ..models import Status

    burst = _Burst()
    chars = len(head.text)
    for row in rows:
        recalled = reader.recalled(row.event_type, row.payload)
        if recalled is not None:
            burst.recalled.add(recalled)
            continue
        if burst.full or burst.stop:
            continue  # only recalls are read past the burst's end
        message = None
        if row.event_type == event.event_type and row.status in (Status.QUEUED, Status.RETRY_WAIT):
            message = reader.message(row.id, "", row.event_type, row.payload)
        if message is None:
            burst.full = True  # another event: the burst cannot grow past it
            continue
        if spec.is_stop(message):
            burst.members.append(message)
            burst.stop = True
            continue
        if (
            1 + len(burst.members) >= spec.max_messages
            or chars + len(message.text) > spec.max_chars
        ):
            burst.full = True
            continue
        burst.members.append(message)
        chars += len(message.text)
        burst.newest = row.received_at
    if 1 + len(burst.members) >= spec.max_messages or chars >= spec.max_chars:
        burst.full = True
    return burst


def _take(
    ctx: JobContext,
    spec: Coalesce,
    turn: Turn,
    members: Sequence[Message] | None = None,
    memo: str = MEMO,
) -> None:
    """Take ``members`` (default: the turn's messages after its first) into the turn, and
    record ``turn`` (or, for a merge's ``memo``, the members) — fenced, all or nothing."""
    from ..ledger import turns as ledger_turns
    from . import writes

    taken = list(turn.messages[1:] if members is None else members)
    value: Any = turn.as_json() if memo == MEMO else [m.as_json() for m in taken]
    writes.write(
        ctx,
        "form the turn of",
        lambda _: ledger_turns.take(
            ctx.lease,
            members=[m.job_id for m in taken],
            memo=memo,
            value=value,
            private=ctx.event.private_message,
            keep_private=spec.during == "supersede",
            how="coalesced" if memo == MEMO else "merged",
            lease_seconds=ctx.lease_seconds,
        ),
    )
    ctx.has_steps = True
    if ctx.memo is not None:
        ctx.memo[memo] = value


def _recorded(ctx: JobContext) -> Turn | None:
    """The turn an earlier attempt recorded (its merges included), or None."""
    from ..ledger import rules as ledger
    from . import writes

    if not ctx.has_steps:
        return None
    if ctx.memo is None:
        ctx.memo = writes.write(
            ctx, "read the steps of", lambda _: ledger.job_steps(ctx.event.job_id)
        )
    found = ctx.memo.get(MEMO)
    if not isinstance(found, dict):
        return None
    turn = Turn(
        [Message.from_json(m) for m in found.get("messages", [])],
        recalled=set(found.get("recalled", [])),
        end=str(found.get("end", "")),
    )
    while isinstance(merged := ctx.memo.get(f"{MEMO}+{turn.merges + 1}"), list):
        turn.messages.extend(Message.from_json(m) for m in merged)
        turn.merged += len(merged)
        turn.merges += 1
    return turn


def _late(deadline: StartDeadline, sent_at: float | None, now: Any, ctx: JobContext) -> bool:
    """Sent over the deadline before ``now``, on its first attempt (a retry was on time once)."""
    if sent_at is None or now is None or ctx.event.attempt > 1:
        return False
    return bool(now.timestamp() - sent_at > deadline.seconds)


def _late_start(ctx: JobContext, deadline: StartDeadline) -> None:
    """A late message ends by its policy (``_stale``), or runs (``on_stale="run"``): counted
    as a late start and logged, so an operator sees a backlog run after an outage."""
    if deadline.policy != "run":
        _stale(ctx, deadline)
    _count(ctx.event, "late")
    log.info("job %s runs past its stale_after of %gs", ctx.event.job_id, deadline.seconds)


def _stale(ctx: JobContext, deadline: StartDeadline) -> None:
    """End a late message (its burst's late ones are recorded with it): skipped, or noticed
    first (a reply, an idempotent effect: a retry sends it again under the same key)."""
    _count(ctx.event, "stale")
    if deadline.policy == "notice" and _notifier:
        _notifier[0](ctx.event, deadline.notice)
    raise Concluded(
        "Stale",
        f"First claimed more than the handler's stale_after of {deadline.seconds:g}s after it "
        f"was sent ({deadline.policy}).",
    )


def _db_clock() -> Any:
    from ..ledger import turns as ledger_turns

    return ledger_turns.clock()


def _count(event: Event, start: str) -> None:
    from .. import telemetry

    telemetry.TURNS.labels(event.event_type, start).inc()


# --- a running turn: what waits behind it (the heartbeat), merges (its checkpoints) ---------


def look_behind(running: Sequence[JobContext]) -> None:
    """For each running turn: a stop command, a recall of its messages, or a new message
    behind it in its chat; the answer is flagged on its context (its next safe point acts).
    A turn this cannot read (a site's own reader that raises) is logged and looked at again
    next time: the heartbeat goes on."""
    from ..ledger import turns as ledger_turns

    for ctx in running:
        spec, turn = ctx.turn_spec, ctx.event.turn
        if spec is None or turn is None or ctx.lost.is_set():
            continue
        try:
            _, rows = ledger_turns.behind(
                ctx.event.job_id, ctx.event.partition_key, 64, clock=False
            )
            _look(ctx, spec, turn, rows)
        except DatabaseError:
            raise  # the database away: the heartbeat looks again next tick
        except Exception:
            log.exception("job %s: what waits behind its turn could not be read", ctx.event.job_id)


def _look(ctx: JobContext, spec: Coalesce, turn: Turn, rows: Any) -> None:
    from .. import telemetry

    reader = reader_of(spec)
    ids = set(turn.message_ids)
    new_message = False
    for row in rows:
        recalled = reader.recalled(row.event_type, row.payload)
        if recalled is not None:
            if recalled in ids and recalled not in turn.recalled:
                turn.recalled.add(recalled)
                telemetry.TURN_SIGNALS.labels("recall").inc()
                telemetry.TURN_MESSAGES.labels("recalled").inc()
                if spec.on_recall == "cancel" or not turn.live:
                    ctx.cancelled.set()
            continue
        if row.event_type != ctx.event.event_type:
            continue
        message = reader.message(row.id, "", row.event_type, row.payload)
        if message is None:
            continue
        if spec.is_stop(message):
            if not ctx.stop_requested:
                telemetry.TURN_SIGNALS.labels("stop").inc()
            ctx.stop_requested = True
            ctx.cancelled.set()
            break
        new_message = True
    if new_message and spec.during == "supersede" and not ctx.interrupt.is_set():
        telemetry.TURN_SIGNALS.labels("supersede").inc()
        ctx.interrupt.set()
    elif new_message and spec.during == "merge":
        ctx.merge_waiting = True


def stop_error(ctx: JobContext) -> Cancelled:
    """What a safe point raises once the turn was stopped or cancelled."""
    if ctx.stop_requested:
        return Stopped(f"Job {ctx.event.job_id} was stopped by a stop command.")
    return Cancelled(f"Job {ctx.event.job_id} was cancelled.")


def merge(ctx: JobContext) -> None:
    """Take the messages that arrived behind the running turn into it (``during="merge"``),
    up to its ``max_messages``: a checkpoint's work, fenced and recorded (``turn+N``), so a
    retry sees them too."""
    from .. import telemetry
    from ..ledger import turns as ledger_turns
    from . import writes

    ctx.merge_waiting = False
    spec, turn = ctx.turn_spec, ctx.event.turn
    if spec is None or turn is None:
        return
    reader = reader_of(spec)
    _, rows = writes.write(
        ctx,
        "look behind",
        lambda _: ledger_turns.behind(ctx.event.job_id, ctx.event.partition_key, 64, clock=False),
    )
    room = spec.max_messages - len(turn.messages)
    fresh: list[Message] = []
    for row in rows:
        if reader.recalled(row.event_type, row.payload) is not None:
            continue
        message = (
            reader.message(row.id, "", row.event_type, row.payload)
            if row.event_type == ctx.event.event_type
            else None
        )
        if message is None or spec.is_stop(message) or len(fresh) >= room:
            break
        fresh.append(message)
    if not fresh:
        return
    try:
        _take(ctx, spec, turn, fresh, memo=f"{MEMO}+{turn.merges + 1}")
    except ledger_turns.TurnChanged:
        ctx.merge_waiting = True  # the next checkpoint looks again
        return
    turn.messages.extend(fresh)
    turn.merged += len(fresh)
    turn.merges += 1
    telemetry.TURN_SIGNALS.labels("merge").inc()
