"""A local fake of the Feishu Open API endpoints replies go through, for tests and benchmarks.

A real HTTP server (threads, a free port on 127.0.0.1) written from Feishu's documentation,
independent of feishu_inbox's own code:

- ``POST /open-apis/auth/v3/tenant_access_token/internal`` ``{app_id, app_secret}``: a token
  and its ``expire`` (seconds). As Feishu does, it answers the same token while more than 30
  minutes of it are left, else a new one (the old one stays valid until it expires).
- ``POST /open-apis/im/v1/messages?receive_id_type=…`` (send) and
  ``POST /open-apis/im/v1/messages/{message_id}/reply`` (reply): the bearer token must be one
  it issued and unexpired (else code 99991663); the body is checked as Feishu documents it; a
  ``uuid`` seen for the same app within ``uuid_window`` (an hour) answers the first message
  and creates nothing (Feishu documents "at most one message per uuid in an hour", not its
  answer to the repeat: this is the fake's assumption).

It records every message it created (``messages``) and every request (``requests``), counts
token fetches per app, and fails on request::

    with FakeFeishu(apps={"cli_a": "secret"}) as fake:   # or fake = FakeFeishu().start()
        ...  # point APPS[...]["DOMAIN"] at fake.url
        fake.fail_next(DROP_AFTER_APPLY)       # create the message, close without answering
        fake.fail_next(RATE_LIMIT)             # 429 + x-ogw-ratelimit-reset, nothing created
        fake.fail_next(SERVER_ERROR)           # 500, nothing created
        fake.fail_next(BUSINESS_ERROR)         # 400 with Feishu code 230002, nothing created
        fake.fail_first_tries(0.2, seed=7)     # one of the first three on 20% of new uuids
        fake.token_requests("cli_a"), fake.messages, fake.counts()

A benchmark starts it the same way, sends through the client, and reads ``counts()``.

Store (ISV) apps (``store_apps={app_id: secret}``) get the ticket, app-token and per-tenant
token endpoints of ``fake_store_apps.py`` (in ``fake.store``); a tenant token authenticates
like any, and the messages it sends carry its tenant (``Message.tenant_key``).

It serves CardKit too (``fake_cardkit.py``: the cards a streamed reply writes into, in
``fake.cardkit``); ``fail_next(..., endpoint="card")`` and ``fail_first_tries`` reach its
endpoints as well (a create's first try is its card JSON's; an operation's, its uuid's).
"""

from __future__ import annotations

import json
import random
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support import fake_cardkit, fake_reactions, fake_store_apps, processes
from tests.support.fake_cardkit import CardKit, card_entity
from tests.support.fake_reactions import Reactions
from tests.support.fake_store_apps import StoreApps

TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token/internal"
SEND_PATH = "/open-apis/im/v1/messages"
REPLY_PATH = re.compile(r"^/open-apis/im/v1/messages/([^/]+)/reply$")
RECEIVE_ID_TYPES = {"chat_id", "open_id", "user_id", "union_id", "email"}
#: Request body limits: cards and rich text 30 KB, the rest (text) 150 KB.
BODY_LIMITS = {"interactive": 30 * 1024, "post": 30 * 1024}
TEXT_LIMIT = 150 * 1024
TOKEN_REUSE_SECONDS = 30 * 60  # the same token is answered while more than this is left


@dataclass(frozen=True)
class Fault:
    """What the fake does instead of answering one request normally."""

    #: drop_after_apply | slow_after_apply (created, then no answer / a late one);
    #: slow_before_apply (a reaction's add: applied ``delay`` seconds late, then answered, as
    #: a request Feishu was slow to process, its client long gone);
    #: rate_limit | server_error | garbled (a 502 page sent as JSON) | business_error
    kind: str
    #: rate_limit: the status (429; older APIs answer 400) and the x-ogw-ratelimit-reset header
    #: in seconds (None: no rate-limit headers at all).
    status: int = 429
    reset_seconds: float | None = 2
    #: business_error: Feishu's code and msg (HTTP 400).
    code: int = 230002
    msg: str = "Bot/User can NOT be out of the chat."
    #: slow_after_apply: seconds to wait before answering (longer than the client's timeout).
    delay: float = 0.0


