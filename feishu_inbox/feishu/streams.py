"""Streamed replies: an answer written into one card as it is generated (SPEC §9b).

    @feishu_inbox.handler("im.message.receive_v1", timeout=timedelta(minutes=5))
    def answer(event):
        text = feishu_inbox.step("think", ask_model, question(event))   # paid once per job
        with feishu_inbox.stream_reply(event) as card:
            for piece in pieces(text):
                card.write(piece)

``async with feishu_inbox.stream_reply(event) as card: await card.write(piece)`` in an async
handler; ``stream_send(app, receive_id)`` starts a new message instead of a reply.

What the ledger guarantees, whatever crashes (SPEC §9b):

- **One card, one message per job.** Entering the block creates a CardKit card (streaming mode
  on) and records its id in the ledger, then replies with it as an idempotent effect (the
  reply's ``uuid``, as ``reply`` does), and records the message id. A retried attempt finds
  both and writes into the same card. Create takes no ``uuid``: a create whose answer was lost
  leaves a card entity behind that nothing ever sends.
- **Nothing the user saw goes back.** Before each card operation leaves, its ``sequence`` and
  the whole text it carries are written to the ledger (fenced by the lease, as steps are). A
  later attempt continues with the next sequence and, as its handler writes the answer again
  (memoize it in a ``step``), sends nothing until its text goes beyond what was recorded; it
  then continues the card where it stopped. An answer that comes out different is shown only
  once it is at least as long as what the user saw.
- **Feishu's per-card rules are kept inside.** Writes are coalesced into at most one update per
  ``interval`` (0.25 s: a model's 50 tokens a second become 4 updates), any two operations on a
  card are more than a tenth of a second apart (Feishu takes 10 a second), sequences strictly
  increase across attempts, and each operation has its own ``uuid``, so one sent again after a
  lost answer is harmless. A 429 waits for Feishu's reset (inline up to a few seconds, else the
  job is handed back without spending an attempt); 5xx and timeouts send the same operation
  again a few times, then fail the attempt, whose retry resumes the card.
- **Past Feishu's 10-minute streaming window** (streaming turns itself off; updates answer
  300309 or 200850) the text goes out in whole-card updates, once a second, and the card ends
  with the full text: no error for the user.
- Leaving the block normally sends the final text and turns streaming off. Leaving it by an
  exception shows what was written followed by ``marker`` and turns streaming off; then the
  job's rules apply (a retry reopens streaming and goes on; the marker goes away).

Each write is one append in memory; each update is one ledger write and one request.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from types import TracebackType
from typing import Any

from ..errors import (
    Cancelled,
    Concluded,
    Deferred,
    FeishuBusinessError,
    FeishuRateLimited,
    FeishuTransientError,
    InvalidMessage,
    LeaseLost,
)
from ..runtime.context import Event, JobContext, current
from ..runtime.handlers import in_db_thread, safe_point
from ..runtime.writes import write
from . import cardkit, openapi, replies, turns

log = logging.getLogger("feishu_inbox.streams")

#: The card's text element, and what an interrupted answer ends with.
ELEMENT_ID = "answer"
DEFAULT_MARKER = "\n\n*(interrupted)*"
#: What an answer a stop command, the stop button or an operator's cancel ended ends with.
STOPPED_MARKER = "\n\n*(stopped)*"
#: Seconds between streamed updates: writes in between are coalesced into the next one.
UPDATE_INTERVAL = 0.25
#: Seconds between any two operations on one card: more than Feishu's 1/10 s.
OPERATION_SPACING = 1.0 / cardkit.OPERATIONS_PER_SECOND + 0.01
#: Updates after the streaming window are whole-card updates, at most this often (seconds).
WHOLE_UPDATE_INTERVAL = 1.0
#: Streaming is taken as over this long before Feishu's 10 minutes are up.
WINDOW_MARGIN = timedelta(seconds=30)
#: A 429 is waited out inside the handler up to this many seconds; a longer one hands the job
#: back (no attempt spent) and a later attempt resumes the card.
INLINE_RATE_WAIT = 5.0
#: A card operation that met a 5xx or a timeout is sent again (same sequence and uuid) this
#: many times, after these waits, before the attempt fails.
TRANSIENT_WAITS = (0.2, 0.5, 1.0)
NAME_MAX_LENGTH = 48  # "stream:" + name is the reply's effect name (64)


def stream_reply(
    event: Event,
    *,
    name: str = "answer",
    title: str | None = None,
    summary: str | None = None,
    marker: str = DEFAULT_MARKER,
    interval: float = UPDATE_INTERVAL,
    reply_in_thread: bool = False,
    stop_button: bool = False,
) -> Stream:
    """Stream an answer into a card that replies to the message of ``event``.

    ``name`` tells two streamed replies of one handler apart; ``title`` is the card's header;
    ``summary`` what the chat list shows while it streams; ``marker`` what an answer
    interrupted by an exception ends with; ``interval`` the seconds between updates;
    ``stop_button``: the card shows a button that stops the job (``feishu/turns.py``) while
    it streams."""
    replies.target_message(event)  # no message to reply to: InvalidMessage, before any request

    def send(card_id: str) -> str:
        content = {"type": "card", "data": {"card_id": card_id}}
        return replies.reply(
            event,
            content,
            "interactive",
            reply_in_thread=reply_in_thread,
            name=f"stream:{name}",
        )

    stream = Stream(event.app, name, send, title, summary, marker, interval)
    stream.card.stop_button = stop_button
    return stream


def stream_send(
    app: str,
    receive_id: str,
    *,
    receive_id_type: str = "chat_id",
    name: str = "answer",
    title: str | None = None,
    summary: str | None = None,
    marker: str = DEFAULT_MARKER,
    interval: float = UPDATE_INTERVAL,
) -> Stream:
    """Stream an answer into a card sent as a new message to a chat (or a user:
    ``receive_id_type``) as app ``app``; the other arguments as for ``stream_reply``."""

    def send(card_id: str) -> str:
        content = {"type": "card", "data": {"card_id": card_id}}
        return replies.send(
            app,
            receive_id,
            content,
            "interactive",
            receive_id_type=receive_id_type,
            name=f"stream:{name}",
        )

    return Stream(app, name, send, title, summary, marker, interval)


class Stream:
    """The block around a streamed reply: ``with`` gives a ``StreamedCard``, ``async with`` an
    ``AsyncStreamedCard``."""

    def __init__(
        self,
        app: str,
        name: str,
        send: Callable[[str], str],
        title: str | None,
        summary: str | None,
        marker: str,
        interval: float,
    ) -> None:
        problems = []
        if not isinstance(name, str) or not 1 <= len(name) <= NAME_MAX_LENGTH:
            problems.append(f"name must be 1 to {NAME_MAX_LENGTH} characters (got {name!r})")
        for label, value in (("title", title), ("summary", summary)):
            if value is not None and not isinstance(value, str):
                problems.append(f"{label} must be a string or None (got {value!r})")
        if not isinstance(marker, str):
            problems.append(f"marker must be a string (got {marker!r})")
        if not isinstance(interval, (int, float)) or not 0 < interval <= 60:
            problems.append(f"interval must be more than 0 and at most 60 seconds ({interval!r})")
        if problems:
            raise InvalidMessage(problems)
        openapi.credentials(app)  # no credentials: ConfigurationError, before any request
        openapi.ready(app)  # a store app: its tenant's token (no ticket yet: Deferred)
        self.card = StreamedCard(
            current(), app, name, send, title, summary, marker, max(interval, OPERATION_SPACING)
        )

    def __enter__(self) -> StreamedCard:
        self.card.open()
        return self.card

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.card.close()
        else:
            self.card.abort(exc)

    async def __aenter__(self) -> AsyncStreamedCard:
        await asyncio.to_thread(in_db_thread, self.card.open)
        return AsyncStreamedCard(self.card)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            await asyncio.to_thread(in_db_thread, self.card.close)
        else:
            await asyncio.to_thread(in_db_thread, self.card.abort, exc)


class StreamedCard:
    """One streamed reply of a running job. ``write(text)`` appends; ``set(text)`` makes the
    whole text ``text``; ``flush()`` sends what is written now. Not shared between threads."""

    def __init__(
        self,
        ctx: JobContext,
        app: str,
        name: str,
        send: Callable[[str], str],
        title: str | None,
        summary: str | None,
        marker: str,
        interval: float,
    ) -> None:
        self._ctx = ctx
        self.app = app
        self.name = name
        self._send = send
        self._title = title
        self._summary = summary
        self._marker = marker
        self._interval = interval
        self._written = ""
        self._state: Any = None  # ledger.streams.CardState once open
        self._last_flush = 0.0
        self._last_operation = 0.0
        self._warned = False
        #: Whether the card shows a stop button while it streams (``stream_reply``).
        self.stop_button = False
        #: The state was read from the ledger: its last operation was recorded before it was
        #: sent, and an earlier attempt may have died before Feishu applied it. Until this
        #: attempt's own first operation lands, what the card shows and whether it streams
        #: are not known.
        self._uncertain = False
        #: What this attempt did: card operations sent (requests, counting repeats) and
        #: ledger writes of the stream (``bench/streams.py`` reads them).
        self.operations = 0
        self.requests = 0
        self.ledger_writes = 0

    # --- what a handler calls ----------------------------------------------------------------

    @property
    def text(self) -> str:
        """What this attempt has written."""
        return self._written

    @property
    def seen(self) -> str:
        """The text the card shows (as far as the ledger knows: at least what the user saw)."""
        return self._state.text if self._state is not None else ""

    @property
    def card_id(self) -> str:
        return self._state.card_id if self._state is not None else ""

    @property
    def message_id(self) -> str:
        return self._state.message_id if self._state is not None else ""

    def write(self, chunk: str) -> None:
        """Append ``chunk`` to the answer; the card shows it with the next update."""
        if not isinstance(chunk, str):
            raise TypeError(f"write() takes text (got {type(chunk).__name__})")
        safe_point()  # a stop, a cancel or a newer message ends the answer here
        self._written += chunk
        self._maybe_flush()

    def set(self, text: str) -> None:
        """Make the whole answer ``text`` (e.g. a step's memoized result after the model's
        streamed tokens were written)."""
        if not isinstance(text, str):
            raise TypeError(f"set() takes text (got {type(text).__name__})")
        safe_point()
        self._written = text
        self._maybe_flush()

    def flush(self) -> None:
        """Send what is written now, if the card does not show it yet."""
        self._last_flush = time.monotonic()
        shown = self._shown()
        if shown == self._state.text:
            return
        if not self._streaming_over() and (self._state.streaming or self._reopen()):
            self._content(shown)
        else:
            self._whole_update(shown, closed=False)

    # --- the block's edges -------------------------------------------------------------------

    def open(self) -> None:
        """The card and its message: found in the ledger, else created and sent."""
        from ..ledger import streams

        ctx, name = self._ctx, self.name
        state = write(
            ctx, "read the streamed reply of", lambda _: streams.load(ctx.event.job_id, name)
        )
        if state is None:
            card_id = self._request(lambda: cardkit.create_card(self.app, self._card("", True)))
            state = streams.CardState(
                card_id=card_id, element_id=ELEMENT_ID, streaming_since=_now()
            )
            self._save(state)
        else:
            self._uncertain = state.sequence > 0
        self._state = state
        if not state.message_id:
            message_id = self._send(state.card_id)  # an idempotent effect (or Deferred)
            self._save(state.but(message_id=message_id))
        self._last_flush = time.monotonic()

    def close(self) -> None:
        """The final text on the card, and streaming off."""
        state = self._state
        shown = self._shown()
        if self._uncertain:  # whatever the card shows: the final text, streaming off
            self._whole_update(shown, closed=True)
            return
        changed = shown != state.text or state.marked
        if state.streaming and not self._streaming_over():
            if changed:
                self._content(shown)
            if self._state.streaming:  # (still: Feishu may have turned it off meanwhile)
                self._settings(streaming=False, closed=True)
                return
            changed = self._state.text != shown
        if changed:
            self._whole_update(shown, closed=True)  # one operation where streaming is off
        elif not self._state.closed:
            self._save(self._state.but(closed=True))

    def abort(self, exc: BaseException) -> None:
        """The handler raised: show what was written, then the marker, and stop streaming.
        Nothing when the lease is lost (nothing may be written), or the job is only handed
        back to wait for a limit (it resumes soon)."""
        if self._state is None or self._ctx.lost.is_set():
            return
        if isinstance(exc, (LeaseLost, Deferred)):
            return
        if isinstance(exc, Concluded) and not self._state.message_id:
            return  # never sent (its message was recalled): nothing to mark
        if isinstance(exc, Cancelled):
            self._marker = STOPPED_MARKER
        try:
            shown = self._shown()
            if self._state.streaming and not self._streaming_over():
                self._content(shown, marked=True)
                if self._state.streaming:
                    self._settings(streaming=False)
                    return
            if not (self._state.marked and self._state.text == shown):
                self._whole_update(shown, closed=False, marked=True)
        except Exception as failure:  # the handler's own exception is the one that counts
            log.warning(
                "job %s: could not mark its streamed reply %r as interrupted: %s",
                self._ctx.event.job_id,
                self.name,
                failure,
            )

    # --- what the card shows -----------------------------------------------------------------

    def _shown(self) -> str:
        """The text to show now: never less than the ledger says the user may have seen."""
        seen, written = self._state.text, self._written
        if seen.startswith(written):
            return seen  # this attempt is writing again what an earlier one showed
        if written.startswith(seen) or len(written) >= len(seen):
            if not written.startswith(seen) and not self._warned:
                self._warned = True
                log.warning(
                    "job %s: the answer of streamed reply %r differs from what an earlier "
                    "attempt showed; memoize it in a step so a retry resumes it",
                    self._ctx.event.job_id,
                    self.name,
                )
            return written
        return seen  # a different answer, shorter so far: wait until it is as long

    def _maybe_flush(self) -> None:
        wait = WHOLE_UPDATE_INTERVAL if self._streaming_over() else self._interval
        if time.monotonic() - self._last_flush >= wait:
            self.flush()

    def _streaming_over(self) -> bool:
        """Feishu's streaming window has passed (or Feishu said so): whole-card updates now.
        (``streaming_since`` None: it said so.)"""
        since = self._state.streaming_since
        return since is None or _now() >= since + cardkit.STREAMING_WINDOW - WINDOW_MARGIN

    def _card(self, text: str, streaming: bool) -> dict[str, Any]:
        """The card's JSON 2.0: one markdown element, ``ELEMENT_ID``, holding the answer."""
        config: dict[str, Any] = {"streaming_mode": streaming, "update_multi": True}
        if self._summary is not None:
            config["summary"] = {"content": self._summary}
        card: dict[str, Any] = {
            "schema": "2.0",
            "config": config,
            "body": {"elements": [{"tag": "markdown", "content": text, "element_id": ELEMENT_ID}]},
        }
        if self.stop_button and streaming:
            card["body"]["elements"].append(turns.stop_button(self._ctx.event.job_id))
        if self._title is not None:
            card["header"] = {"title": {"tag": "plain_text", "content": self._title}}
        return card

    # --- operations: sequence and text written first, then sent -----------------------------

    def _content(self, shown: str, *, marked: bool = False) -> None:
        text = shown + self._marker if marked else shown

        def send(sequence: int, uuid: str) -> None:
            cardkit.stream_text(
                self.app, self._state.card_id, ELEMENT_ID, text, sequence=sequence, uuid=uuid
            )

        try:
            self._operation(send, text=shown, marked=marked)
        except FeishuBusinessError as exc:
            if exc.feishu_code not in cardkit.STREAMING_OFF:
                raise
            # Feishu turned streaming off (its 10 minutes are up): whole-card updates now.
            self._save(self._state.but(streaming=False, streaming_since=None))
            self._whole_update(shown, closed=False, marked=marked)

    def _settings(self, *, streaming: bool, closed: bool = False) -> bool:
        """Turn streaming on or off; False when Feishu says its streaming window is over
        (then only whole-card updates change the card)."""
        settings = {"config": {"streaming_mode": streaming}}

        def send(sequence: int, uuid: str) -> None:
            cardkit.card_settings(
                self.app, self._state.card_id, settings, sequence=sequence, uuid=uuid
            )

        since = _now() if streaming else self._state.streaming_since
        try:
            self._operation(send, streaming=streaming, streaming_since=since, closed=closed)
        except FeishuBusinessError as exc:
            if exc.feishu_code not in cardkit.STREAMING_OFF:
                raise
            self._save(self._state.but(streaming=False, streaming_since=None, closed=closed))
            return False
        return True

    def _reopen(self) -> bool:
        """Streaming on again (an earlier attempt ended by an exception turned it off)."""
        return self._settings(streaming=True)

    def _whole_update(self, shown: str, *, closed: bool, marked: bool = False) -> None:
        card = self._card(shown + self._marker if marked else shown, False)

        def send(sequence: int, uuid: str) -> None:
            cardkit.update_card(self.app, self._state.card_id, card, sequence=sequence, uuid=uuid)

        self._operation(
            send,
            text=shown,
            marked=marked,
            streaming=False,
            streaming_since=None,
            closed=closed,
        )

    def _operation(self, send: Callable[[int, str], None], **changes: Any) -> None:
        """One card operation: its sequence and what it shows recorded first (fenced), then
        sent, spaced from the card's previous operation."""
        state = self._state.but(sequence=self._state.sequence + 1, **changes)
        self._save(state)
        uuid = operation_key(state.card_id, state.sequence)
        wait = self._last_operation + OPERATION_SPACING - time.monotonic()
        if wait > 0:
            time.sleep(wait)  # Feishu's 10 operations a second per card
        self._request(lambda: send(state.sequence, uuid), operation=True)
        self.operations += 1
        self._uncertain = False

    def _request(self, call: Callable[[], Any], *, operation: bool = False) -> Any:
        """Make one request: again after a 429's reset and after a 5xx or a timeout (the same
        sequence and uuid: harmless if the first one was applied). ``operation``: one on the
        card (not its creation), which the next one is spaced from."""
        ctx = self._ctx
        transient = 0
        while True:
            ctx.ensure_alive()
            ctx.ensure_in_time()
            if operation:
                self._last_operation = time.monotonic()
            self.requests += 1
            try:
                return call()
            except FeishuRateLimited as exc:
                wait = max((exc.reset_at - _now()).total_seconds(), 0.05)
                if wait > INLINE_RATE_WAIT:
                    raise Deferred(wait, f"CardKit answered 429 [{exc.code}] {exc}") from exc
                log.info("job %s: card rate limited; waiting %.2fs", ctx.event.job_id, wait)
            except FeishuTransientError:
                if transient >= len(TRANSIENT_WAITS):
                    raise
                wait = TRANSIENT_WAITS[transient]
                transient += 1
            ctx.timed_out.wait(wait)  # a backoff between tries; a timeout cuts it short

    def _save(self, state: Any) -> None:
        from ..ledger import streams

        ctx = self._ctx
        try:
            write(
                ctx,
                "record the streamed reply of",
                lambda _: streams.save(ctx.lease, self.name, state),
            )
        except LeaseLost as lost:
            ctx.mark_lost(str(lost))
            raise
        self._state = state
        self.ledger_writes += 1


