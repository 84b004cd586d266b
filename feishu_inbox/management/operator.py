"""What the ``inbox`` command's subcommands share (JSON output, the ``--user`` an action is
recorded under, Django's common options after a subcommand, a positive ``--limit``) and its
``schedules`` subcommand: list, pause, resume, run now."""

from __future__ import annotations

import getpass
import json
import logging
from argparse import SUPPRESS, ArgumentParser, ArgumentTypeError
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from feishu_inbox.errors import LedgerError

log = logging.getLogger("feishu_inbox.operator")


def positive_int(value: str) -> int:
    """A count of at least 1 (``--limit -5`` printed nothing and exited 0)."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ArgumentTypeError(f"{value!r} is not a positive whole number (e.g. 50)")
    return number


def common_options(parsers: Any) -> None:
    """Django's options that a subcommand's parser would refuse after it (``inbox stats
    --settings X``; ``manage.py`` reads ``--settings`` and ``--pythonpath`` wherever they are,
    before the command runs). SUPPRESS: an option absent after the subcommand keeps what the
    main parser read."""
    for parser in list(parsers):
        if not isinstance(parser, ArgumentParser):
            continue
        parser.add_argument("--settings", default=SUPPRESS, help=SUPPRESS)
        parser.add_argument("--pythonpath", default=SUPPRESS, help=SUPPRESS)
        parser.add_argument("--traceback", action="store_true", default=SUPPRESS, help=SUPPRESS)
        parser.add_argument("--no-color", action="store_true", default=SUPPRESS, help=SUPPRESS)
        parser.add_argument(
            "-v", "--verbosity", type=int, choices=[0, 1, 2, 3], default=SUPPRESS, help=SUPPRESS
        )


class OperatorCommand(BaseCommand):
    """A management command through which an operator acts, recorded as in the admin."""

    def _print_json(self, data: object) -> None:
        self.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str))

    def _operator(self, options: dict[str, Any]) -> Any:
        """The Django user the action is recorded under (checked before anything moves)."""
        if not options.get("user"):
            return None
        from django.contrib.auth import get_user_model

        model = get_user_model()
        user = model._default_manager.filter(**{model.USERNAME_FIELD: options["user"]}).first()
        if user is None:
            raise LedgerError(
                f"There is no user {options['user']!r} to record this under.",
                fix="Give an existing Django username to --user; nothing was changed.",
            )
        return user

    def _add_schedule_arguments(self, sub: Any) -> None:
        schedules = sub.add_parser(
            "schedules",
            help="Schedules: next occurrence, last fired, last job, paused; pause, resume, "
            "run-now.",
        )
        schedules.add_argument("--json", action="store_true")
        acts = schedules.add_subparsers(dest="schedule_action", metavar="ACTION")
        for name, what in (
            ("pause", "Enqueue nothing until resumed."),
            ("resume", "Resume; missed occurrences go by the catch-up policy."),
            ("run-now", "One job of each schedule now, outside its cadence."),
        ):
            act = acts.add_parser(name, help=what)
            act.add_argument("names", nargs="+", metavar="NAME")
            act.add_argument(
                "--user",
                help="Django username to record this under in the admin history; must exist.",
            )

    def do_schedules(self, options: dict[str, Any]) -> None:
        from feishu_inbox.schedules import scheduler

        action = options.get("schedule_action")
        if action is None:
            self._list_schedules(scheduler.overview(), options["json"])
            return
        user = self._operator(options)
        names = options["names"]
        label = {"pause": "Pause schedule", "resume": "Resume schedule", "run-now": "Run now"}
        if action == "pause":
            outcome = scheduler.pause(names)
        elif action == "resume":
            outcome = scheduler.resume(names)
        else:
            by = getattr(user, "username", "") or f"{getpass.getuser()} (manage.py inbox)"
            outcome = scheduler.run_now(names, by=by)
        self._report_schedules(outcome, label[action], user)

    def _list_schedules(self, views: list[Any], as_json: bool) -> None:
        if as_json:
            self._print_json([v.as_dict() for v in views])
            return
        if not views:
            self.stdout.write("no schedules declared (see docs/schedules.md)")
        for v in views:
            d = v.as_dict()
            when = (
                f"{d['cron']} ({d['description']}, {d['time_zone']})"
                if v.spec
                else ("no longer declared")
            )
            last = (
                f"job {d['last_job_id']} {d['last_job_status'] or 'purged'}"
                if d["last_job_id"]
                else "no job yet"
            )
            self.stdout.write(
                f"{d['name']:<24} {'paused' if d['paused'] else 'active':<7} {when}; "
                f"catch-up {d['catch_up']}; next {d['next_occurrence_local'] or '-'}; "
                f"last fired {d['last_fired_at'] or '-'}; {last}"
            )

    def _report_schedules(self, outcome: Any, label: str, user: Any) -> None:
        log.info(
            "%s by %s (OS user %s) via manage.py inbox: done %s, refused %s",
            label,
            getattr(user, "username", "-"),
            getpass.getuser(),
            outcome.done,
            sorted(outcome.refused),
        )
        if user is not None and outcome.done:
            from django.contrib.admin.models import CHANGE, LogEntry

            from feishu_inbox.models import Schedule

            LogEntry.objects.log_actions(
                user.pk,
                Schedule.objects.filter(name__in=outcome.done),
                CHANGE,
                change_message=f"{label} (manage.py inbox)",
            )
        for name in outcome.done:
            job = outcome.job_ids.get(name)
            self.stdout.write(f"schedule {name}: {label.lower()}" + (f": job {job}" if job else ""))
        for name, error in outcome.refused.items():
            self.stderr.write(f"schedule {name}: refused: {error.described()}")
        if outcome.refused:
            raise CommandError(
                f"{len(outcome.refused)} of {len(outcome.done) + len(outcome.refused)} "
                "schedules refused; they were not changed."
            )
