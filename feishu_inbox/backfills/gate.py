"""The deploy gate inside ``migrate``: a migration operation that refuses to apply until a
backfill is applied.

    class Migration(migrations.Migration):
        dependencies = [
            ("orders", "0041_order_currency"),
            ("feishu_inbox", "0038_backfills"),
        ]
        operations = [
            RequireBackfill("orders.fill_currency"),  # first: before any schema change
            migrations.AlterField("order", "currency", models.CharField(max_length=3)),
        ]

It passes when the backfill's row in the ledger says ``applied``; or when the backfill never
started and its table has nothing to fill (a new database); or when the site's router does not
migrate the app (or its model) on the database being migrated, where the migration changes
nothing. Otherwise it raises ``BackfillPending`` (``backfill_pending``), which ``migrate``
prints with its fix and exits 1; the migration, and any after it, is not applied (on
PostgreSQL its transaction rolls back). Unapplying the migration does nothing.

``holds`` is the one rule, for ``migrate`` and for ``inbox backfills check``, which asks it of
each migration ``migrate`` would apply now. The backfill's state is read where the ledger
keeps it (the router's database for its writes), whichever database is migrated; its table
is the model as the migration's state has it (a later migration may rename it or add a column
the declared queryset filters on, and the current class would then not match the database).
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, connections, router, transaction
from django.db.migrations.operations.base import Operation

from .refusals import BackfillPending

TABLE = "feishu_inbox_backfill"
#: What ``holds`` says of a backfill that never started (no row in the ledger).
NEVER_STARTED = "never started"


class RequireBackfill(Operation):
    reduces_to_sql = False
    reversible = True

    def __init__(self, name: str, hints: dict[str, Any] | None = None) -> None:
        self.name = name
        #: Passed to the site's router's ``allow_migrate`` (as ``RunPython``'s are).
        self.hints = hints or {}

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs = {"hints": self.hints} if self.hints else {}
        return ("feishu_inbox.backfills.RequireBackfill", [self.name], kwargs)

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        alias = schema_editor.connection.alias
        held = holds(self.name, app_label, alias, from_state.apps, self.hints)
        if held is None:
            return
        state = "it was never started" if held == NEVER_STARTED else f"it is {held}"
        raise BackfillPending(
            f"Migration {app_label} needs backfill {self.name!r} applied first; {state}.",
            fix=f"Start it (`manage.py inbox backfills start {self.name}`), wait until "
            "`manage.py inbox backfills check` passes, then migrate again.",
        )

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        pass

    def describe(self) -> str:
        return f"Require backfill {self.name} to be applied"

    @property
    def migration_name_fragment(self) -> str:
        return f"require_{self.name.replace('.', '_')}"


def holds(
    name: str, app_label: str, alias: str, apps: Any, hints: dict[str, Any] | None = None
) -> str | None:
    """Whether backfill ``name`` holds back a migration of ``app_label`` on database
    ``alias``, whose state before it is ``apps``: None when the migration may apply, else
    the backfill's state (``NEVER_STARTED`` when it has no row)."""
    from .declared import get

    spec = get(name)
    model = state_model(spec, apps)
    hints = dict(hints or {})
    if model is not None and model._meta.app_label == app_label:  # as Django's own ops ask
        hints.setdefault("model_name", model._meta.model_name)
        hints.setdefault("model", model)
    if not router.allow_migrate(alias, app_label, **hints):
        return None  # the site's router keeps this app (or model) off this database
    found = state_of(name)
    if found == "applied":
        return None
    if found is None and spec is not None and nothing_to_fill(spec, model, alias):
        return None
    return found or NEVER_STARTED


def state_model(spec: Any, apps: Any) -> Any:
    """The declared backfill's model as a migration's state has it (None: not declared, or
    not in that state)."""
    if spec is None:
        return None
    meta = spec.queryset().model._meta
    try:
        return apps.get_model(meta.app_label, meta.model_name)
    except LookupError:
        return None


def state_of(name: str) -> str | None:
    """The backfill's state in the ledger (None: never started, or no ledger table yet)."""
    from ..tables.backfills import Backfill

    alias = router.db_for_write(Backfill)
    try:
        with transaction.atomic(using=alias):  # a savepoint: a missing table aborts nothing
            rows = Backfill.objects.using(alias).filter(name=name)
            return rows.values_list("state", flat=True).first()
    except DatabaseError:  # feishu_inbox's migrations not applied yet: no backfill ran
        return None


def nothing_to_fill(spec: Any, model: Any, alias: str) -> bool:
    """Whether the declared backfill has no row to fill on ``alias``: its table (``model``,
    as the migration's state has it) is not there or is empty, or its queryset as declared
    finds no row (the current class: a database error, as when it names a column a later
    migration adds, says nothing)."""
    if model is not None:
        connection = connections[alias]
        if model._meta.db_table not in connection.introspection.table_names():
            return True
        if _no_row(model._base_manager.using(alias), alias):
            return True
    return _no_row(spec.queryset().using(alias), alias)


def _no_row(queryset: Any, alias: str) -> bool:
    try:
        with transaction.atomic(using=alias):  # a savepoint, inside migrate's transaction
            return not queryset.exists()
    except DatabaseError:
        return False
