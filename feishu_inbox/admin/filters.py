"""The filters of the ledger's list.

django.tasks tasks and schedule occurrences are jobs beside the Feishu events (SPEC §8, §9),
with the same actions: the kind and queue filters tell them apart. Both read indexes: the
event type and the partition key start with the kind's prefixes (``ledger.kinds``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from ..conf import inbox_settings
from ..ledger.kinds import choices, in_queue, of_kind
from ..models import BLOCKING, EventJob
from ..runtime import registry
from ..tasks import configured_queues


class KindFilter(admin.SimpleListFilter):
    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(choices().items())

    def queryset(self, request: HttpRequest, queryset: QuerySet[EventJob]) -> QuerySet[EventJob]:
        value = self.value()
        return of_kind(queryset, value) if value is not None and value in choices() else queryset


class QueueFilter(admin.SimpleListFilter):
    title = "task queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(q, q) for q in configured_queues()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[EventJob]) -> QuerySet[EventJob]:
        value = self.value()
        return in_queue(queryset, value) if value else queryset


class BlocksPartitionFilter(admin.SimpleListFilter):
    title = "blocks its partition"
    parameter_name = "blocking"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Yes: failed or unknown"), ("no", "No")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[EventJob]) -> QuerySet[EventJob]:
        if self.value() == "yes":
            return queryset.filter(status__in=BLOCKING)
        if self.value() == "no":
            return queryset.exclude(status__in=BLOCKING)
        return queryset


class EventTypeFilter(admin.SimpleListFilter):
    """Types with a handler, plus those among unresolved jobs (no DISTINCT over the ledger)."""

    title = "event type"
    parameter_name = "event_type"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        types = set(registry.registered())
        types.update(
            EventJob.objects.unresolved()
            .order_by()  # the model's ordering would join the DISTINCT
            .values_list("event_type", flat=True)
            .distinct()[:100]
        )
        return [(t, t) for t in sorted(types)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[EventJob]) -> QuerySet[EventJob]:
        return queryset.filter(event_type=self.value()) if self.value() else queryset


class TenantFilter(admin.SimpleListFilter):
    """Jobs of one tenant (SPEC §9j). The choices are the tenants most frequent among the
    newest unresolved jobs (a bounded read, no count of the ledger); any other is reached by
    its key in the URL (``?tenant=<key>``; ``-``: jobs of no tenant)."""

    title = "tenant"
    parameter_name = "tenant"
    CHOICES, SAMPLE = 20, 1000

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        newest = (
            EventJob.objects.unresolved()
            .exclude(tenant="")
            .order_by("-id")
            .values_list("tenant", flat=True)[: self.SAMPLE]
        )
        named = [(k, k) for k, _ in Counter(newest).most_common(self.CHOICES)]
        current = self.value()
        if current and current not in dict(named):
            named.append((current, current))
        return [*named, ("-", "no tenant")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[EventJob]) -> QuerySet[EventJob]:
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(tenant="" if value == "-" else value)


class EndedAsFilter(admin.SimpleListFilter):
    """Jobs that ended without running their handler to its end, by why (their error type):
    a conversation turn's endings (SPEC §9g) and an operator's or a newer message's stop.
    Read through the partial index on error types (only jobs that have one are in it)."""

    title = "ended as"
    parameter_name = "ended_as"
    ENDINGS = (
        ("Stale", "Stale: past its stale_after (skipped or noticed)"),
        ("Recalled", "Recalled: every message recalled"),
        ("Stopped", "Stopped: by a stop command or button"),
        ("StopCommand", "StopCommand: the command itself"),
        ("Coalesced", "Coalesced: taken into another job's turn"),
        ("Superseded", "Superseded: by a newer message"),
        ("Cancelled", "Cancelled: by an operator"),
    )

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(self.ENDINGS)

    def queryset(self, request: HttpRequest, queryset: QuerySet[EventJob]) -> QuerySet[EventJob]:
        value = self.value()
        if value not in dict(self.ENDINGS):
            return queryset
        return queryset.filter(error_type=value)


class AppFilter(admin.SimpleListFilter):
    title = "Feishu app"
    parameter_name = "app"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in sorted(inbox_settings().APPS)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[EventJob]) -> QuerySet[EventJob]:
        return queryset.filter(app=self.value()) if self.value() else queryset
