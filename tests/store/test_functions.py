"""``store/functions.sql`` holds the current definition of every stored function and row
trigger, and a freshly migrated database holds exactly those (PostgreSQL only).

The migrations load the versioned files (``store/functions/NNNN_*.sql``), never
``functions.sql``; this test is what keeps the two in step (as procrastinate's
``tests/migration`` keeps its ``schema.sql`` and its delta migrations). It reads each
``feishu_inbox…`` function of the test database (migrated at the session's start) and each
trigger on its tables, loads ``functions.sql`` into a scratch schema the same way a migration
runs SQL (``prepare_sql_script``, one statement at a time) and compares the two sides:
``pg_get_functiondef`` (signature, result, language, attributes, SET clauses and every
character of the body, comments included) and ``pg_get_triggerdef``. The scratch schema is made
inside a savepoint and rolled back: nothing is left behind.
"""

from __future__ import annotations

import difflib
import re

import pytest
from django.db import connection, transaction

from feishu_inbox.store import schema
from feishu_inbox.store.queries import current_functions

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("postgres_only")]

SCRATCH = "feishu_inbox_functions_sql"
#: The tables whose row types the functions return or whose rows the triggers check, copied
#: (columns only) into the scratch schema. The bodies are not checked when loaded
#: (check_function_bodies off), so the other tables they read need not be there.
TABLES = (
    schema.JOB_TABLE,
    schema.PARTITION_TABLE,
    schema.ATTEMPT_TABLE,
    schema.MAINTENANCE_TABLE,
    schema.STEP_TABLE,
    schema.SCHEDULE_TABLE,
)

_FUNCTIONS = (
    "SELECT p.proname || '(' || oidvectortypes(p.proargtypes) || ')', pg_get_functiondef(p.oid) "
    "FROM pg_proc p WHERE p.pronamespace = %s::regnamespace "
    "AND starts_with(p.proname, 'feishu_inbox')"
)
_TRIGGERS = (
    "SELECT t.tgname || ' ON ' || c.relname, pg_get_triggerdef(t.oid, true) "
    "FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
    "WHERE c.relnamespace = %s::regnamespace AND NOT t.tgisinternal "
    "AND starts_with(c.relname, 'feishu_inbox')"
)
_CREATED = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(FUNCTION|TRIGGER)\s+([\w.\"]+)", re.I)
_DIFF_LINES = 40


def _definitions(namespace: str) -> dict[str, str]:
    """Every feishu_inbox function and trigger of ``namespace``, by signature, as PostgreSQL
    prints it. Read with ``namespace`` on the search path, so that its own tables' row types
    print unqualified on both sides; the function's own name, which PostgreSQL always
    qualifies, is printed without its schema."""
    qualified = re.compile(rf"^(CREATE OR REPLACE FUNCTION ){re.escape(namespace)}\.")
    found: dict[str, str] = {}
    with connection.cursor() as cur:
        cur.execute(_FUNCTIONS, [namespace])
        found |= {f"function {key}": qualified.sub(r"\1", text) for key, text in cur.fetchall()}
        cur.execute(_TRIGGERS, [namespace])
        found |= {f"trigger {key}": text for key, text in cur.fetchall()}
    return found


def _live_schema() -> str:
    with connection.cursor() as cur:
        cur.execute("SELECT current_schema()")
        return str(cur.fetchone()[0])


def _statements() -> list[str]:
    """``functions.sql``'s statements, split and stripped of comments as a migration does."""
    return connection.ops.prepare_sql_script(current_functions())


def _loaded(live: str) -> dict[str, str]:
    """``functions.sql`` loaded into a scratch schema (rolled back afterwards), as read back."""
    quote = connection.ops.quote_name
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"CREATE SCHEMA {quote(SCRATCH)}")
        cur.execute(f"SET LOCAL search_path TO {quote(SCRATCH)}")
        cur.execute("SET LOCAL check_function_bodies TO off")
        for table in TABLES:
            copy = f"CREATE TABLE {quote(SCRATCH)}.{quote(table)} (LIKE {live}.{quote(table)})"
            cur.execute(copy)
        for statement in _statements():
            cur.execute(statement)
        loaded = _definitions(SCRATCH)
        transaction.set_rollback(True)  # the savepoint's end also undoes the SET LOCALs
    return loaded


def _diff(key: str, migrated: str, in_file: str) -> str:
    lines = list(
        difflib.unified_diff(
            migrated.splitlines(),
            in_file.splitlines(),
            "migrated database",
            "store/functions.sql",
            lineterm="",
            n=2,
        )
    )
    if len(lines) > _DIFF_LINES:
        lines = [*lines[:_DIFF_LINES], f"... ({len(lines) - _DIFF_LINES} more diff lines)"]
    return f"{key} differs between the migrated database and functions.sql:\n" + "\n".join(lines)


def _kind_and_name(key: str) -> str:
    """``function feishu_inbox_claim(text, …)`` → ``function feishu_inbox_claim``."""
    return " ".join(re.split(r"[ (]", key)[:2])


def test_functions_sql_names_each_live_function_and_trigger_once() -> None:
    """The file's CREATE statements name each function and trigger the migrations leave, and
    each only once (a second definition would silently replace the first)."""
    created = [
        f"{kind.lower()} {name.lower()}"
        for statement in _statements()
        for kind, name in _CREATED.findall(statement)
    ]
    twice = sorted({entry for entry in created if created.count(entry) > 1})
    assert not twice, f"functions.sql defines these more than once: {twice}"
    migrated = {_kind_and_name(key) for key in _definitions(_live_schema())}
    assert set(created) == migrated, (
        "functions.sql and the migrated database name different functions or triggers: "
        f"only in the database {sorted(migrated - set(created))}, "
        f"only in functions.sql {sorted(set(created) - migrated)}"
    )


def test_functions_sql_equals_the_migrated_database() -> None:
    live = _live_schema()
    migrated = _definitions(live)
    assert any(key.startswith("function ") for key in migrated), "no function migrated?"
    in_file = _loaded(connection.ops.quote_name(live))
    problems = [
        f"{key} is in the migrated database but not in functions.sql: add its newest "
        "definition there."
        for key in sorted(migrated.keys() - in_file.keys())
    ]
    problems += [
        f"{key} is in functions.sql but no migration leaves it in the database: a new "
        "function needs a versioned file and a migration too; a dropped one goes from here."
        for key in sorted(in_file.keys() - migrated.keys())
    ]
    problems += [
        _diff(key, migrated[key], in_file[key])
        for key in sorted(migrated.keys() & in_file.keys())
        if migrated[key] != in_file[key]
    ]
    if problems:
        pytest.fail(
            "store/functions.sql must hold every live function exactly as the newest "
            "versioned file left it (edit it there AND add a new versioned file and "
            "migration):\n\n" + "\n\n".join(problems),
            pytrace=False,
        )
