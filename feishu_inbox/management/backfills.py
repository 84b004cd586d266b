"""``inbox backfills`` and ``inbox exports``: backfills from the shell (list, start, pause,
resume, cancel, status, and ``check``, the deploy gate that exits 1 while a migration that
``migrate`` would apply needs a backfill not applied yet) and exports (list)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS

from .operator import common_options, log
from .webhooks import WebhookCommands


def _progress_line(p: Any) -> str:
    total = "?" if p.total_estimate is None else f"{p.total_estimate:,}"
    eta = "" if p.eta_seconds is None else f", ETA {p.eta_seconds:,.0f}s"
    rate = f", {p.rate:,.0f} rows/s" if p.rate else ""
    state = p.state + (" (STALLED)" if p.stalled else "")
    return f"{p.name}  {state}  {p.rows_done:,} of {total} rows{rate}{eta}"


class BackfillCommands(WebhookCommands):
    """The ``backfills`` and ``exports`` subcommands of ``inbox``."""

    def _add_backfill_arguments(self, sub: Any) -> None:
        fills = sub.add_parser("backfills", help="Backfills: progress, start, pause, the gate.")
        acts = fills.add_subparsers(dest="backfill_action", required=True, metavar="ACTION")
        listed = acts.add_parser("list", help="Every declared or started backfill, its progress.")
        listed.add_argument("--json", action="store_true")
        check = acts.add_parser(
            "check",
            help="The deploy gate: exit 1 while a migration to apply needs a backfill not "
            "applied yet; list the other pending or stalled backfills.",
        )
        check.add_argument("--json", action="store_true")
        check.add_argument(
            "--database",
            default=DEFAULT_DB_ALIAS,
            help="The database whose migrations to check, as migrate's (default: default).",
        )
        for verb, what in (
            ("start", "Start a backfill from its first row (--force: run an applied one again)."),
            ("pause", "Pause it: its job stops before its next batch."),
            ("resume", "Go on from the cursor (paused, or failed once its function is fixed)."),
            ("cancel", "Cancel it: a start begins again from the first row."),
            ("status", "One backfill's progress."),
        ):
            act = acts.add_parser(verb, help=what)
            act.add_argument("name")
            act.add_argument("--json", action="store_true")
            if verb == "start":
                act.add_argument("--force", action="store_true", help="run it again if applied")
        exports = sub.add_parser("exports", help="Exports: their state, parts and files.")
        ex_acts = exports.add_subparsers(dest="export_action", required=True, metavar="ACTION")
        ex_list = ex_acts.add_parser("list", help="The latest exports.")
        ex_list.add_argument("--limit", type=int, default=50)
        ex_list.add_argument("--json", action="store_true")
        common_options([*acts.choices.values(), *ex_acts.choices.values()])

    def do_backfills(self, options: dict[str, Any]) -> None:
        from feishu_inbox.backfills import control

        action = options["backfill_action"]
        if action == "list":
            self._show(options, control.every())
        elif action == "check":
            self._check(options, control.pending(options["database"]))
        elif action == "status":
            self._show(options, [control.status(options["name"])])
        else:
            kwargs = {"force": options["force"]} if action == "start" else {}
            done = getattr(control, action)(options["name"], **kwargs)
            log.info("backfill %s: %s from the shell", options["name"], action)
            self._show(options, [done])

    def _show(self, options: dict[str, Any], found: list[Any]) -> None:
        if options["json"]:
            self._print_json([p.as_dict() for p in found])
            return
        for p in found:
            self.stdout.write(_progress_line(p))
            if p.error:
                self.stdout.write(f"  error: {p.error}")
        if not found:
            self.stdout.write("No backfills declared.")

    def _check(self, options: dict[str, Any], found: list[Any]) -> None:
        blocking = [g for g in found if g.blocks]
        if options["json"]:
            self._print_json([g.as_dict() for g in found])
        else:
            for g in found:
                why = g.error.described() if g.error is not None else ""
                if not g.blocks:
                    why = "; ".join([*([why] if why else []), "holds back no migration to apply"])
                self.stdout.write(f"{_progress_line(g.progress)}\n  {why}")
            if not found:
                self.stdout.write("No backfill pending.")
        if blocking:
            names = ", ".join(f"{g.progress.name} (for {g.blocks})" for g in blocking)
            raise CommandError(
                f"{len(blocking)} migration(s) to apply need a backfill not applied: {names}"
            )

    def do_exports(self, options: dict[str, Any]) -> None:
        from feishu_inbox.tables.backfills import Export

        rows = [
            {
                "id": e.uid,
                "name": e.name,
                "state": e.state,
                "format": e.format,
                "rows": e.rows_done,
                "skipped": e.skipped,
                "parts": e.part_count,
                "estimate": e.total_estimate,
                "manifest": e.manifest,
                "created_at": e.created_at,
                "finished_at": e.finished_at,
                "error": e.error,
            }
            for e in Export.objects.order_by("-id")[: max(options["limit"], 0)]
        ]
        if options["json"]:
            self._print_json(rows)
            return
        for r in rows:
            self.stdout.write(
                f"{r['id']}  {r['name']}  {r['state']}  {r['rows']:,} rows in {r['parts']} "
                f"parts  {r['manifest'] or '-'}" + (f"  {r['error']}" if r["error"] else "")
            )
        if not rows:
            self.stdout.write("No exports.")
