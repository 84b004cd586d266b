"""Retention (SPEC §3): what the ledger forgets, and when.

Completed jobs (the dedupe window) are deleted after ``COMPLETED_RETENTION``; unknown jobs are
kept until reconciled, unless ``UNKNOWN_RETENTION`` is set: then an expired one is completed
(``UnknownExpired``, resolution ``expired``, who and why in its error message) and its
completed retention starts at the expiry, so its history stays.

Workers purge by themselves (``purge_if_due``): every ``PURGE_INTERVAL`` seconds one of them
wins the shared ``purge`` chore and runs the purge in small batches that never block claims or
ingest. ``manage.py inbox purge`` does the same from cron, for sites that prefer it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ..conf import checked_settings
from ..store import store
from .operators import EXPIRE_UNKNOWN

log = logging.getLogger("feishu_inbox.retention")

#: The name of the workers' shared purge chore (``Maintenance`` row).
PURGE_CHORE = "purge"


@dataclass(frozen=True)
class PurgeResult:
    completed_deleted: int
    unknown_expired: int
    #: Idle partition rows (one per chat) with no job left in the ledger.
    partitions_deleted: int = 0
    #: Signals kept for a waiter past SIGNAL_KEEP, which no job took (SPEC §9e).
    signals_deleted: int = 0
    #: Outbound webhook messages (and their attempts) past retention, none still pending.
    webhook_messages_deleted: int = 0
    #: Workflows' batches that fired more than the retention ago (SPEC §9f).
    batches_deleted: int = 0
    #: Exports finished more than EXPORT_RETENTION ago: their files, then their rows (§9i).
    exports_deleted: int = 0

    def __str__(self) -> str:
        return (
            f"deleted {self.completed_deleted} completed jobs past retention; "
            f"expired {self.unknown_expired} unknown jobs; "
            f"removed {self.partitions_deleted} idle chats with no job left; "
            f"dropped {self.signals_deleted} kept signals no job waited for; "
            f"deleted {self.webhook_messages_deleted} webhook messages past retention; "
            f"deleted {self.batches_deleted} fired batches past retention; "
            f"removed {self.exports_deleted} exports past retention"
        )


def purge(*, max_batches: int | None = None, by: str = "manage.py inbox purge") -> PurgeResult:
    """Expire old unknown jobs (when configured), then delete completed jobs past retention,
    one small transaction per batch (a waiting job is never completed: it stays), and the
    signals kept past their time. ``by`` is recorded on each expired job."""
    conf = checked_settings()
    expired_unknown = 0
    if conf.UNKNOWN_RETENTION is not None:
        old = store().unknown_past_retention(conf.UNKNOWN_RETENTION.total_seconds())
        why = (
            f"Unknown for longer than UNKNOWN_RETENTION ({conf.UNKNOWN_RETENTION}); "
            f"completed without a reconcile by the retention purge ({by})."
        )
        expired_unknown = len(EXPIRE_UNKNOWN.apply(old, message=why).done)
        if expired_unknown:
            log.warning("%s unknown jobs expired unreconciled (%s)", expired_unknown, by)
    batch = conf.PURGE_BATCH_SIZE
    retention = conf.COMPLETED_RETENTION.total_seconds()
    return PurgeResult(
        completed_deleted=_in_batches(
            lambda: store().purge_completed(retention, batch), batch, max_batches
        ),
        unknown_expired=expired_unknown,
        partitions_deleted=_in_batches(
            lambda: store().purge_idle_partitions(batch), batch, max_batches
        ),
        signals_deleted=store().purge_expired_signals(),
        webhook_messages_deleted=_in_batches(
            lambda: purge_webhook_messages(retention, batch), batch, max_batches
        ),
        batches_deleted=_in_batches(
            lambda: purge_fired_batches(retention, batch), batch, max_batches
        ),
        exports_deleted=_in_batches(
            lambda: purge_exports(conf.EXPORT_RETENTION.total_seconds(), batch),
            batch,
            max_batches,
        ),
    )


def purge_fired_batches(retention_seconds: float, batch: int) -> int:
    """One batch of workflows' batches that fired (or whose chain ended) more than
    ``retention_seconds`` ago: their members and callbacks are jobs of their own, purged by
    theirs. A batch not fired yet stays, and so do its completed members (SPEC §9f)."""
    from datetime import timedelta

    from django.utils import timezone

    from ..tables.batches import Batch, BatchState

    before = timezone.now() - timedelta(seconds=retention_seconds)
    old = list(
        Batch.objects.filter(state=BatchState.FIRED, fired_at__lt=before)
        .order_by("id")
        .values_list("id", flat=True)[:batch]
    )
    return Batch.objects.filter(id__in=old).delete()[0] if old else 0


def purge_exports(retention_seconds: float, batch: int) -> int:
    """One batch of exports finished more than ``retention_seconds`` ago: their files (parts,
    manifest, and what writes that never committed left in their folder) are deleted from
    their storage, then their rows. An export whose files
    cannot be deleted (its storage is away) is kept, and tried again next time."""
    from datetime import timedelta

    from django.db.models import Exists, OuterRef
    from django.utils import timezone

    from ..models import EventJob, Status
    from ..tables.backfills import Export, ExportState

    now = timezone.now()
    # An export whose job ended without ending it (an operator cancelled the job before it
    # ran, or its attempts ran out) would stay running for ever: it failed, and is purged in
    # its turn.
    ended = EventJob.objects.filter(
        pk=OuterRef("job_id"), status__in=[Status.COMPLETED, Status.FAILED]
    )
    Export.objects.filter(state=ExportState.RUNNING).filter(Exists(ended)).update(
        state=ExportState.FAILED,
        error="Its job ended before the export did (cancelled by an operator?).",
        finished_at=now,
    )
    before = now - timedelta(seconds=retention_seconds)
    removed = 0
    for export in Export.objects.filter(finished_at__lt=before).order_by("finished_at")[:batch]:
        try:
            storage = export.open_storage()
            for name in {*export.file_names(), *export.stored_files(storage)}:
                if storage.exists(name):
                    storage.delete(name)
        except Exception:
            log.exception("export %s: its files could not be deleted; it is kept", export.uid)
            continue
        Export.objects.filter(pk=export.pk).delete()
        removed += 1
    return removed


#: The ledger's app of outbound webhook deliveries (``webhooks/publishing.py``).
WEBHOOKS_APP = "webhooks"


def purge_webhook_messages(retention_seconds: float, batch: int) -> int:
    """One batch of outbound webhook messages published more than ``retention_seconds`` ago
    whose deliveries have all completed (their attempts go with them): a message a delivery
    still holds, or may still send (held, retrying), stays. Returns how many were deleted (a
    full batch: call again; a batch held back by pending ones ends this purge's round)."""
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from ..models import EventJob, Status
    from ..tables.webhooks import WebhookMessage

    before = timezone.now() - timedelta(seconds=retention_seconds)
    old = list(
        WebhookMessage.objects.filter(created_at__lt=before)
        .order_by("id")
        .values_list("id", "uid")[:batch]
    )
    if not old:
        return 0
    live = set(
        EventJob.objects.filter(app=WEBHOOKS_APP)
        .exclude(status=Status.COMPLETED)
        .values_list("payload__message", flat=True)
    )
    done = [pk for pk, uid in old if uid not in live]
    with transaction.atomic():
        WebhookMessage.objects.filter(pk__in=done).delete()
    return len(done)


def purge_if_due(worker_id: str) -> PurgeResult | None:
    """Run the purge if it is this worker's turn: at most once per ``PURGE_INTERVAL`` across
    all workers, one at a time. None when it is not due, or automatic purging is off."""
    interval = checked_settings().PURGE_INTERVAL
    if interval is None or not store().claim_chore(PURGE_CHORE, worker_id, interval):
        return None
    result = purge(by=f"worker {worker_id}")
    store().record_chore(PURGE_CHORE, f"{worker_id}: {result}")
    log.info("retention purge by worker %s: %s", worker_id, result)
    return result


def _in_batches(step: Callable[[], int], batch: int, max_batches: int | None) -> int:
    """Run ``step`` (one transaction each) until it handles less than a full batch."""
    total = batches = 0
    while max_batches is None or batches < max_batches:
        done = step()
        total += done
        batches += 1
        if done < batch:
            break
    return total
