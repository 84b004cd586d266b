"""Named, described SQL queries read from ``.sql`` files (procrastinate's ``queries.sql`` format).

A file is a sequence of blocks::

    -- claim_jobs --
    -- One line or more saying what the query does (and, on SQLite, why it differs).
    UPDATE {job} SET ... WHERE id = %(job_id)s

The header names the query; the comment lines right under it describe it; the rest, up to the
next header, is the query. ``{name}`` placeholders are filled from ``schema.SQL_NAMES`` when the
file is loaded; parameters are named (``%(job_id)s``) and bound by the database driver.
Whole-line comments inside a query are for readers and are not sent to the database.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

from .schema import SQL_NAMES

_HEADER = re.compile(r"^-- ([a-z0-9_]+) --$", re.MULTILINE)
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


@dataclass(frozen=True)
class Query:
    name: str
    description: str
    sql: str


class QueryFileError(ValueError):
    """A ``.sql`` file of the store is malformed (a bug in this package, found at import)."""


def render(text: str, names: Mapping[str, str] = SQL_NAMES, *, source: str = "") -> str:
    """Fill ``{name}`` placeholders; an unknown name is an error."""

    def fill(match: re.Match[str]) -> str:
        try:
            return names[match.group(1)]
        except KeyError:
            raise QueryFileError(
                f"{source}: unknown placeholder {{{match.group(1)}}}; known: {sorted(names)}"
            ) from None

    return _PLACEHOLDER.sub(fill, text)


def parse_query_file(
    text: str, *, source: str = "", names: Mapping[str, str] = SQL_NAMES
) -> dict[str, Query]:
    parts = _HEADER.split(text)
    queries: dict[str, Query] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = body.strip("\n").splitlines()
        described = 0
        while described < len(lines) and lines[described].startswith("--"):
            described += 1
        description = " ".join(line[2:].strip() for line in lines[:described]).strip()
        code = "\n".join(
            line for line in lines[described:] if not line.lstrip().startswith("--")
        ).strip()
        if name in queries:
            raise QueryFileError(f"{source}: query {name!r} is defined twice")
        if not description or not code:
            raise QueryFileError(f"{source}: query {name!r} needs a description and a body")
        queries[name] = Query(name, description, render(code, names, source=f"{source}:{name}"))
    return queries


@cache
def load(filename: str, names: tuple[tuple[str, str], ...] = ()) -> dict[str, Query]:
    """The queries one database runs: ``common.sql`` and its own file (``postgres.sql``,
    ``sqlite.sql``), rendered with ``SQL_NAMES`` and the database's own ``names``.

    A name defined in both files is an error: each query has exactly one text per database.
    """
    all_names = {**SQL_NAMES, **dict(names)}
    queries: dict[str, Query] = {}
    for source in ("common.sql", filename):
        text = resources.files(__package__).joinpath(source).read_text(encoding="utf-8")
        parsed = parse_query_file(text, source=source, names=all_names)
        if clash := sorted(set(queries) & set(parsed)):
            raise QueryFileError(f"{source} defines {clash} again (already in common.sql)")
        queries.update(parsed)
    return queries


def function_file(filename: str) -> str:
    """A versioned stored-function file (``functions/…``), rendered, for a migration."""
    path = resources.files(__package__).joinpath("functions", filename)
    return render(path.read_text(encoding="utf-8"), source=filename)


def current_functions() -> str:
    """``functions.sql``, rendered: the current definition of every stored function and row
    trigger (PostgreSQL), as the newest versioned file of each left it.

    Migrations never load it (they load the versioned files, ``function_file``);
    tests/store/test_functions.py proves it equals what they leave in a migrated database.
    """
    path = resources.files(__package__).joinpath("functions.sql")
    return render(path.read_text(encoding="utf-8"), source="functions.sql")