DROP_AFTER_APPLY = Fault("drop_after_apply")
RATE_LIMIT = Fault("rate_limit")
SERVER_ERROR = Fault("server_error")
BUSINESS_ERROR = Fault("business_error")
#: What ``fail_first_tries`` picks from: none of them makes a re-send with the uuid fail.
RECOVERABLE = (DROP_AFTER_APPLY, RATE_LIMIT, SERVER_ERROR)


@dataclass
class Message:
    """A message the fake created."""

    seq: int
    message_id: str
    app_id: str
    kind: str  # send | reply
    msg_type: str
    content: str
    uuid: str | None
    chat_id: str | None  # the receive_id for chat_id sends; the parent's chat for replies
    receive_id_type: str | None = None
    receive_id: str | None = None
    parent_id: str | None = None
    reply_in_thread: bool = False
    created: float = field(default_factory=time.time)
    #: The CardKit card an interactive message carries (``{"type": "card", ...}``).
    card_id: str | None = None
    #: A store app's message: the tenant whose token sent it (``fake_store_apps.py``).
    tenant_key: str | None = None


@dataclass
class Request:
    """A message request the fake received, and what it did with it."""

    path: str
    app_id: str | None
    uuid: str | None
    #: created | duplicate | refused | <fault kind>
    outcome: str
    message_id: str | None = None