class AsyncStreamedCard:
    """``StreamedCard`` for ``async`` handlers: ``await card.write(chunk)``. A write that does
    not make an update due costs no thread hop."""

    def __init__(self, card: StreamedCard) -> None:
        self._card = card

    def __getattr__(self, name: str) -> Any:
        return getattr(self._card, name)

    async def write(self, chunk: str) -> None:
        if not isinstance(chunk, str):
            raise TypeError(f"write() takes text (got {type(chunk).__name__})")
        await self.set(self._card._written + chunk)

    async def set(self, text: str) -> None:
        card = self._card
        if not isinstance(text, str):
            raise TypeError(f"set() takes text (got {type(text).__name__})")
        safe_point()  # as the sync card's: a stop ends the answer here
        card._written = text
        wait = WHOLE_UPDATE_INTERVAL if card._streaming_over() else card._interval
        if time.monotonic() - card._last_flush >= wait:
            await asyncio.to_thread(in_db_thread, card.flush)

    async def flush(self) -> None:
        await asyncio.to_thread(in_db_thread, self._card.flush)


def operation_key(card_id: str, sequence: int) -> str:
    """The uuid of a card's operation: one per card and sequence, at most 50 characters."""
    digest = hashlib.sha256(f"{card_id}\0{sequence}".encode()).hexdigest()[:32]
    return f"fc-{sequence}-{digest}"[:50]


def _now() -> datetime:
    return datetime.now(timezone.utc)


__all__ = [
    "AsyncStreamedCard",
    "Stream",
    "StreamedCard",
    "stream_reply",
    "stream_send",
]
