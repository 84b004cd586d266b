"""The backfills' and exports' refusals: each a code of ``errors.CATALOGUE`` with its fix."""

from __future__ import annotations

from django.core.management.base import CommandError

from ..errors import CATALOGUE, LedgerError

#: The codes of this capability, added to ``errors.CATALOGUE`` (which is at its module's
#: line limit) when the package is imported; docs/operating.md lists them with the others.
CODES: dict[str, tuple[str, str]] = {
    "backfill_pending": (
        "A migration needs a backfill that is not applied yet (RequireBackfill); the migration "
        "was not applied.",
        "Start it (`manage.py inbox backfills start NAME`), wait until `manage.py inbox "
        "backfills check` passes, then migrate again.",
    ),
    "backfill_running": (
        "The backfill is already running or paused; a second start was refused.",
        "Watch it (`inbox backfills status NAME`); resume a paused one, or cancel it first.",
    ),
    "backfill_applied": (
        "The backfill is already applied; it was not run again.",
        "Run it again on purpose with `inbox backfills start NAME --force` (every row again).",
    ),
    "backfill_stalled": (
        "The backfill is running but no batch committed within its stall window.",
        "Check that a worker runs (`inbox workers`) and what its batch function waits on; a "
        "killed worker's job is taken over when its lease expires.",
    ),
    "backfill_unknown": (
        "No backfill of this name is declared (or none was ever started).",
        "Check the name: `manage.py inbox backfills list` lists the declared backfills.",
    ),
    "backfill_migration_pending": (
        "The migration the backfill needs (its column) is not applied; it was not started.",
        "Apply that migration first (`manage.py migrate APP MIGRATION`), then start it.",
    ),
    "backfill_environment": (
        "The settings mark another environment (FEISHU_INBOX['ENVIRONMENT']) than the "
        "backfill is declared for, or than it was started in on this database.",
        "Run it with the settings of the environment the database belongs to.",
    ),
    "export_row_invalid": (
        "A row of an export cannot be written (a value CSV or JSON cannot hold); the message "
        "names its key.",
        "Fix the row, or export with on_invalid='skip' (skipped rows are counted, keys kept).",
    ),
    "export_part_too_large": (
        "A part of an export came out bigger than its limit (EXPORT_MAX_PART_BYTES); the "
        "export failed and no manifest was written.",
        "Export with fewer part_rows, or raise max_part_bytes.",
    ),
}
CATALOGUE.update(CODES)


class BackfillError(LedgerError):
    """A backfill operation was refused; nothing changed."""

    code = "backfill_unknown"


class BackfillUnknown(BackfillError):
    code = "backfill_unknown"


class BackfillRunning(BackfillError):
    code = "backfill_running"


class BackfillApplied(BackfillError):
    code = "backfill_applied"


class BackfillStalled(BackfillError):
    code = "backfill_stalled"


class BackfillMigrationPending(BackfillError):
    code = "backfill_migration_pending"


class BackfillEnvironment(BackfillError):
    code = "backfill_environment"


class BackfillPending(BackfillError, CommandError):
    """``migrate`` met a migration that needs a backfill not yet applied. A ``CommandError``
    too, so ``manage.py migrate`` prints it, code first, and exits 1 without a traceback."""

    code = "backfill_pending"

    def __str__(self) -> str:
        return self.described()


class ExportError(LedgerError):
    """An export was refused, or failed; its manifest was not written."""

    code = "export_row_invalid"
    #: An export job that meets it ends at once: running it again writes the same rows.
    final = True


class ExportRowInvalid(ExportError):
    code = "export_row_invalid"


class ExportPartTooLarge(ExportError):
    code = "export_part_too_large"


#: Every refusal class (a test checks each one's code is catalogued).
REFUSALS = (
    BackfillError,
    BackfillUnknown,
    BackfillRunning,
    BackfillApplied,
    BackfillStalled,
    BackfillMigrationPending,
    BackfillEnvironment,
    BackfillPending,
    ExportError,
    ExportRowInvalid,
    ExportPartTooLarge,
)
