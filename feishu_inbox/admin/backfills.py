"""The backfills' and exports' pages (SPEC §9i).

Backfills: each one's progress (rows done of the estimate, rate, ETA, stalled), and the
actions pause, resume, cancel and run again (a start of one never started, a forced start of
an applied one), behind the ``operate_backfill`` permission, each calling
``feishu_inbox.backfills`` and written to the admin history. Exports: their progress, parts
and, to users with the ``download_export`` permission, download links that expire
(EXPORT_LINK_SECONDS), signed, served by this page's own view.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.core import signing
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import ngettext

from ..backfills import control, parts
from ..conf import checked_settings
from ..errors import InboxError
from ..tables.backfills import Backfill, Export
from .common import log_change

#: The request whose export page is being rendered (a file's links depend on who looks).
_viewer = threading.local()
DOWNLOAD = "feishu_inbox.download_export"
#: What the actions' messages say was done.
PAST = {"pause": "paused", "resume": "resumed", "cancel": "cancelled", "run": "run again"}
OPERATE = "feishu_inbox.operate_backfill"


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class BackfillAdmin(ReadOnly):
    list_display = ["name", "state_shown", "done", "rate_shown", "eta", "last_batch_at", "run"]
    list_filter = ["state"]
    search_fields = ["name"]
    readonly_fields = [
        "name",
        "state_shown",
        "done",
        "rate_shown",
        "eta",
        "run",
        "cursor",
        "batches",
        "environment",
        "forced",
        "job_id",
        "error",
        "started_at",
        "resumed_at",
        "last_batch_at",
        "finished_at",
        "stall_seconds",
    ]
    fields = tuple(readonly_fields)
    actions = ["pause_selected", "resume_selected", "cancel_selected", "run_again_selected"]

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(OPERATE)

    @admin.display(description="state")
    def state_shown(self, obj: Backfill) -> str:
        return obj.state + (" — STALLED" if control.is_stalled(obj) else "")

    @admin.display(description="rows done")
    def done(self, obj: Backfill) -> str:
        total = control.progress(obj).total_estimate
        return f"{obj.rows_done:,} of {'?' if total is None else f'~{total:,}'}"

    @admin.display(description="rate")
    def rate_shown(self, obj: Backfill) -> str:
        return f"{obj.rate:,.0f} rows/s" if obj.rate else "-"

    @admin.display(description="ETA")
    def eta(self, obj: Backfill) -> str:
        eta = control.progress(obj).eta_seconds
        return "-" if eta is None else f"{eta:,.0f} s"

    def _act(
        self,
        request: HttpRequest,
        queryset: QuerySet[Backfill],
        verb: str,
        do: Callable[[str], Any],
    ) -> None:
        done = 0
        for row in queryset:
            try:
                do(row.name)
            except InboxError as exc:
                self.message_user(request, f"{row.name}: {exc.described()}", messages.ERROR)
                continue
            done += 1
            log_change(request, row, f"{verb.capitalize()} backfill {row.name}")
        self.message_user(
            request,
            ngettext("%(n)d backfill %(verb)s.", "%(n)d backfills %(verb)s.", done)
            % {"n": done, "verb": PAST.get(verb, f"{verb}d")},
            messages.SUCCESS if done else messages.WARNING,
        )

    @admin.action(description="Pause (stops before the next batch)", permissions=["operate"])
    def pause_selected(self, request: HttpRequest, queryset: QuerySet[Backfill]) -> None:
        self._act(request, queryset, "pause", control.pause)

    @admin.action(description="Resume from the cursor", permissions=["operate"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Backfill]) -> None:
        self._act(request, queryset, "resume", control.resume)

    @admin.action(description="Cancel", permissions=["operate"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Backfill]) -> None:
        self._act(request, queryset, "cancel", control.cancel)

    @admin.action(description="Run again from the first row", permissions=["operate"])
    def run_again_selected(self, request: HttpRequest, queryset: QuerySet[Backfill]) -> None:
        self._act(request, queryset, "run", lambda name: control.start(name, force=True))


class ExportAdmin(ReadOnly):
    list_display = ["uid", "name", "state", "progress", "part_count", "created_at", "finished_at"]
    list_filter = ["state", "format"]
    search_fields = ["uid", "name"]
    readonly_fields = [
        "uid",
        "name",
        "state",
        "progress",
        "format",
        "columns",
        "prefix",
        "part_rows",
        "skipped",
        "skipped_keys",
        "error",
        "created_at",
        "finished_at",
        "files",
    ]
    fields = tuple(readonly_fields)

    @admin.display(description="rows")
    def progress(self, obj: Export) -> str:
        total = "?" if obj.total_estimate is None else f"{obj.total_estimate:,}"
        return f"{obj.rows_done:,} of {total}"

    @admin.display(description="files")
    def files(self, obj: Export) -> str:
        names = obj.file_names()
        if not names:
            return "none yet"
        request = getattr(_viewer, "request", None)
        if request is None or not request.user.has_perm(DOWNLOAD):
            return ", ".join(names) + " (downloads need the “Can download exports” permission)"
        seconds = checked_settings().EXPORT_LINK_SECONDS
        links = [
            (
                reverse(
                    "admin:feishu_inbox_export_download",
                    args=[parts.download_token(obj.uid, name.rsplit("/", 1)[-1])],
                ),
                name.rsplit("/", 1)[-1],
            )
            for name in names
        ]
        return format_html(
            "{}<br>(links expire {} s after this page was shown)",
            format_html_join(" ", '<a href="{}">{}</a>', links),
            f"{seconds:,.0f}",
        )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        _viewer.request = request  # the file links depend on who looks (per thread)
        return super().get_readonly_fields(request, obj)

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view(self.download)
        return [
            path("download/<str:token>/", view, name="feishu_inbox_export_download"),
            *super().get_urls(),
        ]

    def download(self, request: HttpRequest, token: str) -> HttpResponseBase:
        """One file of an export, for a user with the permission, while the link is fresh."""
        if not request.user.has_perm(DOWNLOAD):
            raise PermissionDenied
        try:
            uid, filename = parts.read_token(token, checked_settings().EXPORT_LINK_SECONDS)
        except signing.SignatureExpired:
            return HttpResponse(
                "This download link has expired: open the export again.", status=410
            )
        except signing.BadSignature:
            raise Http404("No such download.") from None
        export = Export.objects.filter(uid=uid).first()
        names = {n.rsplit("/", 1)[-1]: n for n in (export.file_names() if export else [])}
        if export is None or filename not in names:
            raise Http404("No such file (the export was removed by retention).")
        storage = export.open_storage()
        if not storage.exists(names[filename]):
            raise Http404("The file is gone from its storage.")
        return FileResponse(
            storage.open(names[filename], "rb"), as_attachment=True, filename=filename
        )
