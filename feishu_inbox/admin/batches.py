"""The Workflows page of the admin (SPEC §9f): every batch — a batch with callbacks, a
parent's wait for its children, a chain — its state, how many of its members are pending, in
each state, and the jobs it enqueued when it fired; actions to cancel a workflow or retry its
failed members (``manage_workflow``). A job's own page shows its tree (``workflow_of``)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from ..ledger import trees as workflows
from ..ledger.operators import Outcome
from ..models import EventJob
from ..tables.batches import Batch
from .common import STATUS_COLOURS, ReadOnly

#: The most members, children or tree nodes a page lists (counts cover them all).
SHOWN = 100


def job_link(job_id: int, label: str = "") -> str:
    url = reverse("admin:feishu_inbox_eventjob_change", args=[job_id])
    return format_html('<a href="{}">#{}</a>{}', url, job_id, label)


def batch_link(batch_id: int) -> str:
    url = reverse("admin:feishu_inbox_batch_change", args=[batch_id])
    return format_html('<a href="{}">batch #{}</a>', url, batch_id)


def counts_html(counts: dict[str, int]) -> str:
    if not counts:
        return "-"
    return format_html_join(
        ", ",
        '<b style="color:{}">{}</b> {}',
        ((STATUS_COLOURS.get(s, "inherit"), n, s) for s, n in sorted(counts.items())),
    )


class BatchAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ["id", "kind", "state", "progress", "parent", "description", "created_at"]
    list_filter = ["kind", "state"]
    search_fields = ["description", "=id", "=parent_id"]
    ordering = ["-id"]
    list_per_page = 100
    actions = ["cancel_workflow", "retry_failed_members", "fire_broken_again"]
    readonly_fields = [
        "kind",
        "state",
        "mode",
        "progress",
        "parent",
        "member_states",
        "members",
        "callbacks_shown",
        "chain_shown",
        "fired",
        "error",
        "description",
        "created_at",
        "closed_at",
        "fired_at",
    ]
    fields = tuple(readonly_fields)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Whoever may view the ledger's jobs may see the workflows they make up."""
        return request.user.has_perm("feishu_inbox.view_eventjob") or super().has_view_permission(
            request, obj
        )

    def has_manage_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("feishu_inbox.manage_workflow")

    @admin.display(description="pending / members")
    def progress(self, obj: Batch) -> str:
        return f"{max(obj.pending, 0)} / {obj.total}"

    @admin.display(description="parent")
    def parent(self, obj: Batch) -> str:
        return job_link(obj.parent_id) if obj.parent_id else "-"

    @admin.display(description="members by state")
    def member_states(self, obj: Batch) -> str:
        return counts_html(workflows.member_counts(obj.pk))

    @admin.display(description=f"members (first {SHOWN})")
    def members(self, obj: Batch) -> str:
        jobs = EventJob.objects.filter(batch_id=obj.pk).order_by("id")[:SHOWN]
        return (
            format_html_join(
                ", ",
                '{} <span style="color:{}">{}</span>',
                ((job_link(j.pk), STATUS_COLOURS.get(j.status, "inherit"), j.status) for j in jobs),
            )
            or "-"
        )

    @admin.display(description="callbacks")
    def callbacks_shown(self, obj: Batch) -> str:
        if not obj.callbacks:
            return "-"
        return ", ".join(f"on {name}: {spec['target']}" for name, spec in obj.callbacks.items())

    @admin.display(description="chain")
    def chain_shown(self, obj: Batch) -> str:
        if obj.kind != "chain":
            return "-"
        later = ", ".join(link["target"] for link in obj.links) or "none"
        return f"link {obj.position + 1} of {obj.length}; links still to enqueue: {later}"

    @admin.display(description="jobs it enqueued")
    def fired(self, obj: Batch) -> str:
        return format_html_join(", ", "{}", ((job_link(j),) for j in obj.fired_jobs)) or "-"

    @admin.action(
        description="Cancel the workflow: its unfinished members (and their children)",
        permissions=["manage"],
    )
    def cancel_workflow(self, request: HttpRequest, queryset: QuerySet[Batch]) -> None:
        batches = list(queryset)
        self._report(request, batches, "cancelled", workflows.cancel_batches(b.pk for b in batches))

    @admin.action(description="Retry the failed members (requeue them)", permissions=["manage"])
    def retry_failed_members(self, request: HttpRequest, queryset: QuerySet[Batch]) -> None:
        batches = list(queryset)
        self._report(request, batches, "requeued", workflows.retry_failed(b.pk for b in batches))

    @admin.action(
        description="Fire broken batches again (once what broke them is fixed)",
        permissions=["manage"],
    )
    def fire_broken_again(self, request: HttpRequest, queryset: QuerySet[Batch]) -> None:
        batches = list(queryset)
        again = workflows.fire_again(b.pk for b in batches)
        LogEntry.objects.log_actions(
            request.user.pk,  # type: ignore[arg-type]
            batches,
            CHANGE,
            change_message=f"fired {again} broken batches again",
        )
        level = messages.SUCCESS if again else messages.WARNING
        self.message_user(request, f"{again} broken batches will fire again.", level)

    def _report(
        self, request: HttpRequest, batches: list[Batch], doing: str, outcome: Outcome
    ) -> None:
        moved = len(outcome.done) + len(outcome.pending)
        LogEntry.objects.log_actions(
            request.user.pk,  # type: ignore[arg-type]
            batches,
            CHANGE,
            change_message=f"{doing} {moved} members",
        )
        asked = f" ({len(outcome.pending)} running: asked to stop)" if outcome.pending else ""
        level = messages.SUCCESS if moved else messages.WARNING
        self.message_user(request, f"{moved} members {doing}{asked}.", level)
        for job_id, error in outcome.refused.items():
            self.message_user(request, f"#{job_id}: {error.described()}", messages.ERROR)


