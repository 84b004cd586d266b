"""Deliveries built as Feishu builds them: a test event for the first hour, and for a site's
own tests.

    python manage.py inbox send-test-event --text "hello"          # to the local webhook
    body, headers = deliveries.message("default", text="hello")    # in a site's test

The body is encrypted with the app's Encrypt Key (AES-256-CBC, key SHA-256 of the Encrypt
Key, a random IV first, PKCS#7: the inverse of ``protocol.decrypt``) and signed as Feishu signs
(``X-Lark-Signature``: SHA-256 of timestamp, nonce, Encrypt Key and body); without an Encrypt
Key it is plaintext carrying the Verification Token, as Feishu sends to such an app.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import time
import uuid
from typing import Any

from ..conf import checked_settings
from ..errors import ConfigurationError
from . import protocol


def encrypt(encrypt_key: str, plaintext: bytes) -> str:
    """What ``protocol.decrypt`` opens: base64 of a random IV and the AES-256-CBC ciphertext."""
    from cryptography.hazmat.primitives import padding
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    iv = os.urandom(16)
    padder = padding.PKCS7(128).padder()
    data = padder.update(plaintext) + padder.finalize()
    key = hashlib.sha256(encrypt_key.encode()).digest()
    encryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
    return base64.b64encode(iv + encryptor.update(data) + encryptor.finalize()).decode()


def message_event(
    *, token: str, text: str, chat_id: str, private: bool = False, app_id: str = ""
) -> dict[str, Any]:
    """A v2 ``im.message.receive_v1`` envelope with fresh ids."""
    return {
        "schema": "2.0",
        "header": {
            "event_id": f"test-{uuid.uuid4().hex}",
            "event_type": "im.message.receive_v1",
            "create_time": str(int(time.time() * 1000)),
            "token": token,
            "app_id": app_id,
            "tenant_key": "test_tenant",
        },
        "event": {
            "sender": {
                "sender_id": {"open_id": "ou_test_sender"},
                "sender_type": "user",
                "tenant_key": "test_tenant",
            },
            "message": {
                "message_id": f"om_test_{uuid.uuid4().hex}",
                "chat_id": chat_id,
                "chat_type": "p2p" if private else "group",
                "message_type": "text",
                "content": json.dumps({"text": text}, ensure_ascii=False),
                "create_time": str(int(time.time() * 1000)),
            },
        },
    }


def delivery(app: str, envelope: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """(body, headers) of ``envelope`` as Feishu delivers it to ``app``: encrypted and signed
    with its Encrypt Key, or plaintext."""
    secrets_of_app = checked_settings().APPS.get(app)
    if secrets_of_app is None:
        raise ConfigurationError(
            f"No Feishu app {app!r} in FEISHU_INBOX['APPS'].", fix="Name an app of APPS."
        )
    key = secrets_of_app.get("ENCRYPT_KEY") or ""
    raw = json.dumps(envelope, ensure_ascii=False).encode()
    headers = {"Content-Type": "application/json; charset=utf-8"}
    if not key:
        return raw, headers
    body = json.dumps({"encrypt": encrypt(key, raw)}).encode()
    timestamp, nonce = str(int(time.time())), secrets.token_hex(8)
    headers.update(
        {
            "X-Lark-Request-Timestamp": timestamp,
            "X-Lark-Request-Nonce": nonce,
            "X-Lark-Signature": protocol.signature(timestamp, nonce, key, body),
        }
    )
    return body, headers


def message(
    app: str = "default",
    *,
    text: str = "hello",
    chat_id: str = "oc_test_chat",
    private: bool = False,
) -> tuple[bytes, dict[str, str]]:
    """A text message event for ``app``, as Feishu would deliver it."""
    return delivery(app, app_message_event(app, text=text, chat_id=chat_id, private=private))


def app_message_event(
    app: str = "default",
    *,
    text: str = "hello",
    chat_id: str = "oc_test_chat",
    private: bool = False,
) -> dict[str, Any]:
    """The envelope ``message()`` delivers (its ``header.event_id`` names the stored job)."""
    token = (checked_settings().APPS.get(app) or {}).get("VERIFICATION_TOKEN") or ""
    app_id = (checked_settings().APPS.get(app) or {}).get("APP_ID") or ""
    return message_event(token=token, text=text, chat_id=chat_id, private=private, app_id=app_id)
