"""``python manage.py inbox``: the operator's ledger from the shell (same functions as admin)."""

from __future__ import annotations

import getpass
import json
import logging
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from feishu_inbox import ledger
from feishu_inbox.errors import InboxError
from feishu_inbox.models import EventJob, Status, job_as_dict
from feishu_inbox.retention import purge
from feishu_inbox.stats import stats as read_stats

log = logging.getLogger("feishu_inbox.operator")


class Command(BaseCommand):
    help = "Inspect and operate the Feishu event ledger."

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        stats = sub.add_parser("stats", help="Counts per state, due vs delayed, blocked.")
        stats.add_argument("--json", action="store_true")
        lst = sub.add_parser("list", help="List jobs, newest first.")
        lst.add_argument("--status", choices=[s.value for s in Status])
        lst.add_argument("--partition")
        lst.add_argument("--limit", type=int, default=50)
        lst.add_argument("--json", action="store_true")
        show = sub.add_parser("show", help="One job with its payload and attempts.")
        show.add_argument("id", type=int)
        show.add_argument("--json", action="store_true")
        requeue = sub.add_parser("requeue", help="failed → queued (attempt 0).")
        requeue.add_argument("ids", type=int, nargs="+", metavar="ID")
        reconcile = sub.add_parser("reconcile", help="Resolve unknown jobs.")
        reconcile.add_argument("ids", type=int, nargs="+", metavar="ID")
        discard = sub.add_parser("discard", help="failed → completed, unblocking its chat.")
        discard.add_argument("ids", type=int, nargs="+", metavar="ID")
        for action in (requeue, reconcile, discard):
            action.add_argument(
                "--user",
                help="Django username to record this under in the admin history "
                "(who did what, when); must exist.",
            )
        how = reconcile.add_mutually_exclusive_group(required=True)
        how.add_argument("--applied", action="store_true", help="The effect happened: mark done.")
        how.add_argument(
            "--not-applied", action="store_true", help="It did not happen: run it again."
        )
        sub.add_parser("purge", help="Delete completed jobs past retention.")
        sub.add_parser("demo-data", help="Fill the ledger with example events in every state.")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            getattr(self, f"do_{action.replace('-', '_')}")(options)
        except InboxError as exc:
            raise CommandError(str(exc)) from exc

    def _print_json(self, data: object) -> None:
        self.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str))

    def do_stats(self, options: dict[str, Any]) -> None:
        stats = read_stats()
        if options["json"]:
            self._print_json(stats.as_dict())
            return
        for state, n in stats.counts.items():
            self.stdout.write(f"{state:<11} {n}")
        age = stats.oldest_due_age_seconds
        self.stdout.write(
            f"due {stats.due} ({stats.due - stats.due_behind_head} claimable now, "
            f"{stats.due_behind_head} behind an unresolved earlier job of their chat), "
            f"delayed {stats.delayed}"
        )
        self.stdout.write("oldest claimable due: " + ("-" if age is None else f"{age:.1f}s"))
        self.stdout.write(f"blocked partitions: {stats.blocked_partitions}")

    def do_list(self, options: dict[str, Any]) -> None:
        jobs = EventJob.objects.order_by("-id")
        if options["status"]:
            jobs = jobs.filter(status=options["status"])
        if options["partition"]:
            jobs = jobs.in_partition(options["partition"])
        rows = [job_as_dict(j) for j in jobs[: max(options["limit"], 0)]]
        if options["json"]:
            self._print_json(rows)
            return
        for r in rows:
            self.stdout.write(
                f"{r['id']:>8} {r['status']:<10} {r['event_type']:<28} "
                f"{r['partition_key']:<32} attempt {r['attempt']} {r['error_type']}"
            )

    def do_show(self, options: dict[str, Any]) -> None:
        job = EventJob.objects.filter(pk=options["id"]).first()
        if job is None:
            raise CommandError(f"There is no job {options['id']}.")
        data = job_as_dict(job, payload=True)
        data["attempts"] = [
            {
                "number": a.number,
                "worker_id": a.worker_id,
                "started_at": a.started_at.isoformat(),
                "ended_at": a.ended_at.isoformat(),
                "outcome": a.outcome,
                "error_type": a.error_type,
                "error_message": a.error_message,
            }
            for a in job.attempts.all()
        ]
        if options["json"]:
            self._print_json(data)
            return
        for key, value in data.items():
            if key in ("payload", "attempts"):
                value = json.dumps(value, indent=2, default=str, ensure_ascii=False)
            self.stdout.write(f"{key}: {value}")

    def _operator(self, options: dict[str, Any]) -> Any:
        """The Django user the action is recorded under (checked before anything moves)."""
        if not options.get("user"):
            return None
        from django.contrib.auth import get_user_model

        model = get_user_model()
        user = model._default_manager.filter(**{model.USERNAME_FIELD: options["user"]}).first()
        if user is None:
            raise CommandError(f"There is no user {options['user']!r}; nothing was changed.")
        return user

    def _report(
        self, outcome: ledger.Outcome, verb: str, user: Any = None, label: str = ""
    ) -> None:
        log.info(
            "%s by %s (OS user %s) via manage.py inbox: done %s, refused %s",
            label or verb,
            getattr(user, "username", "-"),
            getpass.getuser(),
            outcome.done,
            sorted(outcome.refused),
        )
        if user is not None and outcome.done:
            from django.contrib.admin.models import CHANGE, LogEntry

            LogEntry.objects.log_actions(
                user.pk,
                EventJob.objects.filter(pk__in=outcome.done),
                CHANGE,
                change_message=f"{label or verb} (manage.py inbox)",
            )
        for job_id in outcome.done:
            self.stdout.write(f"job {job_id}: {verb}")
        for job_id, error in outcome.refused.items():
            self.stderr.write(f"job {job_id}: refused: {error}")
        if outcome.refused:
            raise CommandError(
                f"{len(outcome.refused)} of {len(outcome.done) + len(outcome.refused)} "
                "jobs refused; they were not changed."
            )

    def do_requeue(self, options: dict[str, Any]) -> None:
        user = self._operator(options)
        self._report(ledger.requeue(options["ids"]), "requeued", user, "Requeue failed job")

    def do_reconcile(self, options: dict[str, Any]) -> None:
        user = self._operator(options)
        applied = bool(options["applied"])
        outcome = ledger.reconcile(options["ids"], applied=applied)
        label = (
            "Reconcile unknown: the effect happened, mark done"
            if applied
            else "Reconcile unknown: the effect did NOT happen, run again"
        )
        self._report(outcome, "marked done" if applied else "queued to run again", user, label)

    def do_discard(self, options: dict[str, Any]) -> None:
        user = self._operator(options)
        self._report(ledger.discard(options["ids"]), "discarded", user, "Discard failed job")

    def do_demo_data(self, options: dict[str, Any]) -> None:
        from feishu_inbox.demo_data import fill

        counts = fill()
        self.stdout.write(
            "added example events: " + ", ".join(f"{n} {state}" for state, n in counts.items())
        )

    def do_purge(self, options: dict[str, Any]) -> None:
        self.stdout.write(str(purge()))
