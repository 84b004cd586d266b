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

It passes when the backfill's row says ``applied``, or when the backfill is declared and its
queryset has no row at all (a new database: nothing to fill). Otherwise it raises
``BackfillPending`` (``backfill_pending``), which ``migrate`` prints with its fix and exits 1;
the migration, and any after it, is not applied (on PostgreSQL its transaction rolls back).
Unapplying the migration does nothing.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, transaction
from django.db.migrations.operations.base import Operation

from .refusals import BackfillPending

TABLE = "feishu_inbox_backfill"


class RequireBackfill(Operation):
    reduces_to_sql = False
    reversible = True

    def __init__(self, name: str) -> None:
        self.name = name

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return ("feishu_inbox.backfills.RequireBackfill", [self.name], {})

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        alias = schema_editor.connection.alias
        found = state_of(self.name, alias)
        if found == "applied" or (found is None and nothing_to_fill(self.name, alias)):
            return
        state = f"it is {found}" if found else "it was never started"
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


def state_of(name: str, alias: str) -> str | None:
    """The backfill's state in the ledger (None: never started, or no ledger table yet)."""
    from ..tables.backfills import Backfill

    try:
        with transaction.atomic(using=alias):  # a savepoint: a missing table aborts nothing
            rows = Backfill.objects.using(alias).filter(name=name)
            return rows.values_list("state", flat=True).first()
    except DatabaseError:  # feishu_inbox's migrations not applied yet: no backfill ran
        return None


def nothing_to_fill(name: str, alias: str) -> bool:
    """A declared backfill whose queryset has no row (a fresh database)."""
    from .declared import get

    spec = get(name)
    if spec is None:
        return False
    try:
        with transaction.atomic(using=alias):
            return not spec.queryset().using(alias).exists()
    except DatabaseError:
        return False