class FakeFeishu:
    def __init__(
        self,
        apps: dict[str, str] | None = None,
        *,
        token_expire: int = 7200,
        uuid_window: float = 3600.0,
        limits: dict[str, int] | None = None,
        stream_window: float = 600.0,
        card_ops_per_second: int = 10,
        store_apps: dict[str, str] | None = None,
    ) -> None:
        #: app_id -> app_secret
        self.apps = dict(apps or {"cli_fake": "fake-secret"})
        self.token_expire = token_expire
        self.uuid_window = uuid_window
        self.messages: list[Message] = []
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._token_requests: dict[str, int] = {}
        self._tokens: dict[str, tuple[str, float]] = {}  # token -> (app_id, expires at)
        self._live_token: dict[str, str] = {}  # app_id -> its newest token
        self._uuids: dict[tuple[str, str], tuple[Message, float]] = {}
        self._chats: dict[str, str] = {}  # message_id -> chat_id
        self._faults: dict[str, list[Fault]] = {
            "token": [],
            "message": [],
            "card": [],
            "reaction": [],
        }
        self.cardkit = CardKit(stream_window=stream_window, ops_per_second=card_ops_per_second)
        #: Reactions on messages, and the messages their senders recalled (fake_reactions.py).
        self.reactions = Reactions()
        #: Store (ISV) apps (app_id -> app_secret): tickets, app and tenant tokens.
        self.store = StoreApps(dict(store_apps or {}), self._lock, token_expire)
        self._first_try_faults: tuple[float, random.Random, tuple[Fault, ...]] | None = None
        self._first_tries: set[tuple[str, str]] = set()  # (app_id, uuid) already requested
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        #: Feishu's message limits, enforced when given: requests per second for each chat
        #: ("chat": 5, shared by every bot in it) and each app ("app": 50). Over one: 429,
        #: code 99991400, x-ogw-ratelimit-reset (seconds); nothing is created.
        self.limits = dict(limits or {})
        self._windows: dict[str, list[float]] = {}  # "chat:<id>" / "app:<id>" -> admitted at

    # --- running -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server, "start() the fake first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeFeishu:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-feishu"
        )
        self._thread.daemon = True
        self._thread.start()
        processes.started(f"fake Feishu Open API at {self.url}: its requests", self.journal)
        return self

    def journal(self) -> str:
        """The message requests it received, one a line (a failing test shows the last)."""
        with self._lock:
            return "\n".join(repr(request) for request in self.requests)

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeFeishu:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- scripting ---------------------------------------------------------------------------

    def fail_next(self, *faults: Fault, endpoint: str = "message") -> None:
        """The next requests to ``endpoint`` ("message": send or reply; "card": CardKit;
        "reaction": a reaction's add; "token") fail so, in order, one fault each."""
        with self._lock:
            self._faults[endpoint].extend(faults)

    def fail_first_tries(
        self, rate: float, *, seed: int = 0, faults: tuple[Fault, ...] = RECOVERABLE
    ) -> None:
        """The first request of a ``rate`` fraction of uuids meets one of ``faults`` (chosen at
        random, reproducibly from ``seed``); every later request of the uuid goes through."""
        with self._lock:
            self._first_try_faults = (rate, random.Random(seed), faults)

    def revoke_tokens(self) -> None:
        """Every token issued so far becomes invalid (code 99991663), as after a secret reset."""
        with self._lock:
            self._tokens.clear()
            self._live_token.clear()

    def add_inbound(self, message_id: str, chat_id: str) -> None:
        """A user's message (from an event) in ``chat_id``: replies to it are in that chat."""
        with self._lock:
            self._chats[message_id] = chat_id

    # --- reading -----------------------------------------------------------------------------

    def token_requests(self, app_id: str | None = None) -> int:
        with self._lock:
            if app_id is None:
                return sum(self._token_requests.values())
            return self._token_requests.get(app_id, 0)

    def counts(self) -> dict[str, int]:
        with self._lock:
            outcomes: dict[str, int] = {}
            for r in self.requests:
                outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
            return {
                "token_requests": sum(self._token_requests.values()),
                "message_requests": len(self.requests),
                "messages": len(self.messages),
                **outcomes,
            }

    # --- the endpoints (called on the server's threads) --------------------------------------

    def issue_token(self, body: Any) -> tuple[int, dict[str, Any]]:
        app_id = body.get("app_id") if isinstance(body, dict) else None
        with self._lock:
            self._token_requests[str(app_id)] = self._token_requests.get(str(app_id), 0) + 1
            if app_id not in self.apps:
                return 400, {"code": 10003, "msg": "invalid param: app_id not found"}
            if body.get("app_secret") != self.apps[app_id]:
                return 400, {"code": 10014, "msg": "app secret invalid"}
            now = time.time()
            token = self._live_token.get(app_id)
            left = self._tokens[token][1] - now if token in self._tokens else 0.0
            if left <= TOKEN_REUSE_SECONDS:
                token = f"t-{secrets.token_hex(16)}"
                left = float(self.token_expire)
                self._tokens[token] = (app_id, now + left)
                self._live_token[app_id] = token
            return 200, {
                "code": 0,
                "msg": "ok",
                "tenant_access_token": token,
                "expire": int(left),
            }

    def next_fault(self, endpoint: str, app_id: str | None, uuid: str | None) -> Fault | None:
        with self._lock:
            if self._faults[endpoint]:
                return self._faults[endpoint].pop(0)
            chance = self._first_try_faults
            if endpoint == "token" or not chance or not app_id or not uuid:
                return None
            if (app_id, uuid) in self._first_tries:
                return None
            self._first_tries.add((app_id, uuid))
            rate, rng, faults = chance
            return rng.choice(faults) if rng.random() < rate else None

    def authenticate(self, authorization: str | None) -> str | None:
        """The app the bearer token belongs to, or None."""
        token = (authorization or "").removeprefix("Bearer ").strip()
        with self._lock:
            found = self._tokens.get(token)
            if found and found[1] > time.time():
                return found[0]
            tenants = self.store.tenant_tokens.get(token)  # a store app's tenant's token
            if tenants and tenants[2] > time.time():
                return tenants[0]
        return None

    def admit(self, app_id: str, kind: str, fields: dict[str, Any]) -> float | None:
        """None when the request is within the limits (and counts against them), else the
        seconds until it would be (a sliding window of one second)."""
        if not self.limits:
            return None
        with self._lock:
            chat = self._chats.get(fields.get("parent_id") or "")
            if kind == "send" and fields.get("receive_id_type") == "chat_id":
                chat = fields.get("receive_id")
            keys = [(f"app:{app_id}", self.limits.get("app"))]
            if chat:
                keys.append((f"chat:{chat}", self.limits.get("chat")))
            now = time.monotonic()
            wait = 0.0
            for key, limit in keys:
                window = [t for t in self._windows.get(key, []) if now - t < 1.0]
                self._windows[key] = window
                if limit is not None and len(window) >= limit:
                    wait = max(wait, 1.0 - (now - window[-limit]))
            if wait > 0:
                return wait
            for key, _ in keys:
                self._windows[key].append(now)
            return None

    def record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def apply(self, app_id: str, kind: str, fields: dict[str, Any]) -> tuple[Message, bool]:
        """Create the message, or find the one its uuid created: (message, created). Raises
        ``Refused`` for a card entity that does not exist or was sent before."""
        uuid = fields.get("uuid") or None
        with self._lock:
            now = time.time()
            if uuid:
                seen = self._uuids.get((app_id, uuid))
                if seen and now - seen[1] < self.uuid_window:
                    return seen[0], False
            message_id = f"om_{secrets.token_hex(12)}"
            entity = card_entity(fields["content"]) if fields["msg_type"] == "interactive" else None
            if entity is not None:
                refused = self.cardkit.send(app_id, entity, message_id)
                if refused:
                    raise Refused(*refused)
            parent = fields.get("parent_id")
            chat_id = self._chats.get(parent) if parent else None
            if kind == "send":
                rid, rtype = fields["receive_id"], fields["receive_id_type"]
                chat_id = rid if rtype == "chat_id" else f"oc_p2p_{rtype}_{rid}"
            message = Message(
                seq=len(self.messages) + 1,
                message_id=message_id,
                app_id=app_id,
                kind=kind,
                msg_type=fields["msg_type"],
                content=fields["content"],
                uuid=uuid,
                chat_id=chat_id,
                receive_id_type=fields.get("receive_id_type"),
                receive_id=fields.get("receive_id"),
                parent_id=parent,
                reply_in_thread=bool(fields.get("reply_in_thread")),
                card_id=entity["data"]["card_id"] if entity else None,
                tenant_key=fields.get("tenant_key"),
            )
            self.messages.append(message)
            if chat_id:
                self._chats[message.message_id] = chat_id
            if uuid:
                self._uuids[(app_id, uuid)] = (message, now)
            return message, True


