"""A migration operation that loads a versioned stored-function file (PostgreSQL only).

Modelled on procrastinate's ``RunProcrastinateSQL``: the SQL lives in
``store/functions/<migration>.sql`` (and ``.down.sql`` to undo it), with the table names and
statuses of ``schema.SQL_NAMES``. SQLite has no stored functions; there the operation does
nothing and the SQLite store runs the same steps statement by statement.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from .queries import function_file


class RunPostgresFunctions(migrations.RunSQL):
    """``reverse_filename``: one file or several, run in order, that restore what the
    previous migrations had."""

    def __init__(self, filename: str, *, reverse_filename: str | tuple[str, ...]) -> None:
        self.filename = filename
        self.reverse_filename = reverse_filename
        reverse = (reverse_filename,) if isinstance(reverse_filename, str) else reverse_filename
        super().__init__(
            sql=function_file(filename),
            reverse_sql="\n".join(function_file(name) for name in reverse),
        )

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (
            self.__class__.__qualname__,
            [self.filename],
            {"reverse_filename": self.reverse_filename},
        )

    def database_forwards(self, app_label: str, schema_editor: Any, *args: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, *args)

    def database_backwards(self, app_label: str, schema_editor: Any, *args: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, *args)

    def describe(self) -> str:
        return f"Load PostgreSQL functions from {self.filename}"


class OffPostgres:
    """A schema operation run everywhere but PostgreSQL, where the row trigger of migration
    0014 holds the job's CHECK constraints (a function file changes it there)."""

    def database_forwards(self, app_label: str, schema_editor: Any, *args: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            super().database_forwards(app_label, schema_editor, *args)  # type: ignore[misc]

    def database_backwards(self, app_label: str, schema_editor: Any, *args: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            super().database_backwards(app_label, schema_editor, *args)  # type: ignore[misc]


class RemoveConstraintOffPostgres(OffPostgres, migrations.RemoveConstraint):
    pass


class AddConstraintOffPostgres(OffPostgres, migrations.AddConstraint):
    pass


class RunSQLiteSQL(migrations.RunSQL):
    """SQL for SQLite only (rendered with ``schema.SQL_NAMES``), each statement whole: a
    trigger's body keeps its semicolons. PostgreSQL gets the same from a function file."""

    def __init__(self, sql: list[str], *, reverse_sql: list[str]) -> None:
        from .queries import render

        self.raw_sql, self.raw_reverse = sql, reverse_sql
        super().__init__(sql=[render(s) for s in sql], reverse_sql=[render(s) for s in reverse_sql])

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (self.__class__.__qualname__, [self.raw_sql], {"reverse_sql": self.raw_reverse})

    def database_forwards(self, app_label: str, schema_editor: Any, *args: Any) -> None:
        if schema_editor.connection.vendor == "sqlite":
            super().database_forwards(app_label, schema_editor, *args)

    def database_backwards(self, app_label: str, schema_editor: Any, *args: Any) -> None:
        if schema_editor.connection.vendor == "sqlite":
            super().database_backwards(app_label, schema_editor, *args)
