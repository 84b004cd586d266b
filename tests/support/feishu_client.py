"""Builds Feishu deliveries the way Feishu does, from the documented recipe.

Independent of feishu_inbox's own code on purpose: the tests check the webhook against this.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
import uuid
from typing import Any

from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

ENCRYPT_KEY = "kQ9-test-encrypt-key"
TOKEN = "vT0-test-verification-token"


def encrypt(key: str, plaintext: bytes) -> str:
    iv = os.urandom(16)
    padder = padding.PKCS7(128).padder()
    data = padder.update(plaintext) + padder.finalize()
    enc = Cipher(algorithms.AES(hashlib.sha256(key.encode()).digest()), modes.CBC(iv)).encryptor()
    return base64.b64encode(iv + enc.update(data) + enc.finalize()).decode()


def sign(timestamp: str, nonce: str, key: str, body: bytes) -> str:
    return hashlib.sha256((timestamp + nonce + key).encode() + body).hexdigest()


def signed_headers(
    body: bytes, key: str = ENCRYPT_KEY, timestamp: str | None = None, nonce: str | None = None
) -> dict[str, str]:
    """The three signature headers Feishu sends with ``body``."""
    ts = timestamp or str(int(time.time()))
    nc = nonce or uuid.uuid4().hex[:16]
    return {
        "X-Lark-Request-Timestamp": ts,
        "X-Lark-Request-Nonce": nc,
        "X-Lark-Signature": sign(ts, nc, key, body),
    }


def message_event(
    *,
    event_id: str | None = None,
    message_id: str | None = None,
    chat_id: str = "oc_chat1",
    chat_type: str = "group",
    text: str = "hello",
    token: str = TOKEN,
    thread_id: str | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "message_id": message_id or f"om_{uuid.uuid4().hex}",
        "chat_id": chat_id,
        "chat_type": chat_type,
        "message_type": "text",
        "content": json.dumps({"text": text}),
        "create_time": str(int(time.time() * 1000)),
    }
    if thread_id:
        message["thread_id"] = thread_id
    return {
        "schema": "2.0",
        "header": {
            "event_id": event_id or uuid.uuid4().hex,
            "event_type": "im.message.receive_v1",
            "create_time": str(int(time.time() * 1000)),
            "token": token,
            "app_id": "cli_test",
            "tenant_key": "t1",
        },
        "event": {
            "sender": {"sender_id": {"open_id": "ou_user1"}, "sender_type": "user"},
            "message": message,
        },
    }


def delivery(
    envelope: dict[str, Any] | bytes,
    *,
    key: str | None = ENCRYPT_KEY,
    timestamp: str | None = None,
    nonce: str | None = None,
    signed: bool = True,
) -> tuple[bytes, dict[str, str]]:
    """(body, headers) as Feishu sends them: encrypted and signed when there is a key."""
    raw = envelope if isinstance(envelope, bytes) else json.dumps(envelope).encode()
    if key is None:
        return raw, {"Content-Type": "application/json"}
    body = json.dumps({"encrypt": encrypt(key, raw)}).encode()
    headers = {"Content-Type": "application/json"}
    if signed:
        headers.update(signed_headers(body, key, timestamp, nonce))
    return body, headers


def django_headers(headers: dict[str, str]) -> dict[str, str]:
    """Headers for Django's test client (``HTTP_X_…`` style)."""
    out = {}
    for name, value in headers.items():
        if name.lower() == "content-type":
            continue
        out["HTTP_" + name.upper().replace("-", "_")] = value
    return out
