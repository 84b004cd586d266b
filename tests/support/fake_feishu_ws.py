"""A local fake of Feishu's long-connection endpoint, for tests and benchmarks.

Written from the protocol as lark-oapi 1.7.5's ``ws`` client speaks it (``PROTOCOL.md``), with
the SDK's own ``pbbp2.Frame`` (never feishu_inbox's codec), and shown to work with the SDK's
``ws.Client`` (``tests/feishu/test_fake_long_connection.py``):

- discovery: ``POST /callback/ws/endpoint`` ``{"AppID", "AppSecret"}`` on an HTTP server whose
  base URL (``url``) an app's DOMAIN points at; answers ``{"code": 0, "data": {"URL",
  "ClientConfig"}}`` with a WebSocket URL carrying ``device_id``, ``service_id``,
  ``access_key`` and a one-use ``ticket`` (wrong credentials: a non-zero code);
- the WebSocket: pings (control frames) answered with pongs carrying ``ClientConfig``; events
  pushed as data frames (``type=event``, ``message_id``, ``sum``, ``seq``, ``trace_id``),
  split over ``fragments`` frames on request; ACKs recorded (code, ``biz_rt``, card answers);
- redelivery: an event without a code-200 ACK within ``ack_timeout`` is delivered again after
  each of ``redeliver_after`` (seconds), same ``event_id``, to a random open connection of the
  app (Feishu: 3 s, then 15 s, 5 min, 1 h, 6 h);
- faults: refusals at discovery or handshake (with the ``handshake-*`` headers), the app's
  connection limit, abrupt disconnects (no close frame), a silent server (it stops reading and
  answering), raw bytes that are not frames.

Thread-safe: tests call it from their own thread; the server runs on an event loop of its own.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import secrets
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from lark_oapi.ws.pb.pbbp2_pb2 import Frame
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from tests.support import processes

DISCOVERY_PATH = "/callback/ws/endpoint"
DEFAULT_CLIENT_CONFIG = {
    "ReconnectCount": -1,
    "ReconnectInterval": 120,
    "ReconnectNonce": 30,
    "PingInterval": 120,
}


@dataclass
class Conn:
    id: int
    app_id: str
    device_id: str
    ws: ServerConnection
    opened_at: float
    closed_at: float | None = None
    pings: int = 0
    silent: bool = False


@dataclass
class Ack:
    event_id: str
    message_id: str
    conn_id: int
    code: int
    biz_rt: str | None
    data: Any
    latency: float  # seconds from the (last) frame sent to its ACK


@dataclass
class Pending:
    app_id: str
    event_id: str
    envelope: dict[str, Any]
    fragments: int
    deliveries: int = 0
    acked: bool = False
    sent_at: list[float] = field(default_factory=list)


class FakeLongConnection:
    def __init__(
        self,
        apps: dict[str, str] | None = None,
        *,
        client_config: dict[str, Any] | None = None,
        ack_timeout: float = 3.0,
        redeliver_after: tuple[float, ...] = (15, 300, 3600, 21600),
        max_connections: int = 50,
        seed: int = 0,
    ) -> None:
        self.apps = dict(apps or {"cli_fake": "fake-secret"})
        self.client_config = dict(client_config or DEFAULT_CLIENT_CONFIG)
        self.ack_timeout = ack_timeout
        self.redeliver_after = redeliver_after
        self.max_connections = max_connections
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.conns: list[Conn] = []
        self.acks: list[Ack] = []
        self.pending: dict[tuple[str, str], Pending] = {}
        self.tickets: dict[str, str] = {}  # ticket -> app_id (one use each)
        self.discoveries = 0
        self.handshakes = 0
        self.discovery_faults: list[tuple[int, int, str]] = []  # (http status, code, msg)
        self.handshake_faults: list[dict[str, str]] = []
        self.sent: dict[str, tuple[str, str, float]] = {}  # message_id -> (app, event, at)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._http: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._ws_port = 0
        self._stopped = threading.Event()

    # --- running -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._http, "start() the fake first"
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def start(self) -> FakeLongConnection:
        ready = threading.Event()

        def run_loop() -> None:
            loop = asyncio.new_event_loop()
            self.loop = loop
            loop.run_until_complete(self._open())
            ready.set()
            loop.run_forever()
            loop.close()

        thread = threading.Thread(target=run_loop, name="fake-ws", daemon=True)
        thread.start()
        self._threads.append(thread)
        assert ready.wait(10), "the fake's event loop did not start"
        http = _Discovery(("127.0.0.1", 0), _DiscoveryHandler)
        http.fake = self
        self._http = http
        t = threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        t.start()
        self._threads.append(t)
        processes.started(f"fake Feishu long connection at {self.url}", self.journal)
        return self

    def journal(self) -> str:
        """Its connections and the ACKs it received, in order (a failing test shows the last)."""
        with self.lock:
            conns = [
                f"connection {c.id} of {c.app_id}: opened {c.opened_at:.2f}, closed "
                f"{c.closed_at if c.closed_at is None else round(c.closed_at, 2)}, {c.pings} pings"
                for c in self.conns
            ]
            acks = [
                f"ack of {a.event_id} on connection {a.conn_id}: code {a.code}, {a.latency:.2f} s"
                for a in self.acks
            ]
        return "\n".join(conns + acks)

    async def _open(self) -> None:
        self._server = await serve(
            self._handle,
            "127.0.0.1",
            0,
            process_request=self._check_handshake,
            ping_interval=None,
            compression=None,
            max_size=None,
        )
        self._ws_port = self._server.sockets[0].getsockname()[1]
        self._redeliverer = asyncio.ensure_future(self._redeliver())

    def stop(self) -> None:
        if self._http:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self.loop:
            asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
        for t in self._threads:
            t.join(5)

    async def _close(self) -> None:
        self._redeliverer.cancel()
        for c in list(self.conns):
            if c.closed_at is None and c.ws.transport is not None:
                c.ws.transport.abort()
        self._server.close()

    def __enter__(self) -> FakeLongConnection:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro: Any, timeout: float = 10) -> Any:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    # --- discovery -----------------------------------------------------------------------------

    def discover(self, body: Any) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.discoveries += 1
            if self.discovery_faults:
                status, code, msg = self.discovery_faults.pop(0)
                return status, {"code": code, "msg": msg}
            if not isinstance(body, dict) or self.apps.get(body.get("AppID")) != body.get(
                "AppSecret"
            ):
                return 200, {"code": 10003, "msg": "invalid app_id or app_secret"}
            app_id = body["AppID"]
            ticket = secrets.token_hex(16)
            self.tickets[ticket] = app_id
        query = (
            f"device_id={uuid.uuid4().hex}&access_key={secrets.token_hex(8)}"
            f"&service_id={self.random.randint(1, 10**6)}&ticket={ticket}"
        )
        return 200, {
            "code": 0,
            "msg": "ok",
            "data": {
                "URL": f"ws://127.0.0.1:{self._ws_port}/ws?{query}",
                "ClientConfig": self.client_config,
            },
        }

    # --- the WebSocket -----------------------------------------------------------------------

    def _check_handshake(self, connection: ServerConnection, request: Request) -> Response | None:
        query = parse_qs(urlsplit(request.path).query)
        with self.lock:
            self.handshakes += 1
            if self.handshake_faults:
                return _refusal(connection, self.handshake_faults.pop(0))
            ticket = query.get("ticket", [""])[0]
            app_id = self.tickets.pop(ticket, None)
            if app_id is None:
                return connection.respond(401, "unknown ticket\n")
            open_now = [c for c in self.conns if c.app_id == app_id and c.closed_at is None]
            if len(open_now) >= self.max_connections:
                return _refusal(
                    connection,
                    {
                        "handshake-status": "514",
                        "handshake-msg": "exceed connection limit",
                        "handshake-autherrcode": "1000040350",
                    },
                )
        connection.fake_app = app_id  # type: ignore[attr-defined]
        connection.fake_device = query.get("device_id", [""])[0]  # type: ignore[attr-defined]
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        with self.lock:
            conn = Conn(
                id=len(self.conns),
                app_id=ws.fake_app,  # type: ignore[attr-defined]
                device_id=ws.fake_device,  # type: ignore[attr-defined]
                ws=ws,
                opened_at=time.monotonic(),
            )
            self.conns.append(conn)
        try:
            async for message in ws:
                if conn.silent:
                    continue
                frame = Frame()
                frame.ParseFromString(message)
                kind = _header(frame, "type")
                if frame.method == 0 and kind == "ping":
                    conn.pings += 1
                    pong = Frame()
                    pong.CopyFrom(frame)
                    for h in pong.headers:
                        if h.key == "type":
                            h.value = "pong"
                    pong.payload = json.dumps(self.client_config).encode()
                    await ws.send(pong.SerializeToString())
                elif frame.method == 1:
                    self._record_ack(conn, frame)
        except Exception:  # noqa: S110 - a client gone abruptly is what some tests do
            pass
        finally:
            conn.closed_at = time.monotonic()

    def _record_ack(self, conn: Conn, frame: Any) -> None:
        message_id = _header(frame, "message_id") or ""
        answer = json.loads(frame.payload or b"{}")
        data = answer.get("data")
        if data is not None:
            data = json.loads(base64.b64decode(data))
        with self.lock:
            app_id, event_id, sent = self.sent.get(message_id, ("", "", time.monotonic()))
            self.acks.append(
                Ack(
                    event_id=event_id,
                    message_id=message_id,
                    conn_id=conn.id,
                    code=int(answer.get("code", 0)),
                    biz_rt=_header(frame, "biz_rt"),
                    data=data,
                    latency=time.monotonic() - sent,
                )
            )
            pending = self.pending.get((app_id, event_id))
            late = time.monotonic() - sent > self.ack_timeout  # Feishu redelivers it anyway
            if pending is not None and answer.get("code") == 200 and not late:
                pending.acked = True

    # --- pushing events ------------------------------------------------------------------------

    def push(
        self,
        app_id: str,
        envelope: dict[str, Any],
        *,
        fragments: int = 1,
        conn: int | None = None,
    ) -> str:
        """Deliver ``envelope`` (its ``header.event_id`` names it) to one open connection of
        the app (``conn``, or one at random); redelivered until ACKed with code 200."""
        event_id = envelope["header"]["event_id"]
        pending = Pending(app_id, event_id, envelope, fragments)
        with self.lock:
            self.pending[(app_id, event_id)] = pending
        self._call(self._deliver(pending, conn))
        return event_id

    def push_raw(self, app_id: str, data: bytes, conn: int | None = None) -> None:
        """Send ``data`` as one binary message, whatever it is."""

        async def send() -> None:
            target = self._pick(app_id, conn)
            if target is not None:
                await target.ws.send(data)

        self._call(send())

    def push_payload(self, app_id: str, payload: bytes, *, conn: int | None = None) -> str:
        """A data frame whose payload is ``payload`` as given (not redelivered); its
        message_id."""
        message_id = uuid.uuid4().hex

        async def send() -> None:
            target = self._pick(app_id, conn)
            assert target is not None, "no open connection"
            with self.lock:
                self.sent[message_id] = (app_id, "", time.monotonic())
            await target.ws.send(_data_frame(message_id, payload, 1, 0).SerializeToString())

        self._call(send())
        return message_id

    def _pick(self, app_id: str, conn: int | None) -> Conn | None:
        with self.lock:
            if conn is not None:
                c = self.conns[conn]
                return c if c.closed_at is None and not c.silent else None
            open_now = [
                c for c in self.conns if c.app_id == app_id and c.closed_at is None and not c.silent
            ]
            return self.random.choice(open_now) if open_now else None

    async def _deliver(self, pending: Pending, conn: int | None = None) -> None:
        target = self._pick(pending.app_id, conn)
        pending.deliveries += 1
        pending.sent_at.append(time.monotonic())
        if target is None:
            return  # nobody to deliver to: redelivered later, as Feishu does
        message_id = uuid.uuid4().hex
        payload = json.dumps(pending.envelope).encode()
        size = -(-len(payload) // pending.fragments)
        parts = [payload[i * size : (i + 1) * size] for i in range(pending.fragments)]
        with self.lock:
            self.sent[message_id] = (pending.app_id, pending.event_id, time.monotonic())
        try:
            for seq, part in enumerate(parts):
                frame = _data_frame(message_id, part, len(parts), seq)
                await asyncio.wait_for(target.ws.send(frame.SerializeToString()), 2)
            with self.lock:
                self.sent[message_id] = (pending.app_id, pending.event_id, time.monotonic())
        except Exception:  # noqa: S110 - lost with the connection: redelivered later
            pass

    async def _redeliver(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            try:
                await self._redeliver_due()
            except Exception as exc:  # it must never stop: a test would wait for ever
                print(f"fake long connection: redelivery failed: {exc!r}", file=sys.stderr)

    async def _redeliver_due(self) -> None:
        now = time.monotonic()
        due = []
        with self.lock:
            for p in self.pending.values():
                if not p.sent_at:  # push() registered it; its first delivery is under way
                    continue
                if p.acked or p.deliveries > len(self.redeliver_after):
                    continue
                wait = self.ack_timeout + self.redeliver_after[p.deliveries - 1]
                if now - p.sent_at[-1] >= wait:
                    due.append(p)
        for p in due:
            await self._deliver(p)

    # --- faults --------------------------------------------------------------------------------

    def refuse_discovery(self, code: int = 10003, msg: str = "invalid", status: int = 200) -> None:
        with self.lock:
            self.discovery_faults.append((status, code, msg))

    def refuse_handshake(self, status: str | None, msg: str = "", autherrcode: str = "") -> None:
        """The next handshake is refused with Feishu's headers, or (``status=None``) with a
        bare HTTP 403, as a proxy in front of Feishu might answer."""
        headers = {} if status is None else {"handshake-status": status, "handshake-msg": msg}
        if autherrcode:
            headers["handshake-autherrcode"] = autherrcode
        with self.lock:
            self.handshake_faults.append(headers)

    def drop(self, conn: int | None = None) -> None:
        """Cut connections (one, or all open) without a close frame, as a network does."""

        async def cut() -> None:
            for c in self._open_conns(conn):
                if c.ws.transport is not None:
                    c.ws.transport.abort()

        self._call(cut())

    def silence(self, conn: int | None = None) -> None:
        """The server goes silent on connections (one, or all open): it reads nothing more,
        answers no ping and ACK, and sends nothing, but keeps the TCP connection open."""

        async def mute() -> None:
            for c in self._open_conns(conn):
                c.silent = True
                if c.ws.transport is not None:
                    c.ws.transport.pause_reading()

        self._call(mute())

    def _open_conns(self, conn: int | None) -> list[Conn]:
        with self.lock:
            chosen = self.conns if conn is None else [self.conns[conn]]
            return [c for c in chosen if c.closed_at is None]

    # --- reading -------------------------------------------------------------------------------

    def open_connections(self, app_id: str | None = None) -> list[Conn]:
        with self.lock:
            return [
                c
                for c in self.conns
                if c.closed_at is None and not c.silent and (app_id is None or c.app_id == app_id)
            ]

    def acks_of(self, event_id: str) -> list[Ack]:
        with self.lock:
            return [a for a in self.acks if a.event_id == event_id]

    def ack_of_message(self, message_id: str) -> Ack | None:
        with self.lock:
            return next((a for a in self.acks if a.message_id == message_id), None)

    def acked(self, event_id: str) -> bool:
        return any(a.code == 200 for a in self.acks_of(event_id))

    def all_acked(self) -> bool:
        with self.lock:
            return all(p.acked for p in self.pending.values())

    def deliveries(self, event_id: str) -> int:
        with self.lock:
            return sum(p.deliveries for (_, e), p in self.pending.items() if e == event_id)


def _header(frame: Any, key: str) -> str | None:
    for h in frame.headers:
        if h.key == key:
            return str(h.value)
    return None


def _data_frame(message_id: str, payload: bytes, total: int, seq: int) -> Any:
    frame = Frame()
    frame.SeqID = seq
    frame.LogID = 0
    frame.service = 1
    frame.method = 1
    for key, value in (
        ("type", "event"),
        ("message_id", message_id),
        ("sum", str(total)),
        ("seq", str(seq)),
        ("trace_id", uuid.uuid4().hex),
    ):
        h = frame.headers.add()
        h.key, h.value = key, value
    frame.payload = payload
    return frame


def _refusal(connection: ServerConnection, headers: dict[str, str]) -> Response:
    response = connection.respond(403, "refused\n")
    response.headers = Headers({**dict(response.headers), **headers})
    return response


def event(
    event_id: str | None = None,
    *,
    chat_id: str = "oc_chat",
    text: str = "hello",
    event_type: str = "im.message.receive_v1",
    chat_type: str = "group",
    app_id: str = "cli_fake",
) -> dict[str, Any]:
    """A schema 2.0 envelope as the long connection delivers it (no encryption, no token)."""
    event_id = event_id or uuid.uuid4().hex
    return {
        "schema": "2.0",
        "header": {
            "event_id": event_id,
            "event_type": event_type,
            "create_time": str(int(time.time() * 1000)),
            "token": "",
            "app_id": app_id,
            "tenant_key": "tenant",
        },
        "event": {
            "sender": {"sender_id": {"open_id": "ou_user"}, "sender_type": "user"},
            "message": {
                "message_id": f"om_{event_id}",
                "chat_id": chat_id,
                "chat_type": chat_type,
                "message_type": "text",
                "content": json.dumps({"text": text}),
            },
        },
    }


def card_action(event_id: str | None = None, *, value: str = "ok") -> dict[str, Any]:
    event_id = event_id or uuid.uuid4().hex
    return {
        "schema": "2.0",
        "header": {
            "event_id": event_id,
            "event_type": "card.action.trigger",
            "create_time": str(int(time.time() * 1000)),
            "token": "",
            "app_id": "cli_fake",
            "tenant_key": "tenant",
        },
        "event": {
            "operator": {"open_id": "ou_user"},
            "action": {"value": {"choice": value}, "tag": "button"},
            "context": {"open_message_id": "om_card", "open_chat_id": "oc_chat"},
        },
    }


class _Discovery(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeLongConnection


class _DiscoveryHandler(BaseHTTPRequestHandler):
    server: _Discovery

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if urlsplit(self.path).path != DISCOVERY_PATH:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        status, answer = self.server.fake.discover(body)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
