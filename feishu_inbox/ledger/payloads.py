"""Limits on the JSON the ledger stores, checked without recursion.

A delivery (or an enqueue) nesting deeper than ``MAX_JSON_DEPTH`` is refused before anything
parses or serialises it: Python's JSON code recurses per level, and a body of a hundred
thousand brackets would otherwise end in a RecursionError (a 500, which Feishu redelivers for
hours) or in a stored payload that no page can show.
"""

from __future__ import annotations

import re
from typing import Any

#: The deepest JSON nesting a payload may have (Feishu's events nest about six levels). Deeper
#: bodies are refused before they are parsed, so parsing never recurses without bound.
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_A_BRACKET = bytes(set(range(256)) - set(b"[]{}"))
_OPENING = frozenset(b"[{")


def nests_deeper_than(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON text nests arrays/objects deeper than ``limit``, found without recursion:
    strings are dropped (their brackets are text), then the brackets are counted."""
    depth = 0
    for char in _JSON_STRING.sub(b'""', raw).translate(None, _NOT_A_BRACKET):
        if char in _OPENING:
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def object_deeper_than(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether decoded JSON (dicts and lists) nests deeper than ``limit``, walked with a stack:
    the same count as ``nests_deeper_than`` over its text."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in item)
    return False


#: What an operator sees instead of a delivery's Verification Token (``token`` at the top of a
#: v1 event, ``header.token`` of a v2 one): anyone who may view jobs could otherwise read the
#: app's secret off any job page.
REDACTED = "<redacted: the app's Verification Token>"
_TOKEN_FIELD = re.compile(r'("token"\s*:\s*)"(?:[^"\\]|\\.)*"')


#: The keys of an app's settings that hold a secret (``FEISHU_INBOX["APPS"][name]``), and
#: the shortest value treated as one (a shorter value would redact ordinary words).
SECRET_KEYS = ("ENCRYPT_KEY", "VERIFICATION_TOKEN", "APP_SECRET")
SHORTEST_SECRET = 8


def app_secrets() -> dict[str, str]:
    """Every configured app's secret values, each naming where it comes from."""
    from ..conf import checked_settings

    found: dict[str, str] = {}
    for name, app in checked_settings().APPS.items():
        for key in SECRET_KEYS:
            value = app.get(key)
            if isinstance(value, str) and len(value) >= SHORTEST_SECRET:
                found[value] = f"<redacted: the {key} of app {name}>"
    return found


def _scrub(text: str, secrets: dict[str, str]) -> str:
    for value, placeholder in secrets.items():
        if value in text:
            text = text.replace(value, placeholder)
    return text


def without_secrets(payload: Any) -> Any:
    """The payload to show an operator (a copy): its Verification Token replaced, and any
    app's secret (``SECRET_KEYS``) wherever a string holds it — a message that quotes one."""
    secrets = app_secrets()

    def shown(value: Any) -> Any:
        if isinstance(value, str):
            return _scrub(value, secrets) if secrets else value
        if isinstance(value, dict):
            return {k: shown(v) for k, v in value.items()}
        if isinstance(value, list):
            return [shown(v) for v in value]
        return value

    if not isinstance(payload, dict):
        return shown(payload)
    copy = dict(payload)
    if isinstance(copy.get("token"), str):
        copy["token"] = REDACTED
    header = copy.get("header")
    if isinstance(header, dict) and isinstance(header.get("token"), str):
        copy["header"] = {**header, "token": REDACTED}
    return shown(copy)


def text_without_secrets(raw: str) -> str:
    """The same for a payload's text that is not parsed (too deep to indent): every
    ``"token": "…"`` field's value replaced, and every app's secret."""
    return _scrub(_TOKEN_FIELD.sub(lambda m: m.group(1) + f'"{REDACTED}"', raw), app_secrets())
