"""One app's channel: its long connection, events over Feishu's WebSocket, each stored
before its ACK.

Written on ``websockets`` (asyncio) with this package's own frame codec (``frames.py``), not
on ``lark_oapi.ws.Client``, whose design keeps none of our promises: it ACKs after the handler
and runs it on its one event loop, has no stop, gives up silently on a fatal reconnect, has no
timeout on discovery, notices a silent server after ~50 s and logs the connect URL's ticket.

One connection's life, over and over until it is stopped:

1. discovery: ``POST {domain}/callback/ws/endpoint`` with the app's id and secret (a timeout
   on the call) answers the WebSocket URL and Feishu's ``ClientConfig``;
2. the handshake (a timeout too); a refusal Feishu calls fatal (bad credentials, the app's
   50-connection limit) raises ``ChannelRefused``, which the process reports and exits on;
3. frames: pings at ``PING_SECONDS`` at most, a pong later than ``PONG_TIMEOUT_SECONDS``
   replaces the connection; each event (reassembled from its fragments) is stored in a thread
   of the store pool (``inbound.store``, one transaction), in arrival order per partition, and
   ACKed with code 200 only after the commit. A store that fails or does not finish within
   ``ACK_BUDGET_SECONDS`` gets code 500, so Feishu redelivers. A card callback is answered
   in its ACK. Bad input is ACKed 200 (redelivery could never store it), logged, not stored;
4. lost (closed, silent, refused by the network): the next try after a jittered backoff that
   starts at ``RECONNECT_MIN_SECONDS``; it never gives up.

No log line carries the app secret, the connect URL's query (``ticket``, ``access_key``) or
an event's payload.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import random
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qs, urlsplit

from django.db import DatabaseError, DataError, IntegrityError, close_old_connections

from .. import telemetry
from ..conf import LOOPBACK_HOSTS, InboxSettings, openapi_base_url
from ..errors import InboxError
from . import frames, inbound, protocol
from .fragments import Fragments, int_header
from .frames import CONTROL, DATA, Frame, FrameError
from .inbound import database_failure, unstorable
from .protocol import ProtocolError

log = logging.getLogger("feishu_inbox.connection")

DISCOVERY_PATH = "/callback/ws/endpoint"
#: Discovery codes the SDK retries (busy, internal error); any other non-zero code is fatal.
RETRIED_DISCOVERY_CODES = (1, 1000040343)
#: Handshake refusals that no retry can mend: 403, and 514 with "too many connections".
FORBIDDEN, AUTH_FAILED, TOO_MANY_CONNECTIONS = 403, 514, 1000040350

_QUERY = re.compile(r"\?[^\s'\"]*")


def redact(text: str) -> str:
    """``text`` without URL queries (the connect URL's ``ticket`` and ``access_key``)."""
    return _QUERY.sub("?…", text)


class _Redact(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact(record.getMessage()), None
        return True


#: websockets' own debug lines print the request line, query included: they go through here.
#: Their frame dumps are off unless a site sets this logger's level itself.
wire_log = logging.getLogger("feishu_inbox.connection.websocket")
wire_log.addFilter(_Redact())
wire_log.setLevel(logging.INFO)


#: Discovery calls, each bounded: apart from the pool card callbacks and stores use.
_discovery_pool = ThreadPoolExecutor(4, thread_name_prefix="feishu-discovery")


class ChannelRefused(InboxError):
    """Feishu refused the app's long connection in a way no retry mends."""

    code = "connection_refused"

    def __init__(self, app: str, why: str, fix: str) -> None:
        super().__init__(f"App {app!r}: {why}", fix=fix)
        self.app = app


class Lost(Exception):
    """The connection is lost and will be opened again; the message says why."""


@dataclass
class ClientConfig:
    """Feishu's ``ClientConfig``: only the ping interval is used (the reconnect settings are
    ours: Feishu's defaults wait up to 30 s and 120 s between tries)."""

    ping_interval: float | None = None

    @classmethod
    def parse(cls, data: Any) -> ClientConfig | None:
        if not isinstance(data, dict):
            return None
        ping = data.get("PingInterval")
        if isinstance(ping, int | float) and not isinstance(ping, bool) and ping > 0:
            return cls(ping_interval=float(ping))
        return cls()


@dataclass
class Status:
    """What an operator sees of one connection (the dashboard; the readiness probe)."""

    app: str
    state: str = "starting"  # starting | connecting | connected | waiting | refused | stopped
    since: float = field(default_factory=time.time)
    connected_at: float | None = None
    last_event_at: float | None = None
    last_pong_at: float | None = None
    events: int = 0
    error: str = ""

    def move(self, state: str, error: str = "") -> None:
        self.state, self.since, self.error = state, time.time(), error
        self.connected_at = self.since if state == "connected" else None


@dataclass(frozen=True)
class Outcome:
    """The ACK to send: its code, and a card callback's answer."""

    code: int
    answer: dict[str, Any] | None = None


class Channel:
    """One app's long connection, run by ``run()`` until ``stop`` is set."""

    def __init__(
        self,
        app: str,
        secrets: dict[str, str],
        conf: InboxSettings,
        *,
        store_pool: Executor,
        on_change: Callable[[Status], None] = lambda status: None,
    ) -> None:
        self.app = app
        self.app_id = secrets.get("APP_ID") or ""
        self.app_secret = secrets.get("APP_SECRET") or ""
        self.base_url = openapi_base_url(secrets.get("DOMAIN") or "feishu")
        self.conf = conf
        self.store_pool = store_pool
        self.on_change = on_change
        self.status = Status(app)
        self.ping_interval = conf.PING_SECONDS
        self.fragments = Fragments(conf.MAX_BODY_BYTES)
        self.inflight: set[asyncio.Task[None]] = set()
        self.tails: dict[str, asyncio.Future[Any]] = {}  # the last store of each partition
        self.pong = asyncio.Event()
        self.ponged = False  # the current connection has answered a ping

    # --- the life of the connection ----------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Connect, serve, reconnect, until ``stop``; ``ChannelRefused`` when fatal."""
        failures = 0
        while not stop.is_set():
            self._move("connecting")
            self.ponged = False
            try:
                url, config = await self.discover()
                await self.serve(url, config, stop)
            except ChannelRefused as exc:
                self._move("refused", exc.message)
                raise
            except Exception as exc:
                self._move("waiting", redact(str(exc) or type(exc).__name__))
                failures = 1 if self.ponged else failures + 1
            if stop.is_set():
                break
            delay = self.backoff(failures)
            log.warning(
                "long connection of app %s lost (%s); connecting again in %.1fs (try %d)",
                self.app,
                self.status.error or "closed",
                delay,
                failures,
            )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
        self._move("stopped")

    def backoff(self, failures: int) -> float:
        """Seconds before the next try: from RECONNECT_MIN_SECONDS doubling to the maximum,
        each drawn from the upper half so that many processes do not come back together."""
        low, high = self.conf.RECONNECT_MIN_SECONDS, self.conf.RECONNECT_MAX_SECONDS
        ceiling = min(high, low * 2 ** max(failures - 1, 0))
        return random.uniform(ceiling / 2, ceiling) if ceiling > low else low

    def _move(self, state: str, error: str = "") -> None:
        self.status.move(state, error)
        self.on_change(self.status)

    # --- discovery and handshake -------------------------------------------------------------

    async def discover(self) -> tuple[str, ClientConfig | None]:
        """The WebSocket URL Feishu gives this app now, and its ClientConfig."""
        if not self.app_id or not self.app_secret:
            raise ChannelRefused(
                self.app,
                "has no APP_ID or APP_SECRET.",
                "Set both in FEISHU_INBOX['APPS'] (the app's credentials page).",
            )
        loop = asyncio.get_running_loop()
        try:  # the socket timeout bounds each read, not the call (DNS, a trickling server)
            answer = await asyncio.wait_for(
                loop.run_in_executor(_discovery_pool, self._post_discovery),
                self.conf.CONNECT_TIMEOUT_SECONDS + 1,
            )
        except asyncio.TimeoutError:
            raise Lost(f"discovery took over {self.conf.CONNECT_TIMEOUT_SECONDS:g}s") from None
        code = answer.get("code")
        if code in RETRIED_DISCOVERY_CODES:
            raise Lost(f"discovery answered code {code} (busy)")
        if code != 0:
            raise ChannelRefused(
                self.app,
                f"Feishu refused the long connection (code {code}: "
                f"{str(answer.get('msg'))[:200]}).",
                "Check APP_ID and APP_SECRET, and that the app is a self-built app whose "
                "event subscription is set to receive events through the long connection "
                "(developer console: Events & Callbacks).",
            )
        data = answer.get("data") if isinstance(answer.get("data"), dict) else {}
        url = data.get("URL")  # type: ignore[union-attr]
        if not isinstance(url, str):
            raise Lost("discovery answered no URL")
        self._check_url(url)
        return url, ClientConfig.parse(data.get("ClientConfig"))  # type: ignore[union-attr]

    def _post_discovery(self) -> dict[str, Any]:
        body = json.dumps({"AppID": self.app_id, "AppSecret": self.app_secret}).encode()
        request = urllib.request.Request(  # noqa: S310 - conf allows only http(s) origins
            self.base_url + DISCOVERY_PATH,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "locale": "zh"},
        )
        try:
            with urllib.request.urlopen(  # noqa: S310 - base_url is checked by conf
                request, timeout=self.conf.CONNECT_TIMEOUT_SECONDS
            ) as response:
                raw = response.read(1024 * 1024)
        except urllib.error.HTTPError as exc:
            raise Lost(f"discovery answered HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Lost(f"discovery failed: {reason}") from None
        try:
            answer = json.loads(raw)
        except ValueError:
            raise Lost("discovery answered something that is not JSON") from None
        if not isinstance(answer, dict):
            raise Lost("discovery answered JSON that is not an object")
        return answer

    def _check_url(self, url: str) -> None:
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        if parts.scheme not in ("wss", "ws") or not parts.hostname:
            raise Lost("discovery answered a URL that is not ws:// or wss://")
        if parts.scheme == "ws" and parts.hostname not in LOOPBACK_HOSTS:
            raise Lost("discovery answered a plain ws:// URL to a remote host (refused)")
        if "device_id" not in query or not query.get("service_id", [""])[0].isdigit():
            raise Lost("discovery answered a URL without device_id and service_id")

    async def handshake(self, url: str) -> Any:
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus

        try:
            return await connect(
                url,
                open_timeout=self.conf.CONNECT_TIMEOUT_SECONDS,
                ping_interval=None,  # the protocol's own pings, with their ClientConfig
                close_timeout=2,
                max_size=2 * self.conf.MAX_BODY_BYTES,
                compression=None,
                proxy=None,
                logger=wire_log,
            )
        except InvalidStatus as exc:
            headers = exc.response.headers
            status = headers.get("handshake-status")
            message = redact(str(headers.get("handshake-msg") or ""))[:200]
            auth = headers.get("handshake-autherrcode") or ""
            if status is None or "handshake-msg" not in headers:
                # not Feishu's refusal (a proxy, a load balancer): retried, as the SDK does
                raise Lost(f"handshake answered HTTP {exc.response.status_code}") from None
            if status == str(FORBIDDEN):
                raise ChannelRefused(
                    self.app,
                    f"Feishu refused the handshake (403: {message}).",
                    "Check the app's credentials and that it may use the long connection.",
                ) from None
            if status == str(AUTH_FAILED) and auth == str(TOO_MANY_CONNECTIONS):
                raise ChannelRefused(
                    self.app,
                    f"Feishu refused the handshake: the app has too many connections ({message}).",
                    "Feishu allows 50 connections per app: run fewer feishu_connect "
                    "processes (or fewer --app per process), then start this one again.",
                ) from None
            raise Lost(f"handshake refused ({status} {auth} {message})".strip()) from None

    # --- one connection ----------------------------------------------------------------------

    async def serve(self, url: str, config: ClientConfig | None, stop: asyncio.Event) -> None:
        self._configure(config)
        ws = await self.handshake(url)
        service = int(parse_qs(urlsplit(url).query)["service_id"][0])
        self.service = service
        host = urlsplit(url).hostname
        self._move("connected")
        log.info("long connection of app %s open to %s", self.app, host)
        tasks = {
            asyncio.ensure_future(self._receive(ws)),
            asyncio.ensure_future(self._ping(ws, service)),
            asyncio.ensure_future(stop.wait()),
        }
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
        if stop.is_set():
            await self._drain()
            await ws.close()
            log.info("long connection of app %s closed", self.app)
            return
        if ws.transport is not None:
            ws.transport.abort()  # no close handshake with a peer that is gone or silent
        for task in done:
            exc = task.exception() if not task.cancelled() else None
            if exc is not None:
                raise exc
        raise Lost("the server closed the connection")

    async def _drain(self) -> None:
        """Wait for the events in hand to be stored and ACKed (at most their budget)."""
        if self.inflight:
            await asyncio.wait(set(self.inflight), timeout=self.conf.ACK_BUDGET_SECONDS + 1)

    def _configure(self, config: ClientConfig | None) -> None:
        if config is not None and config.ping_interval:
            self.ping_interval = min(self.conf.PING_SECONDS, config.ping_interval)

    async def _ping(self, ws: Any, service: int) -> None:
        ping = Frame(service=service, method=CONTROL, headers=(("type", "ping"),)).encode()
        while True:
            self.pong.clear()
            try:  # a peer that stops reading fills the buffer: send() would wait for ever
                await asyncio.wait_for(ws.send(ping), self.conf.PONG_TIMEOUT_SECONDS)
            except asyncio.TimeoutError:
                raise Lost("the server stopped reading (a ping could not be sent)") from None
            try:
                await asyncio.wait_for(self.pong.wait(), self.conf.PONG_TIMEOUT_SECONDS)
            except asyncio.TimeoutError:
                raise Lost(f"no pong within {self.conf.PONG_TIMEOUT_SECONDS:g}s") from None
            await asyncio.sleep(self.ping_interval)

    async def _receive(self, ws: Any) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for message in ws:
                self._take(ws, message)
        except ConnectionClosed as exc:
            raise Lost(f"closed ({exc.rcvd.code if exc.rcvd else 'no close frame'})") from None

    def _take(self, ws: Any, message: bytes | str) -> None:
        if isinstance(message, str):
            log.warning("app %s: ignored a text message (Feishu sends binary frames)", self.app)
            return
        try:
            frame = frames.decode(message)
        except FrameError as exc:
            log.warning("app %s: ignored a frame that does not decode (%s)", self.app, exc)
            return
        if frame.method == CONTROL:
            if frame.header("type") == "pong":
                self.status.last_pong_at = time.time()
                self.ponged = True
                self.pong.set()
                if frame.payload:
                    try:
                        self._configure(ClientConfig.parse(json.loads(frame.payload)))
                    except (ValueError, RecursionError):
                        log.debug("app %s: a pong's ClientConfig is not JSON", self.app)
            return
        if frame.method != DATA:
            log.warning("app %s: ignored a frame of method %d", self.app, frame.method)
            return
        task = asyncio.ensure_future(self._data(ws, frame))
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)

    # --- one event -----------------------------------------------------------------------------

    async def _data(self, ws: Any, frame: Frame) -> None:
        received = time.monotonic()
        deadline = received + self.conf.ACK_BUDGET_SECONDS
        message_id = frame.header("message_id") or ""
        kind = frame.header("type")
        if kind != "event":  # "card" frames: the SDK ignores them too
            log.debug("app %s: ignored a data frame of type %r", self.app, kind)
            return
        try:
            total = int_header(frame, "sum", 1)
            seq = int_header(frame, "seq", 0)
            payload = frame.payload or b""
            if total > 1:
                joined = self.fragments.add(message_id, total, seq, payload)
                if joined is None:
                    return
                payload = joined
            elif len(payload) > self.conf.MAX_BODY_BYTES:
                raise ProtocolError("too_large", f"The event is over {self.conf.MAX_BODY_BYTES}.")
            outcome = await self._event(payload, deadline)
        except ProtocolError as exc:
            log.warning(
                "refused event over the long connection (app %s, %s): %s; ACKed so that "
                "Feishu does not redeliver it",
                self.app,
                exc.code,
                exc.message,
            )
            telemetry.DELIVERIES.labels(self.app, "long_connection", exc.code).inc()
            outcome = Outcome(200)
        except Exception:
            log.exception("app %s: event %s not stored; no success ACK", self.app, message_id)
            telemetry.DELIVERIES.labels(self.app, "long_connection", "not_stored").inc()
            outcome = Outcome(500)
        await self._ack(ws, frame, outcome, received)

    async def _event(self, payload: bytes, deadline: float) -> Outcome:
        body = protocol.parse_json_object(payload)
        try:
            raw: str | None = payload.decode()
        except UnicodeDecodeError:  # pragma: no cover - parse_json_object read it as text
            raw = None
        envelope = protocol.parse_envelope(body, raw=raw)
        loop = asyncio.get_running_loop()
        if envelope.event_type == protocol.CARD_ACTION:
            budget = min(self.conf.CARD_CALLBACK_BUDGET_SECONDS, deadline - time.monotonic())
            answer = await asyncio.to_thread(inbound.answer_card, self.app, envelope, budget)
            telemetry.DELIVERIES.labels(self.app, "long_connection", "card_action").inc()
            return Outcome(200, answer)
        keys = protocol.keys_for(envelope)
        partition = inbound.partition_of(self.app, keys)
        before = self.tails.get(partition)

        def store() -> bool | None:
            if time.monotonic() > deadline:  # its ACK is gone already: let Feishu redeliver
                return None
            close_old_connections()  # a connection broken by an outage is replaced
            return inbound.store(self.app, envelope, keys, transport="long_connection").created

        async def in_order() -> bool | None:
            """Stored after the chat's previous event, or not at all: when that one is not
            stored in time, or failed, this one is not stored either (both get code 500 and
            come back by redelivery), so a chat's events never commit out of arrival order."""
            if before is not None:
                await asyncio.wait({before}, timeout=max(deadline - time.monotonic(), 0))
                if not before.done() or before.cancelled() or before.exception() is not None:
                    return None
                if before.result() is None:
                    return None
            return await loop.run_in_executor(self.store_pool, store)

        stored: asyncio.Future[bool | None] = asyncio.ensure_future(in_order())
        self.tails[partition] = stored
        stored.add_done_callback(lambda f: self._forget_tail(partition, f))
        try:
            created = await asyncio.wait_for(
                asyncio.shield(stored), max(deadline - time.monotonic(), 0)
            )
        except asyncio.TimeoutError:
            log.error(
                "event %s (app %s) not stored within %.1fs; no success ACK (Feishu redelivers)",
                envelope.event_id,
                self.app,
                self.conf.ACK_BUDGET_SECONDS,
            )
            telemetry.DELIVERIES.labels(self.app, "long_connection", "not_stored").inc()
            return Outcome(500)
        except DataError as exc:  # its first line only: the others quote the payload
            reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise ProtocolError(
                "unstorable_payload", f"The database refused it: {reason}."
            ) from exc
        except IntegrityError as exc:  # a row check or a bug, not an outage: as the webhook
            log.exception("event %s (app %s): integrity error", envelope.event_id, self.app)
            raise ProtocolError("unstorable_payload", unstorable(exc)) from exc
        except DatabaseError as exc:
            cause, words = database_failure(exc)
            log.error(
                "database unavailable (%s), event %s (app %s) gets no success ACK: %s: %s",
                cause,
                envelope.event_id,
                self.app,
                type(exc).__name__,
                words,
            )
            telemetry.DELIVERIES.labels(self.app, "long_connection", "not_stored").inc()
            telemetry.DATABASE_OUTAGES.labels(self.app, "long_connection", cause).inc()
            return Outcome(500)
        if created is None:
            log.error(
                "event %s (app %s) not stored: the one before it in its chat was not; no "
                "success ACK (Feishu redelivers both)",
                envelope.event_id,
                self.app,
            )
            telemetry.DELIVERIES.labels(self.app, "long_connection", "not_stored").inc()
            return Outcome(500)
        self.status.events += 1
        self.status.last_event_at = time.time()
        if not created:
            log.debug("event %s was stored before", envelope.event_id)
        return Outcome(200)

    def _forget_tail(self, partition: str, future: asyncio.Future[Any]) -> None:
        if self.tails.get(partition) is future:
            del self.tails[partition]
        if not future.cancelled():
            future.exception()  # retrieved: its ACK reported it

    async def _ack(self, ws: Any, frame: Frame, outcome: Outcome, received: float) -> None:
        from websockets.exceptions import ConnectionClosed

        answer: dict[str, Any] = {"code": outcome.code}
        if outcome.answer is not None:  # encodable: answer_card checked it
            answer["data"] = base64.b64encode(inbound.encode_answer(outcome.answer)).decode()
        elapsed = int((time.monotonic() - received) * 1000)
        # the frame echoed whole (its unknown fields too), as the SDK does
        ack = replace(
            frame,
            headers=(*frame.headers, ("biz_rt", str(elapsed))),
            payload=json.dumps(answer).encode(),
        )
        try:
            await asyncio.wait_for(ws.send(ack.encode()), self.conf.PONG_TIMEOUT_SECONDS)
        except (ConnectionClosed, OSError, asyncio.TimeoutError):
            log.warning(
                "app %s: the ACK of %s (code %d) was lost with the connection; Feishu "
                "redelivers it, and a stored event is then a duplicate",
                self.app,
                frame.header("message_id"),
                outcome.code,
            )
