"""Standard Webhooks signatures (standardwebhooks.com): secrets, ids and the signed headers.

A secret is ``whsec_`` and the base64 of 32 random bytes; a message is signed with
HMAC-SHA256 over ``{webhook-id}.{webhook-timestamp}.{body}``, sent as ``v1,<base64>``; while a
rotated secret is in its grace period both signatures are sent, separated by a space, and a
receiver holding either secret verifies the request.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"  # noqa: S105 (the prefix, not a secret)


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def new_id(prefix: str) -> str:
    """``msg_…`` or ``ep_…``: 22 url-safe random characters after the prefix."""
    return f"{prefix}_{secrets.token_urlsafe(16)}"


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256>`` of the message."""
    mac = hmac.new(_key(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


def headers(msg_id: str, timestamp: int, body: bytes, secrets_: list[str]) -> dict[str, str]:
    """The three headers, signed with each secret (the current one first)."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(s, msg_id, timestamp, body) for s in secrets_),
    }
