"""The operator's ledger in Django admin: read-only rows, guarded actions, a live dashboard.

Rows are never edited or deleted here; operators act only through actions, each backed by a
custom permission, each calling ``ledger`` and reporting every refused job with its reason.
Reconcile and discard assert something about the outside world, so they go through a
confirmation page (Django's two-step ``delete_selected`` pattern).

One module per page: ``jobs`` (the ledger's list, a job's page, the dashboard), ``schedules``,
``pauses`` (what is paused), ``workers`` (every worker's heartbeat row), ``batches`` (the
workflows: batches, parents' waits for children, chains) and ``webhooks`` (outbound webhook
endpoints, messages and their attempts), ``backfills`` (backfills' progress and actions,
exports with their download links), ``tenants`` (the tenants' weights in the fair claim,
the one page whose rows are edited); ``actions`` (the
operator actions on jobs), ``filters``, ``dashboard`` (its figures) and ``common`` (what the
pages share) serve them. Registered here.
"""

from __future__ import annotations

from django.contrib import admin

from ..models import EventJob, Pause, Schedule, WorkerBeat
from ..tables.backfills import Backfill, Export
from ..tables.batches import Batch
from ..tables.tenants import TenantWeight
from ..tables.webhooks import WebhookEndpoint, WebhookMessage
from .backfills import BackfillAdmin, ExportAdmin
from .batches import BatchAdmin
from .jobs import EventJobAdmin
from .pauses import PauseAdmin
from .schedules import ScheduleAdmin
from .tenants import TenantWeightAdmin
from .webhooks import WebhookEndpointAdmin, WebhookMessageAdmin
from .workers import WorkerBeatAdmin

admin.site.register(EventJob, EventJobAdmin)
admin.site.register(Schedule, ScheduleAdmin)
admin.site.register(Pause, PauseAdmin)
admin.site.register(WorkerBeat, WorkerBeatAdmin)
admin.site.register(Batch, BatchAdmin)
admin.site.register(WebhookEndpoint, WebhookEndpointAdmin)
admin.site.register(WebhookMessage, WebhookMessageAdmin)
admin.site.register(Backfill, BackfillAdmin)
admin.site.register(Export, ExportAdmin)
admin.site.register(TenantWeight, TenantWeightAdmin)

__all__ = [
    "BackfillAdmin",
    "BatchAdmin",
    "EventJobAdmin",
    "ExportAdmin",
    "PauseAdmin",
    "ScheduleAdmin",
    "WebhookEndpointAdmin",
    "WebhookMessageAdmin",
    "WorkerBeatAdmin",
]
