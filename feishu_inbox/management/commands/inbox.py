"""``python manage.py inbox``: the operator's ledger from the shell (same functions as admin)."""

from __future__ import annotations

import getpass
import json
import logging
from argparse import ArgumentParser, ArgumentTypeError
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, cast

from django.core.management.base import CommandError
from django.utils import timezone

from feishu_inbox import ledger
from feishu_inbox.errors import ConfigurationError, InboxError, JobNotFound
from feishu_inbox.feishu import deliveries
from feishu_inbox.ledger import buckets, pauses, reports, waits
from feishu_inbox.ledger import workers as worker_beats
from feishu_inbox.ledger.kinds import choices, in_queue, of_kind
from feishu_inbox.ledger.operators import Outcome
from feishu_inbox.ledger.payloads import without_secrets
from feishu_inbox.ledger.retention import purge
from feishu_inbox.ledger.stats import stats as read_stats
from feishu_inbox.management.backfills import BackfillCommands
from feishu_inbox.management.operator import common_options, positive_int
from feishu_inbox.management.workflow_view import tree_lines, workflow_as_dict
from feishu_inbox.models import (
    LARGEST_JOB_ID,
    EventJob,
    Status,
    Step,
    job_as_dict,
    job_id_from_text,
)
from feishu_inbox.tasks.jobs import APP as TASKS_APP
from feishu_inbox.tasks.jobs import RETURN_STEP

log = logging.getLogger("feishu_inbox.operator")

#: name → (help, the ledger call, the label in the admin history)
OPERATOR_ACTIONS: dict[str, tuple[str, Callable[[list[int], dict[str, Any]], Outcome], str]] = {
    "requeue": (
        "failed → queued (attempt 0).",
        lambda ids, o: ledger.requeue(ids, from_step=o["from_step"]),
        "Requeued",
    ),
    "reconcile": (
        "Resolve unknown jobs: --applied or --not-applied.",
        lambda ids, o: ledger.reconcile(ids, applied=bool(o["applied"]), from_step=o["from_step"]),
        "Reconciled",
    ),
    "discard": (
        "failed → completed, unblocking its chat.",
        lambda ids, o: ledger.discard(ids),
        "Discarded",
    ),
    "cancel": (
        "Cancel jobs: queued or waiting ones at once, running ones at their next checkpoint.",
        lambda ids, o: ledger.cancel(ids),
        "Cancelled",
    ),
    "replay": (
        "completed → queued: run the event again (by id, or --event-type/--since/--error).",
        lambda ids, o: ledger.replay(ids, from_step=o["from_step"]),
        "Replayed",
    ),
    "signal": (
        "waiting → due now: deliver the job's wait a signal by hand (--payload JSON).",
        lambda ids, o: waits.resume_jobs(ids, o["payload"]),
        "Resumed",
    ),
    "time-out": (
        "waiting → due now: the job's wait times out (a sleep ends).",
        lambda ids, o: waits.time_out_jobs(ids),
        "Timed out",
    ),
}


def wait_as_dict(view: waits.WaitView) -> dict[str, Any]:
    return {
        "name": view.name,
        "key": view.key,
        "state": view.state,
        "since": view.since.isoformat(),
        "until": None if view.until is None else view.until.isoformat(),
        "chat": view.chat,
        "holds_chat": view.holds_chat,
    }


def describe_wait(wait: dict[str, Any]) -> str:
    what = f"signal {wait['key']!r}" if wait["key"] else "a sleep"
    until = f" until {wait['until']}" if wait["until"] else ""
    return f"waits for {what} since {wait['since']}{until}"


def json_value(value: str) -> Any:
    """``--payload``: JSON text."""
    try:
        return json.loads(value)
    except ValueError as exc:
        raise ArgumentTypeError(f"not JSON ({exc}): {value!r:.80}") from exc


def since(value: str) -> datetime:
    """``--since``: an ISO 8601 time, or a duration ago (30m, 6h, 2d)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if value[-1:] in units and value[:-1].isdigit():
        return timezone.now() - timedelta(seconds=int(value[:-1]) * units[value[-1]])
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ArgumentTypeError(
            f"{value!r} is neither an ISO 8601 time nor a duration like 30m, 6h, 2d"
        ) from None
    return parsed if parsed.tzinfo else timezone.make_aware(parsed)


def job_id(value: str) -> int:
    """An ``ID`` argument: a whole number that can be a job's id."""
    number = job_id_from_text(value)
    if number is None:
        raise ArgumentTypeError(
            f"{value!r} is not a job id: a whole number from 1 to {LARGEST_JOB_ID} "
            "(`manage.py inbox list` shows them)"
        )
    return number