def workflow_of(obj: EventJob) -> str:
    """A job's place in a workflow: its parent, the batch it counts in, its descendants (up to
    ``SHOWN``, as a tree) with counts per state, and the batches it made."""
    parts = []
    if obj.parent_id:
        parts.append(format_html("<p>Child of {}</p>", job_link(obj.parent_id)))
    if obj.batch_id:
        parts.append(format_html("<p>Counts in {}</p>", batch_link(obj.batch_id)))
    tree = workflows.tree_jobs(obj.pk, limit=SHOWN + 1)[1:]
    if tree:
        depth = {obj.pk: 0}
        rows = []
        for job in tree[:SHOWN]:
            depth[job["id"]] = depth.get(job["parent_id"], 0) + 1
            colour = STATUS_COLOURS.get(job["status"], "inherit")
            rows.append(
                (
                    "&nbsp;&nbsp;" * (depth[job["id"]] - 1),
                    job_link(job["id"]),
                    job["event_type"],
                    colour,
                    job["status"],
                    job["error_type"],
                )
            )
        counts = workflows.descendant_counts(obj.pk)
        parts.append(
            format_html(
                "<p>Descendants by state: {}</p><ul>{}</ul>",
                counts_html(counts),
                format_html_join(
                    "",
                    '<li>{}{} {} <b style="color:{}">{}</b> {}</li>',
                    ((mark_safe(r[0]), *r[1:]) for r in rows),  # noqa: S308  (&nbsp;s only)
                ),
            )
        )
    made = workflows.batches_of([obj.pk])
    if made:
        parts.append(
            format_html(
                "<p>Batches: {}</p>",
                format_html_join(
                    ", ", "{} ({}, {})", ((batch_link(b.pk), b.kind, b.state) for b in made)
                ),
            )
        )
    return format_html_join("", "{}", ((p,) for p in parts)) or "-"
