"""The Feishu (Lark) event protocol: decryption, signatures, envelopes, and the ledger keys.

Facts are from Feishu's event-subscription docs and the official SDK (lark-oapi): see
``shared/feishu/PROTOCOL.md``. Everything here is pure: no database, no Django request.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InboxError
from ..ledger.payloads import MAX_JSON_DEPTH, nests_deeper_than


class ProtocolError(InboxError):
    """A delivery the webhook refuses; ``status`` is the HTTP status it answers with."""

    code = "bad_request"
    status = 400

    def __init__(self, code: str, message: str, *, status: int = 400) -> None:
        super().__init__(message, fix="")
        self.code = code
        self.status = status


# --- encryption and signature --------------------------------------------------------------


def decrypt(encrypt_key: str, encrypted: str) -> bytes:
    """AES-256-CBC: key = SHA-256(Encrypt Key), IV = first 16 bytes, PKCS#7 padding."""
    try:
        raw = base64.b64decode(encrypted, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProtocolError("undecryptable", "The encrypt field is not base64.") from exc
    if len(raw) < 32 or len(raw) % 16:
        raise ProtocolError("undecryptable", "The encrypted body has an impossible length.")
    # Imported here: a worker or a command never decrypts, and cryptography's import is a
    # twelfth of a worker's start-up (the webhook and the long connection pay it once).
    from cryptography.hazmat.primitives import padding
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    key = hashlib.sha256(encrypt_key.encode()).digest()
    decryptor = Cipher(algorithms.AES(key), modes.CBC(raw[:16])).decryptor()
    padded = decryptor.update(raw[16:]) + decryptor.finalize()
    unpadder = padding.PKCS7(128).unpadder()
    try:
        return unpadder.update(padded) + unpadder.finalize()
    except ValueError as exc:
        raise ProtocolError(
            "undecryptable", "The body does not decrypt with the configured Encrypt Key."
        ) from exc


def signature(timestamp: str, nonce: str, encrypt_key: str, body: bytes) -> str:
    """hex SHA-256 of timestamp + nonce + Encrypt Key, then the raw body bytes."""
    digest = hashlib.sha256((timestamp + nonce + encrypt_key).encode())
    digest.update(body)
    return digest.hexdigest()


def signature_matches(
    timestamp: str, nonce: str, encrypt_key: str, body: bytes, given: str
) -> bool:
    expected = signature(timestamp, nonce, encrypt_key, body)
    return hmac.compare_digest(expected.encode(), given.strip().lower().encode())


def token_matches(expected: str, given: object) -> bool:
    if not isinstance(given, str):
        return False
    try:
        given_bytes = given.encode()
    except UnicodeEncodeError:  # a lone surrogate (a \u escape of half a character): no token
        return False
    return hmac.compare_digest(expected.encode(), given_bytes)


# --- envelopes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Envelope:
    """A decoded delivery: schema 2.0 (``header``) or 1.0 (``uuid``/``event.type``)."""

    schema: str
    event_id: str
    event_type: str
    token: str | None
    body: dict[str, Any]
    #: The envelope's JSON text as decoded from the delivery (stored as the payload).
    raw: str | None = None

    @property
    def event(self) -> dict[str, Any]:
        event = self.body.get("event")
        return event if isinstance(event, dict) else {}

    @property
    def tenant_key(self) -> str:
        """The tenant (organisation) the event is from: schema 2.0's ``header.tenant_key``,
        1.0's ``event.tenant_key``; "" when it names none (an ``app_ticket``). Its job's tenant
        (SPEC §9j): cut to the column's 64 characters, never a lone surrogate."""
        header = self.body.get("header")
        found = header.get("tenant_key") if isinstance(header, dict) else None
        if not isinstance(found, str):
            found = self.event.get("tenant_key")
        return storable(found[:64], "tenant_key") if isinstance(found, str) else ""


def _not_json(constant: str) -> Any:
    """Python's json reads NaN, Infinity and -Infinity; JSON has no such values, and a ledger
    on SQLite could not store them (its JSON check refuses them), so they are refused here,
    on every database, before anything is stored."""
    raise ValueError(f"{constant} is not a JSON value")


def _reason(exc: Exception) -> str:
    return str(exc).split(":")[0][:80] if isinstance(exc, ValueError) else "not UTF-8"


def parse_json_object(raw: bytes) -> dict[str, Any]:
    if nests_deeper_than(raw):
        raise ProtocolError(
            "too_deep", f"The body's JSON nests deeper than {MAX_JSON_DEPTH} levels."
        )
    try:
        data = json.loads(raw, parse_constant=_not_json)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError("invalid_json", f"The body is not JSON ({_reason(exc)}).") from exc
    if not isinstance(data, dict):
        raise ProtocolError("invalid_json", "The body is JSON but not an object.")
    return data


def is_url_verification(body: dict[str, Any]) -> bool:
    return body.get("type") == "url_verification"


def parse_envelope(body: dict[str, Any], raw: str | None = None) -> Envelope:
    schema = body.get("schema")
    if schema is not None:
        if schema != "2.0":
            raise ProtocolError("unknown_schema", f"Unknown event schema {str(schema)[:20]!r}.")
        header = body.get("header")
        if not isinstance(header, dict):
            raise ProtocolError("missing_fields", "A schema 2.0 event needs a header object.")
        event_id, event_type = header.get("event_id"), header.get("event_type")
        token = header.get("token")
    elif body.get("type") == "event_callback" or "uuid" in body:
        schema = "1.0"
        event = body.get("event")
        event_id = body.get("uuid")
        event_type = event.get("type") if isinstance(event, dict) else None
        token = body.get("token")
    else:
        raise ProtocolError(
            "unknown_schema", "Neither a schema 2.0 nor a schema 1.0 event envelope."
        )
    for name, value in (("event id", event_id), ("event type", event_type)):
        if not isinstance(value, str) or not value or len(value) > 128:
            raise ProtocolError("missing_fields", f"The event has no usable {name}.")
        storable(value, name)
    return Envelope(
        schema=schema,
        event_id=event_id,  # type: ignore[arg-type]
        event_type=event_type,  # type: ignore[arg-type]
        token=token if isinstance(token, str) else None,
        body=body,
        raw=raw,
    )


# --- one delivery, step by step ----------------------------------------------------------------

#: The signature headers, as WSGI names them.
SIGNATURE_HEADERS = (
    "HTTP_X_LARK_REQUEST_TIMESTAMP",
    "HTTP_X_LARK_REQUEST_NONCE",
    "HTTP_X_LARK_SIGNATURE",
)


@dataclass(frozen=True)
class Delivery:
    """What a delivery turned out to be: an event, or (no envelope) a URL verification."""

    envelope: Envelope | None = None
    challenge: str = ""


def open_delivery(
    *,
    app: str,
    secrets: dict[str, str],
    body: bytes,
    headers: Mapping[str, str],
    replay_window: float | None,
    now: float,
) -> Delivery:
    """Verify and decode one delivery: signature → decrypt → challenge → token.

    ``headers`` are the request's WSGI headers (``HTTP_X_LARK_SIGNATURE`` …). Raises
    ``ProtocolError`` (with the HTTP status to answer) for anything Feishu did not send.
    """
    encrypt_key = secrets.get("ENCRYPT_KEY") or ""
    token = secrets.get("VERIFICATION_TOKEN") or ""
    signed = bool(encrypt_key) and any(h in headers for h in SIGNATURE_HEADERS)
    if signed:  # before anything is parsed: the signature covers the raw body
        check_signature(headers, body, encrypt_key, replay_window=replay_window, now=now)
    outer = parse_json_object(body)
    if "encrypt" in outer:
        if not encrypt_key:
            raise ProtocolError(
                "undecryptable",
                f"The body is encrypted but app {app!r} has no Encrypt Key configured.",
            )
        if not isinstance(outer["encrypt"], str):
            raise ProtocolError("undecryptable", "The encrypt field is not a string.")
        inner_raw = decrypt(encrypt_key, outer["encrypt"])
        try:
            inner = parse_json_object(inner_raw)
        except ProtocolError as exc:  # a wrong key can leave valid padding over garbage
            if exc.code != "invalid_json":
                raise
            raise ProtocolError(
                "undecryptable",
                "The body does not decrypt to a JSON object with the configured Encrypt Key.",
            ) from exc
    elif encrypt_key:
        raise ProtocolError(
            "not_encrypted", f"App {app!r} has an Encrypt Key: the body must be encrypted."
        )
    else:
        inner_raw, inner = body, outer

    if is_url_verification(inner):  # carries no signature headers
        if token and not token_matches(token, inner.get("token")):
            raise ProtocolError("bad_token", "Wrong verification token.", status=401)
        challenge = inner.get("challenge")
        if not isinstance(challenge, str):
            raise ProtocolError("missing_fields", "The URL verification has no challenge.")
        return Delivery(challenge=challenge)

    if encrypt_key and not signed:
        raise ProtocolError(
            "missing_signature", "The X-Lark-Signature headers are missing.", status=401
        )
    try:
        raw_text: str | None = inner_raw.decode("utf-8")
    except UnicodeDecodeError:  # JSON in another encoding: stored re-serialised
        raw_text = None
    envelope = parse_envelope(inner, raw=raw_text)
    if token and not token_matches(token, envelope.token):
        raise ProtocolError("bad_token", "Wrong verification token.", status=401)
    return Delivery(envelope=envelope)


def check_signature(
    headers: Mapping[str, str],
    body: bytes,
    encrypt_key: str,
    *,
    replay_window: float | None,
    now: float,
) -> None:
    """The signature over the raw body, then the timestamp's distance from ``now``."""
    timestamp, nonce, given = (headers.get(h, "") for h in SIGNATURE_HEADERS)
    if not (timestamp and nonce and given):
        raise ProtocolError(
            "missing_signature",
            "Some X-Lark-Request-* signature headers are missing.",
            status=401,
        )
    if not signature_matches(timestamp, nonce, encrypt_key, body, given):
        raise ProtocolError("bad_signature", "The signature does not match.", status=401)
    if replay_window is None:
        return
    try:
        age = abs(now - int(timestamp))
    except ValueError:
        raise ProtocolError(
            "stale_timestamp", "X-Lark-Request-Timestamp is not a number.", status=401
        ) from None
    except OverflowError:  # more digits than any clock has: int - float cannot be computed
        raise ProtocolError(
            "stale_timestamp", "X-Lark-Request-Timestamp is no time of this era.", status=401
        ) from None
    if age > replay_window:
        raise ProtocolError(
            "stale_timestamp",
            f"The request timestamp is {age:.0f}s away from now (limit {replay_window:.0f}s).",
            status=401,
        )


# --- ledger keys ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EventKeys:
    """What the ledger needs to know about an event besides its payload."""

    dedupe_key: str
    #: Events with the same partition key run one at a time, in receipt order.
    partition_key: str
    #: A private (p2p) message: a newer one in the same chat supersedes it (SPEC §4).
    private_message: bool = False


KeyFunction = Callable[[Envelope], EventKeys]
_key_functions: dict[str, KeyFunction] = {}


def event_keys(event_type: str) -> Callable[[KeyFunction], KeyFunction]:
    """Register a site's own keys for one event type::

    @feishu_inbox.event_keys("im.message.receive_v1")
    def keys(envelope):
        return EventKeys(dedupe_key=..., partition_key=..., private_message=...)
    """

    def register(fn: KeyFunction) -> KeyFunction:
        _key_functions[event_type] = fn
        return fn

    return register


def storable(value: str, field: str) -> str:
    """``value``, if the database can store it as text: a lone surrogate (``"\\udc00"``, which
    JSON's ``\\u`` escapes can carry) has no UTF-8 form, so no driver can send it. The ledger's
    keys come from such fields (the event id, the chat, thread, message and user ids)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError(
            "unstorable_key",
            f"The {field} holds a lone surrogate (a \\u escape of half a character): it "
            "cannot be stored.",
        ) from None
    return value


def _get(data: Any, *path: str) -> Any:
    for name in path:
        if not isinstance(data, dict):
            return None
        data = data.get(name)
    return data


def _first_str(event: dict[str, Any], paths: tuple[tuple[str, ...], ...]) -> str | None:
    for path in paths:
        value = _get(event, *path)
        if isinstance(value, str) and value:
            return storable(value, f"event's {'.'.join(path)}")
    return None


_CHAT_PATHS = (("message", "chat_id"), ("chat_id",), ("context", "open_chat_id"), ("open_chat_id",))
_USER_PATHS = (
    ("sender", "sender_id", "open_id"),
    ("operator", "open_id"),
    ("operator", "operator_id", "open_id"),
    ("operator_id", "open_id"),
    ("user_id", "open_id"),
    ("user", "open_id"),
    ("open_id",),
)


def default_keys(envelope: Envelope) -> EventKeys:
    """The documented defaults.

    - dedupe: ``message:<message_id>`` for ``im.message.receive_v1`` (Feishu may deliver one
      message under several event ids), else ``event:<event id>``;
    - partition: ``chat:<chat_id>`` (``:thread:<thread_id>`` appended for topic threads) when the
      event names a chat; else ``user:<open_id>`` when it names a user; else the event itself
      (``event:<id>``: no ordering with other events);
    - private: the message's ``chat_type`` is ``p2p``.
    """
    event = envelope.event
    message_id = _get(event, "message", "message_id")
    if envelope.event_type == "im.message.receive_v1" and isinstance(message_id, str):
        dedupe = f"message:{storable(message_id, 'message id')}"
    else:
        dedupe = f"event:{envelope.event_id}"
    chat = _first_str(event, _CHAT_PATHS)
    if chat:
        partition = f"chat:{chat}"
        thread = _get(event, "message", "thread_id")
        if isinstance(thread, str) and thread:
            partition += f":thread:{storable(thread, 'thread id')}"
    elif user := _first_str(event, _USER_PATHS):
        partition = f"user:{user}"
    else:
        partition = f"event:{envelope.event_id}"
    private = _get(event, "message", "chat_type") == "p2p"
    return EventKeys(dedupe_key=dedupe[:255], partition_key=partition, private_message=private)


def has_key_function(event_type: str) -> bool:
    """Whether the site registered its own key function for this event type."""
    return event_type in _key_functions


def keys_for(envelope: Envelope) -> EventKeys:
    fn = _key_functions.get(envelope.event_type, default_keys)
    keys = fn(envelope)
    if not isinstance(keys, EventKeys):
        raise TypeError(
            f"The key function for {envelope.event_type} returned {type(keys).__name__}, "
            "not EventKeys."
        )
    storable(keys.dedupe_key, "dedupe key")  # a site's own key function's, too
    storable(keys.partition_key, "partition key")
    return keys


# --- card action callbacks -----------------------------------------------------------------


@dataclass(frozen=True)
class CardAction:
    """What a card callback sees: the envelope and the app it came in on."""

    app: str
    envelope: Envelope

    @property
    def action(self) -> dict[str, Any]:
        action = self.envelope.event.get("action")
        return action if isinstance(action, dict) else {}

    @property
    def operator_open_id(self) -> str | None:
        return _first_str(self.envelope.event, (("operator", "open_id"),))


CardCallback = Callable[[CardAction], dict[str, Any]]
_card_callbacks: dict[str, CardCallback] = {}
CARD_ACTION = "card.action.trigger"


def card_callback(app: str = "*") -> Callable[[CardCallback], CardCallback]:
    """Register the synchronous answer to ``card.action.trigger`` (for one app, or all)::

    @feishu_inbox.card_callback()
    def on_card(action):
        ledger.enqueue(...)  # durable follow-up work, if any
        return {"toast": {"type": "success", "content": "Done"}}
    """

    def register(fn: CardCallback) -> CardCallback:
        _card_callbacks[app] = fn
        return fn

    return register


def card_callback_for(app: str) -> CardCallback | None:
    return _card_callbacks.get(app) or _card_callbacks.get("*")