class Command(BackfillCommands):
    help = "Inspect and operate the Feishu event ledger."

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        stats = sub.add_parser("stats", help="Counts per state, due vs delayed, blocked.")
        stats.add_argument("--json", action="store_true")
        lst = sub.add_parser("list", help="List jobs, newest first.")
        lst.add_argument("--status", choices=[s.value for s in Status])
        lst.add_argument("--partition")
        lst.add_argument("--tenant", help="the jobs of this tenant ('' for none)")
        lst.add_argument(
            "--kind",
            choices=sorted(choices()),
            help="the jobs of one kind: "
            + ", ".join(f"{name} ({label})" for name, label in choices().items()),
        )
        lst.add_argument("--queue", help="django.tasks tasks of this queue")
        lst.add_argument("--limit", type=positive_int, default=50, help="at most this many (50)")
        lst.add_argument("--json", action="store_true")
        show = sub.add_parser("show", help="One job with its payload and attempts.")
        show.add_argument("id", help="a job id, or a django.tasks task result id")
        show.add_argument("--json", action="store_true")
        for name, (help_text, _, _) in OPERATOR_ACTIONS.items():
            action = sub.add_parser(name, help=help_text)
            action.add_argument(
                "ids", type=job_id, nargs="*" if name == "replay" else "+", metavar="ID"
            )
            action.add_argument(
                "--user",
                help="Django username to record this under in the admin history "
                "(who did what, when); must exist.",
            )
            action.add_argument("--json", action="store_true", help="Print the outcome as JSON.")
            if name in ("requeue", "reconcile", "replay"):
                action.add_argument(
                    "--from-step",
                    metavar="NAME",
                    help="run again from this step: it and every step that started after it "
                    "are forgotten; earlier ones stay memoized",
                )
            if name == "signal":
                action.add_argument(
                    "--payload",
                    type=json_value,
                    default=None,
                    help="the signal's payload, as JSON (default: null)",
                )
            if name == "reconcile":
                how = action.add_mutually_exclusive_group(required=True)
                how.add_argument(
                    "--applied", action="store_true", help="The effect happened: mark done."
                )
                how.add_argument(
                    "--not-applied", action="store_true", help="It did not happen: run it again."
                )
            if name == "replay":
                action.add_argument("--event-type", help="Replay completed jobs of this type…")
                action.add_argument("--app", help="… of this Feishu app …")
                action.add_argument(
                    "--since",
                    type=since,
                    help="… received since this time (ISO 8601) or this long ago (30m, 6h, 2d) …",
                )
                action.add_argument(
                    "--error", help="… that ended with this error type (e.g. NoHandler)"
                )
                action.add_argument(
                    "--limit", type=positive_int, default=1000, help="at most this many (1000)"
                )
        sub.add_parser("purge", help="Delete completed jobs past retention.")
        conns = sub.add_parser(
            "connections", help="The long connections of feishu_connect processes, live or lost."
        )
        conns.add_argument("--json", action="store_true")
        send = sub.add_parser(
            "send-test-event",
            help="Send the webhook a text message event, encrypted and signed as Feishu does.",
        )
        send.add_argument(
            "--url",
            default="http://127.0.0.1:8000/feishu/events/",
            help="the webhook's URL (the demo's: http://127.0.0.1:8000/feishu/events/)",
        )
        send.add_argument("--app", default="default", help="whose secrets sign it (default)")
        send.add_argument("--text", default="hello from inbox send-test-event")
        send.add_argument("--chat", default="oc_test_chat", metavar="CHAT_ID")
        send.add_argument("--private", action="store_true", help="a direct (p2p) message")
        beats = sub.add_parser(
            "workers", help="The runworker processes: live, lost or stopped, and what each runs."
        )
        beats.add_argument("--json", action="store_true")
        for verb, what in (
            ("pause", "Hold the work of a chat, an app, an event type or a task queue."),
            ("resume", "End a pause: what it held is due now, in its order."),
        ):
            act = sub.add_parser(verb, help=what)
            target = act.add_mutually_exclusive_group(required=True)
            target.add_argument("--partition", metavar="KEY", help="a partition (a chat)")
            target.add_argument("--app", help="a Feishu app of FEISHU_INBOX['APPS']")
            target.add_argument("--event-type", metavar="TYPE")
            target.add_argument("--queue", help="a django.tasks queue")
            act.add_argument("--user", help="Django username to record this under; must exist.")
            act.add_argument("--json", action="store_true")
            if verb == "pause":
                act.add_argument("--reason", default="", help="why (shown on the dashboard)")
        listed = sub.add_parser("pauses", help="What is paused, since when, by whom.")
        listed.add_argument("--json", action="store_true")
        self._add_schedule_arguments(sub)
        self._add_webhook_arguments(sub)
        self._add_backfill_arguments(sub)
        sub.add_parser("demo-data", help="Fill the ledger with example events in every state.")
        common_options(sub.choices.values())

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            getattr(self, f"do_{action.replace('-', '_')}")(options)
        except InboxError as exc:
            raise CommandError(exc.described()) from exc

    def do_stats(self, options: dict[str, Any]) -> None:
        stats = read_stats()
        limits = [b.as_dict() for b in buckets.states()]
        waiting = buckets.waiting_jobs()
        if options["json"]:
            self._print_json(
                {**stats.as_dict(), "rate_limits": limits, "waiting_for_limits": waiting}
            )
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
        self.stdout.write(f"waiting for a rate limit: {waiting}")
        for b in limits:
            blocked = f", blocked until {b['blocked_until']}" if b["blocked_until"] else ""
            self.stdout.write(
                f"  {b['key']}: {b['tokens']} of {b['burst']:g} tokens at {b['per_second']:g}/s"
                f"{blocked}; taken {b['taken']}, waited {b['refused']}"
            )

    def do_list(self, options: dict[str, Any]) -> None:
        jobs = EventJob.objects.order_by("-id")
        if options["status"]:
            jobs = jobs.filter(status=options["status"])
        if options["partition"]:
            jobs = jobs.in_partition(options["partition"])
        if options["tenant"] is not None:
            jobs = jobs.of_tenant(options["tenant"])
        if options["kind"]:
            jobs = of_kind(jobs, options["kind"])
        if options["queue"]:
            jobs = in_queue(jobs, options["queue"])
        rows = [job_as_dict(j) for j in jobs[: max(options["limit"], 0)]]
        waiting = [int(str(r["id"])) for r in rows if r["status"] == Status.WAITING]
        views = waits.waits_of(waiting)
        for r in rows:
            view = views.get(int(str(r["id"])))
            if view is not None:  # what it waits for, in its chat (a chat given back)
                r["partition_key"] = view.chat
                r["wait"] = wait_as_dict(view)
        if options["json"]:
            self._print_json(rows)
            return
        for r in rows:
            wait = r.get("wait")
            what = "" if not isinstance(wait, dict) else f" {describe_wait(wait)}"
            self.stdout.write(
                f"{r['id']:>8} {r['status']:<10} {r['event_type']:<28} "
                f"{r['partition_key']:<32} attempt {r['attempt']} {r['error_type']}{what}"
            )

    def do_show(self, options: dict[str, Any]) -> None:
        key = str(options["id"])
        if key.isascii() and key.isdigit():  # a job id, or a number that names no job
            number = job_id_from_text(key)
            job = None if number is None else EventJob.objects.filter(pk=number).first()
        else:
            job = EventJob.objects.filter(app=TASKS_APP, dedupe_key=key).first()
        if job is None:
            raise JobNotFound(f"There is no job {options['id']}.")
        data = job_as_dict(job, payload=True)
        data["payload"] = without_secrets(data["payload"])  # as the admin shows it
        view = waits.waits_of([job.pk]).get(job.pk)
        if view is not None:  # what it waits, or last waited, for
            data["partition_key"] = view.chat
            data["wait"] = wait_as_dict(view)
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
        if job.app == TASKS_APP:  # a django.tasks task: its return value, as the admin shows
            returned = Step.objects.filter(job_id=job.pk, name=RETURN_STEP).first()
            data["return_value"] = None if returned is None else returned.result
        workflow = workflow_as_dict(job)
        if workflow is not None:  # its workflow (SPEC §9f)
            data["workflow"] = workflow
        if options["json"]:
            self._print_json(data)
            return
        for key, value in data.items():
            if key == "workflow":
                for line in tree_lines(job.pk, cast("dict[str, Any]", value)):
                    self.stdout.write(line)
                continue
            if key in ("payload", "attempts", "return_value", "wait"):
                value = json.dumps(value, indent=2, default=str, ensure_ascii=False)
            self.stdout.write(f"{key}: {value}")

    def do_connections(self, options: dict[str, Any]) -> None:
        rows = [c.as_dict() for c in reports.seen()]
        if options["json"]:
            self._print_json(rows)
            return
        if not rows:
            self.stdout.write("no long connection has reported (is feishu_connect running?)")
        for r in rows:
            self.stdout.write(
                f"{r['app']:<16} {r['process']:<28} {r['state']:<10} since {r['since']} "
                f"last pong {r['last_pong_at'] or '-'} events {r['events']} {r['error']}"
            )

    def do_send_test_event(self, options: dict[str, Any]) -> None:
        import urllib.error
        import urllib.request

        try:
            envelope = deliveries.app_message_event(
                options["app"],
                text=options["text"],
                chat_id=options["chat"],
                private=options["private"],
            )
            body, headers = deliveries.delivery(options["app"], envelope)
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        url = options["url"]
        if not url.startswith(("http://", "https://")):
            raise CommandError(f"--url {url!r}: give the webhook's http:// or https:// URL.")
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - checked above
                status, text = answer.status, answer.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read().decode(errors="replace")
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CommandError(
                f"Could not reach {url}: {reason}. Is the webhook served there (make demo)? "
                "--url names another server's webhook."
            ) from exc
        if status != 200:
            raise CommandError(f"The webhook at {url} answered {status}: {text.strip()}")
        self.stdout.write(f"delivered to {url}: {status} {text.strip()}")
        event_id = envelope["header"]["event_id"]
        job = EventJob.objects.filter(app=options["app"], event_id=event_id).first()
        if job is None:
            self.stdout.write(
                f"event {event_id} is not in this site's ledger: the server at {url} stores "
                "into another database."
            )
            return
        self.stdout.write(
            f"event {event_id} stored as job {job.pk} ({job.status}): manage.py inbox show {job.pk}"
        )

    def do_workers(self, options: dict[str, Any]) -> None:
        found = worker_beats.workers()
        if options["json"]:
            self._print_json([w.as_dict() for w in found])
            return
        if not found:
            self.stdout.write("no worker has written its heartbeat (is runworker running?)")
        for w in found:
            running = ", ".join(f"#{j}" for j in w.running_jobs) or "nothing"
            self.stdout.write(
                f"{w.worker_id:<32} {w.state:<8} {w.host}:{w.pid} v{w.version} "
                f"{w.busy}/{w.concurrency} busy, {w.scope}; "
                f"last beat {w.last_beat_at:%Y-%m-%d %H:%M:%S}; running {running}"
            )

    def do_pause(self, options: dict[str, Any]) -> None:
        self._pause_or_resume(options, pause=True)

    def do_resume(self, options: dict[str, Any]) -> None:
        self._pause_or_resume(options, pause=False)

    def _pause_or_resume(self, options: dict[str, Any], *, pause: bool) -> None:
        kind, value = next(
            (k, options[k]) for k in ("partition", "app", "event_type", "queue") if options[k]
        )
        user = self._operator(options)
        by = getattr(user, "username", "") or f"{getpass.getuser()} (manage.py inbox)"
        if pause:
            outcome = pauses.pause(kind, value, by=by, reason=options.get("reason") or "")
        else:
            outcome = pauses.resume(kind, value, by=by)
        label = f"{'Paused' if pause else 'Resumed'} {kind} {value}"
        log.info("%s by %s: %s jobs %s", label, by, outcome.jobs, "held" if pause else "due now")
        if user is not None and outcome.changed:
            from django.contrib.admin.models import ADDITION, DELETION, LogEntry

            LogEntry.objects.log_actions(
                user.pk,
                [outcome.pause],
                ADDITION if pause else DELETION,
                change_message=f"{label} (manage.py inbox)",
            )
        data = {**pauses.as_dict(outcome.pause), "changed": outcome.changed, "jobs": outcome.jobs}
        if options["json"]:
            self._print_json(data)
            return
        state = "" if outcome.changed else " (it was already)"
        held = "held" if pause else "due again"
        self.stdout.write(f"{label}{state}: {outcome.jobs} waiting jobs {held}")

    def do_pauses(self, options: dict[str, Any]) -> None:
        rows = [pauses.as_dict(p) for p in pauses.listed()]
        if options["json"]:
            self._print_json(rows)
            return
        if not rows:
            self.stdout.write("nothing is paused")
        for r in rows:
            self.stdout.write(
                f"{r['kind']:<11} {r['value']:<40} since {r['since']} by {r['by']}"
                + (f": {r['reason']}" if r["reason"] else "")
            )

    def _act(self, options: dict[str, Any]) -> None:
        """An operator action: the same ledger function as the admin's, recorded the same."""
        name = options["action"]
        _, call, label = OPERATOR_ACTIONS[name]
        verb = {
            "requeue": "requeued",
            "discard": "discarded",
            "cancel": "cancelled",
            "signal": "signalled",
            "time-out": "timed out",
        }.get(name, "replayed")
        if name == "reconcile":
            applied = bool(options["applied"])
            label = f"{label}: the effect {'happened, mark done' if applied else 'did NOT happen'}"
            verb = "marked done" if applied else "queued to run again"
        user = self._operator(options)
        ids = options["ids"] or (self._matching(options) if name == "replay" else [])
        outcome = call(ids, options)
        log.info(
            "%s by %s (OS user %s) via manage.py inbox: done %s, pending %s, refused %s",
            label,
            getattr(user, "username", "-"),
            getpass.getuser(),
            outcome.done,
            outcome.pending,
            sorted(outcome.refused),
        )
        changed = [*outcome.done, *outcome.pending]
        if user is not None and changed:
            from django.contrib.admin.models import CHANGE, LogEntry

            LogEntry.objects.log_actions(
                user.pk,
                EventJob.objects.filter(pk__in=changed),
                CHANGE,
                change_message=f"{label} (manage.py inbox)",
            )
        if options["json"]:
            self._print_json(
                {
                    "done": outcome.done,
                    "pending": outcome.pending,
                    "moved": {str(old): new for old, new in outcome.moved.items()},
                    "refused": [
                        {"id": job_id, **error.as_dict()}
                        for job_id, error in outcome.refused.items()
                    ],
                }
            )
        else:
            moved_to = {new: old for old, new in outcome.moved.items()}
            for job_id in outcome.done:
                was = f" (was job {moved_to[job_id]})" if job_id in moved_to else ""
                self.stdout.write(f"job {job_id}: {verb}{was}")
            for job_id in outcome.pending:
                self.stdout.write(f"job {job_id}: running, asked to stop at its next checkpoint")
            for job_id, error in outcome.refused.items():
                self.stderr.write(f"job {job_id}: refused: {error.described()}")
        if outcome.refused:
            total = len(outcome.done) + len(outcome.pending) + len(outcome.refused)
            raise CommandError(f"{len(outcome.refused)} of {total} jobs refused; not changed.")

    do_requeue = do_reconcile = do_discard = do_cancel = do_replay = _act
    do_signal = do_time_out = _act

    def _matching(self, options: dict[str, Any]) -> list[int]:
        """The completed jobs a ``replay`` without ids names by its filters (oldest first)."""
        if not (options["event_type"] or options["since"] or options["error"]):
            raise CommandError(
                "[invalid_argument] replay needs job ids, or filters: --event-type, --since, "
                "--error (and --app). — e.g. `inbox replay --error NoHandler --since 1h`"
            )
        jobs = EventJob.objects.completed()
        if options["event_type"]:
            jobs = jobs.filter(event_type=options["event_type"])
        if options["app"]:
            jobs = jobs.filter(app=options["app"])
        if options["since"]:
            jobs = jobs.filter(received_at__gte=options["since"])
        if options["error"]:
            jobs = jobs.filter(error_type=options["error"])
        return list(jobs.order_by("id").values_list("id", flat=True)[: max(options["limit"], 0)])

    def do_demo_data(self, options: dict[str, Any]) -> None:
        from feishu_inbox.management.demo_data import fill

        before = EventJob.objects.count()
        counts = fill()  # the ledger's totals, not what was added: said so (issue 55)
        self.stdout.write(
            f"added {EventJob.objects.count() - before} example jobs; the ledger now holds: "
            + ", ".join(f"{n} {state}" for state, n in counts.items())
        )

    def do_purge(self, options: dict[str, Any]) -> None:
        self.stdout.write(str(purge()))