class Refused(Exception):
    """Feishu refuses the request (HTTP 400 with this code and msg); nothing was created."""

    def __init__(self, code: int, msg: str) -> None:
        super().__init__(msg)
        self.code, self.msg = code, msg


def message_problems(kind: str, body: Any, receive_id_type: str | None, size: int) -> list[str]:
    """What Feishu would refuse in a send or reply request (field validation)."""
    if not isinstance(body, dict):
        return ["body must be a JSON object"]
    problems = []
    if kind == "send":
        if receive_id_type not in RECEIVE_ID_TYPES:
            problems.append(f"receive_id_type {receive_id_type!r} is invalid")
        if not isinstance(body.get("receive_id"), str) or not body["receive_id"]:
            problems.append("receive_id is required")
    if not isinstance(body.get("msg_type"), str) or not body["msg_type"]:
        problems.append("msg_type is required")
    content = body.get("content")
    try:
        parsed = json.loads(content) if isinstance(content, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        problems.append("content must be the JSON string of an object")
    uuid = body.get("uuid")
    if uuid is not None and (not isinstance(uuid, str) or len(uuid) > 50):
        problems.append("uuid must be a string of at most 50 characters")
    if "reply_in_thread" in body and not isinstance(body["reply_in_thread"], bool):
        problems.append("reply_in_thread must be a boolean")
    if size > BODY_LIMITS.get(str(body.get("msg_type")), TEXT_LIMIT):
        problems.append("the message is too large")
    return problems


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # socketserver's 5 resets connections of a burst of senders
    fake: FakeFeishu

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away (a timeout) is part of the tests


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        fake = self.server.fake
        url = urlsplit(self.path)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if url.path == fake_cardkit.CARDS_PATH:
            self.card_operation("create", None, None, body)
            return
        reactions = fake_reactions.REACTIONS_PATH.match(url.path)
        if reactions:
            app_id = fake.authenticate(self.headers.get("Authorization"))
            if app_id is None:
                self.answer(400, {"code": 99991663, "msg": "Invalid access token."})
                return
            fault = fake.next_fault("reaction", app_id, None)
            if fault and fault.kind == "slow_before_apply":
                time.sleep(fault.delay)
            self.answer(*fake.reactions.add(app_id, reactions.group(1), body))
            return
        if url.path in fake_store_apps.PATHS:
            fault = fake.next_fault("token", None, None)
            if fault:
                self.fault(fault, applied=False)
                return
            self.answer(*fake.store.answer(url.path, body))
            return
        if url.path == TOKEN_PATH:
            fault = fake.next_fault("token", None, None)
            if fault:
                self.fault(fault, applied=False)
                return
            self.answer(*fake.issue_token(body))
            return
        reply = REPLY_PATH.match(url.path)
        if url.path != SEND_PATH and not reply:
            self.answer(404, {"code": 404, "msg": "404 page not found"})
            return
        kind = "reply" if reply else "send"
        receive_id_type = (parse_qs(url.query).get("receive_id_type") or [None])[0]
        app_id = fake.authenticate(self.headers.get("Authorization"))
        uuid = body.get("uuid") if isinstance(body, dict) else None
        if app_id is None:
            fake.record(Request(url.path, None, uuid, "refused"))
            self.answer(
                400,
                {
                    "code": 99991663,
                    "msg": "Invalid access token for authorization. "
                    "Please make a request with token attached.",
                },
            )
            return
        problems = message_problems(kind, body, receive_id_type, len(raw))
        if problems:
            fake.record(Request(url.path, app_id, uuid, "refused"))
            code = 230025 if problems == ["the message is too large"] else 99992402
            self.answer(
                400, {"code": code, "msg": "field validation failed: " + "; ".join(problems)}
            )
            return
        assert isinstance(body, dict)
        fields = {**body, "receive_id_type": receive_id_type}
        bearer = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        fields["tenant_key"] = fake.store.tenant_of(bearer)
        if reply:
            fields["parent_id"] = reply.group(1)
            if reply.group(1) in fake.reactions.recalled:
                fake.record(Request(url.path, app_id, uuid, "refused"))
                self.answer(
                    400, {"code": fake_reactions.WITHDRAWN, "msg": "The message was withdrawn."}
                )
                return
        reset = fake.admit(app_id, kind, fields)
        if reset is not None:
            fake.record(Request(url.path, app_id, uuid, "rate_limited"))
            self.fault(Fault("rate_limit", reset_seconds=round(reset, 3)), applied=False)
            return
        fault = fake.next_fault("message", app_id, uuid)
        if fault and fault.kind in ("rate_limit", "server_error", "garbled", "business_error"):
            fake.record(Request(url.path, app_id, uuid, fault.kind))
            self.fault(fault, applied=False)
            return
        try:
            message, created = fake.apply(app_id, kind, fields)
        except Refused as refused:
            fake.record(Request(url.path, app_id, uuid, "refused"))
            self.answer(400, {"code": refused.code, "msg": refused.msg})
            return
        outcome = fault.kind if fault else ("created" if created else "duplicate")
        fake.record(Request(url.path, app_id, uuid, outcome, message.message_id))
        if fault:
            self.fault(fault, applied=True)
            if fault.kind != "slow_after_apply":
                return
        self.answer(200, {"code": 0, "msg": "success", "data": message_data(message)})

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        reactions = fake_reactions.REACTIONS_PATH.match(url.path)
        if not reactions:
            self.answer(404, {"code": 404, "msg": "404 page not found"})
            return
        if self.server.fake.authenticate(self.headers.get("Authorization")) is None:
            self.answer(400, {"code": 99991663, "msg": "Invalid access token."})
            return
        self.answer(*self.server.fake.reactions.list(reactions.group(1), parse_qs(url.query)))

    def do_DELETE(self) -> None:
        reaction = fake_reactions.REACTION_PATH.match(urlsplit(self.path).path)
        if not reaction:
            self.answer(404, {"code": 404, "msg": "404 page not found"})
            return
        app_id = self.server.fake.authenticate(self.headers.get("Authorization"))
        if app_id is None:
            self.answer(400, {"code": 99991663, "msg": "Invalid access token."})
            return
        self.answer(*self.server.fake.reactions.delete(app_id, *reaction.groups()))

    def do_PUT(self) -> None:
        path = urlsplit(self.path).path
        content = fake_cardkit.CONTENT_PATH.match(path)
        card = fake_cardkit.CARD_PATH.match(path)
        if content:
            self.card_operation("content", content.group(1), content.group(2), self.json_body())
        elif card:
            self.card_operation("update", card.group(1), None, self.json_body())
        else:
            self.answer(404, {"code": 404, "msg": "404 page not found"})

    def do_PATCH(self) -> None:
        settings = fake_cardkit.SETTINGS_PATH.match(urlsplit(self.path).path)
        if settings:
            self.card_operation("settings", settings.group(1), None, self.json_body())
        else:
            self.answer(404, {"code": 404, "msg": "404 page not found"})

    def json_body(self) -> Any:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            return json.loads(raw)
        except ValueError:
            return None

    def card_operation(
        self, operation: str, card_id: str | None, element_id: str | None, body: Any
    ) -> None:
        """A CardKit request: authenticated, then faulted as scripted, then applied."""
        fake = self.server.fake
        kit = fake.cardkit
        app_id = fake.authenticate(self.headers.get("Authorization"))
        if app_id is None:
            self.answer(400, {"code": 99991663, "msg": "Invalid access token for authorization."})
            return
        if operation == "create":
            digest = json.dumps(body, sort_keys=True)
            key = f"create:{digest}"
        else:
            key = body.get("uuid") if isinstance(body, dict) else None
        fault = fake.next_fault("card", app_id, key)
        if fault and fault.kind in ("rate_limit", "server_error", "garbled", "business_error"):
            if card_id in kit.cards:
                kit.cards[card_id].arrivals.append(time.monotonic())
            kit.requests.append(
                fake_cardkit.CardRequest(operation, app_id, card_id, None, key, fault.kind)
            )
            self.fault(fault, applied=False)
            return
        headers: dict[str, str] = {}
        if operation == "create":
            status, answer, _ = kit.create(app_id, body)
        else:
            assert card_id is not None
            status, answer, headers = kit.operate(operation, app_id, card_id, element_id, body)
        if fault and status == 200:
            if fault.kind == "slow_after_apply" and card_id:
                with fake._lock:
                    kit.delayed[card_id] = kit.delayed.get(card_id, 0) + 1
            try:
                self.fault(fault, applied=True)
            finally:
                if fault.kind == "slow_after_apply" and card_id:
                    with fake._lock:
                        kit.delayed[card_id] -= 1
            if fault.kind != "slow_after_apply":
                return
        self.answer(status, answer, headers)

    def fault(self, fault: Fault, *, applied: bool) -> None:
        if fault.kind == "drop_after_apply":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)  # no answer at all
        elif fault.kind == "slow_after_apply":
            time.sleep(fault.delay)
        elif fault.kind == "rate_limit":
            headers = {}
            if fault.reset_seconds is not None:
                headers = {
                    "x-ogw-ratelimit-limit": "50",
                    "x-ogw-ratelimit-reset": f"{fault.reset_seconds:g}",
                }
            body = {"code": 99991400, "msg": "request trigger frequency limit"}
            self.answer(fault.status, body, headers)
        elif fault.kind == "server_error":
            self.answer_raw(500, b"Internal Server Error", "text/plain")
        elif fault.kind == "garbled":  # a gateway's page that claims to be JSON
            self.answer_raw(502, b"<html>502 Bad Gateway</html>", "application/json")
        elif fault.kind == "business_error":
            self.answer(400, {"code": fault.code, "msg": fault.msg})
        else:
            raise ValueError(f"unknown fault {fault.kind!r}")

    def answer(
        self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(body, ensure_ascii=False).encode()
        self.answer_raw(status, data, "application/json; charset=utf-8", headers)

    def answer_raw(
        self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Tt-Logid", f"fake{secrets.token_hex(8)}")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


def message_data(message: Message) -> dict[str, Any]:
    """The ``data`` of Feishu's answer: the message as created."""
    millis = str(int(message.created * 1000))
    return {
        "message_id": message.message_id,
        "root_id": message.parent_id or "",
        "parent_id": message.parent_id or "",
        "msg_type": message.msg_type,
        "create_time": millis,
        "update_time": millis,
        "deleted": False,
        "updated": False,
        "chat_id": message.chat_id or "",
        "sender": {
            "id": message.app_id,
            "id_type": "app_id",
            "sender_type": "app",
            "tenant_key": message.tenant_key or "fake_tenant",
        },
        "body": {"content": message.content},
    }
