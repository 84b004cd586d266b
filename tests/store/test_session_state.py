"""Nothing the ledger does outlives its transaction on the server session (docs/production.md,
"PostgreSQL topology"): behind PgBouncer in transaction mode the next transaction of the same
connection may run on another session. Read from the source, every SQL file and every
module, so a new session-scoped statement fails here, not in production; the behaviour itself
runs behind a real PgBouncer in ``make test-postgres-topologies``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.any_database

PACKAGE = Path(__file__).resolve().parents[2] / "feishu_inbox"

#: What would leave state on the session, anywhere: a session-level advisory lock, a
#: temporary table, a session setting by set_config(..., false).
SESSION_STATE = [
    re.compile(r"pg_(try_)?advisory_lock(_shared)?\s*\(", re.I),
    re.compile(r"\bcreate\s+(global\s+|local\s+)?temp(orary)?\s+table", re.I),
    re.compile(r"set_config\s*\([^)]*,\s*false\s*\)", re.I),
]
#: A statement of a SQL file that sets, resets or prepares for the session. Allowed: a
#: function's own clause (``CREATE FUNCTION ... SET x = y AS $$``, ``ALTER FUNCTION f(...)``
#: then ``SET``/``RESET`` on the next line: it lasts the call) and ``SET LOCAL``.
SESSION_STATEMENT = re.compile(r"^\s*(SET(?!\s+LOCAL\b)|RESET|DISCARD|PREPARE)\b", re.I)


def sources() -> list[Path]:
    return sorted(
        p for p in PACKAGE.rglob("*") if p.suffix in (".sql", ".py") and "migrations" not in p.parts
    )


def session_statements(path: Path) -> list[str]:
    found, previous = [], ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if SESSION_STATEMENT.match(line):
            of_a_function = "AS $$" in line or previous.lstrip().upper().startswith(
                "ALTER FUNCTION"
            )
            if not of_a_function:
                found.append(f"{path.name}: {line.strip()}")
        if line.strip():
            previous = line
    return found


def test_no_statement_of_the_ledger_leaves_state_on_the_session() -> None:
    found = []
    for path in sources():
        text = path.read_text(encoding="utf-8")
        for pattern in SESSION_STATE:
            found += [f"{path.name}: {m.group(0).strip()}" for m in pattern.finditer(text)]
        if path.suffix == ".sql":
            found += session_statements(path)
    assert found == []


def test_only_the_listener_listens() -> None:
    """LISTEN is session state by nature: one connection of its own per worker, never one
    of Django's (which a pooler shares), and only in the listener."""
    listening = [
        path.name
        for path in sources()
        if re.search(r"""execute\(\s*f?["']LISTEN\b""", path.read_text(encoding="utf-8"))
    ]
    assert listening == ["listener.py"]
