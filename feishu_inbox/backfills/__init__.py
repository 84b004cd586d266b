"""Backfills and exports (SPEC §9i): long data work as resumable, throttled, visible jobs,
gated into deploys.

    @feishu_inbox.backfill("orders.fill_currency", Order.objects.all(), rows_per_second=5000,
                           after="orders.0041_order_currency",
                           before="orders.0042_currency_not_null")
    def fill_currency(batch):
        batch.filter(currency=None).update(currency="CNY")

    backfills.start("orders.fill_currency")    # or: manage.py inbox backfills start …
    feishu_inbox.export("orders-2026", Order.objects.filter(...), columns=["id", "total"])

The modules:

- ``declared``: ``backfill`` (the decorator), the declarations and their registry (a leaf);
- ``control``: start, pause, resume, cancel, progress, stalls, and what the deploy gate
  waits for (``pending``);
- ``running``: a backfill's run as a job kind: keyset batches, each with the cursor in one
  transaction, paced by the shared rate buckets;
- ``gate``: ``RequireBackfill``, the migration operation that refuses until it is applied;
- ``exports``: ``export`` and its job kind: parts under names fixed in advance, manifest last;
- ``parts``: encoding rows, saving parts and the manifest to a storage, download links;
- ``refusals``: the typed errors, each with its code and fix.

The tables are ``feishu_inbox.tables.backfills``; docs/backfills.md and docs/exports.md are the
manual. Importing this package touches no model (declarations are made at import time).
"""

from __future__ import annotations

from typing import Any

from .declared import BackfillSpec, backfill, declared, get, register, unregister
from .gate import RequireBackfill
from .refusals import (
    BackfillApplied,
    BackfillEnvironment,
    BackfillError,
    BackfillMigrationPending,
    BackfillPending,
    BackfillRunning,
    BackfillStalled,
    BackfillUnknown,
    ExportError,
    ExportPartTooLarge,
    ExportRowInvalid,
)

#: What ``control`` offers, imported when first used (it reads the tables).
_CONTROL = ("start", "pause", "resume", "cancel", "status", "every", "pending", "progress")


def export(name: str, queryset: Any, **options: Any) -> Any:
    """Enqueue an export (``exports.export``: its arguments and what it promises)."""
    from .exports import export as enqueue_export

    return enqueue_export(name, queryset, **options)


def __getattr__(name: str) -> Any:
    if name in _CONTROL:
        from . import control

        return getattr(control, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BackfillApplied",
    "BackfillEnvironment",
    "BackfillError",
    "BackfillMigrationPending",
    "BackfillPending",
    "BackfillRunning",
    "BackfillSpec",
    "BackfillStalled",
    "BackfillUnknown",
    "ExportError",
    "ExportPartTooLarge",
    "ExportRowInvalid",
    "RequireBackfill",
    "backfill",
    "cancel",
    "declared",
    "every",
    "export",
    "get",
    "pause",
    "pending",
    "progress",
    "register",
    "resume",
    "start",
    "status",
    "unregister",
]
