"""``inbox webhooks``: outbound webhook endpoints from the shell (list, add, change, rotate,
enable, disable, delete, attempts, publish, replay). A secret is printed once, by ``add`` and
``rotate``, and never again."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from .operator import OperatorCommand, common_options, log, positive_int


def _when(value: str) -> datetime:
    """An ISO 8601 time, or a duration ago (30m, 6h, 2d)."""
    units = {"m": "minutes", "h": "hours", "d": "days"}
    if value and value[-1] in units and value[:-1].isdigit():
        return timezone.now() - timedelta(**{units[value[-1]]: int(value[:-1])})
    found = datetime.fromisoformat(value)
    return found if found.tzinfo else timezone.make_aware(found)


def endpoint_as_dict(endpoint: Any) -> dict[str, Any]:
    """An endpoint as operators read it: never its secret."""
    return {
        "id": endpoint.uid,
        "url": endpoint.url,
        "description": endpoint.description,
        "event_types": endpoint.event_types,
        "rate_limit": endpoint.rate_limit,
        "enabled": endpoint.enabled,
        "health": endpoint.health,
        "disabled_reason": endpoint.disabled_reason,
        "failure_streak": endpoint.failure_streak,
        "failing_since": endpoint.failing_since,
        "last_success_at": endpoint.last_success_at,
        "secret_rotating_until": endpoint.previous_secret_until
        if endpoint.previous_secret
        else None,
    }


class WebhookCommands(OperatorCommand):
    """The ``webhooks`` subcommand of ``inbox``."""

    def _add_webhook_arguments(self, sub: Any) -> None:
        hooks = sub.add_parser("webhooks", help="Outbound webhook endpoints and deliveries.")
        acts = hooks.add_subparsers(dest="webhook_action", required=True, metavar="ACTION")
        listed = acts.add_parser("list", help="Every endpoint with its health (no secret).")
        listed.add_argument("--json", action="store_true")
        add = acts.add_parser("add", help="Add an endpoint; prints its secret, this once.")
        add.add_argument("url")
        add.add_argument("--event-type", action="append", default=[], dest="event_types")
        add.add_argument("--description", default="")
        add.add_argument("--rate-limit", type=float, default=None, help="requests per second")
        add.add_argument("--disabled", action="store_true", help="added disabled")
        add.add_argument("--json", action="store_true")
        change = acts.add_parser("update", help="Change an endpoint's URL, types or limit.")
        change.add_argument("endpoint")
        change.add_argument("--url")
        change.add_argument("--event-type", action="append", dest="event_types")
        change.add_argument("--description")
        change.add_argument("--rate-limit", type=float, help="requests per second; 0: none")
        rotate = acts.add_parser("rotate", help="A new secret, printed once; both sign in grace.")
        rotate.add_argument("endpoint")
        rotate.add_argument("--grace-hours", type=float, default=None)
        rotate.add_argument("--json", action="store_true")
        for verb, what in (
            ("enable", "Enable: what it held is sent, in order."),
            ("disable", "Disable: its deliveries are held, in order."),
            ("delete", "Delete it and its attempts."),
        ):
            act = acts.add_parser(verb, help=what)
            act.add_argument("endpoint")
            if verb == "disable":
                act.add_argument("--reason", default="", help="why (shown with it)")
        attempts = acts.add_parser("attempts", help="An endpoint's latest attempts.")
        attempts.add_argument("endpoint")
        attempts.add_argument("--limit", type=positive_int, default=20)
        attempts.add_argument("--json", action="store_true")
        publish = acts.add_parser("publish", help="Publish an event (a test message).")
        publish.add_argument("event_type")
        publish.add_argument("--payload", default="{}", help="JSON data")
        publish.add_argument("--key", default=None)
        replay = acts.add_parser(
            "replay", help="Send one message again (--message), or those of a time window."
        )
        replay.add_argument("endpoint")
        replay.add_argument("--message", help="a message id (msg_...)")
        replay.add_argument("--since", type=_when, help="ISO time or 30m, 6h, 2d ago")
        replay.add_argument("--until", type=_when, default=None)
        replay.add_argument("--json", action="store_true")
        common_options(acts.choices.values())

    def do_webhooks(self, options: dict[str, Any]) -> None:
        getattr(self, f"_webhooks_{options['webhook_action']}")(options)

    def _webhooks_list(self, options: dict[str, Any]) -> None:
        from feishu_inbox.tables.webhooks import WebhookEndpoint

        rows = [endpoint_as_dict(e) for e in WebhookEndpoint.objects.order_by("id")]
        if options["json"]:
            self._print_json(rows)
            return
        for row in rows:
            state = row["health"] + (f" ({row['disabled_reason']})" if not row["enabled"] else "")
            self.stdout.write(
                f"{row['id']}  {state}  streak {row['failure_streak']}  last success "
                f"{row['last_success_at'] or '-'}  {','.join(row['event_types']) or '*'}  "
                f"{row['url']}"
            )
        if not rows:
            self.stdout.write("No webhook endpoints.")

    def _webhooks_add(self, options: dict[str, Any]) -> None:
        from feishu_inbox import webhooks

        new = webhooks.add_endpoint(
            options["url"],
            event_types=options["event_types"],
            description=options["description"],
            rate_limit=options["rate_limit"],
            enabled=not options["disabled"],
        )
        log.info("webhook endpoint %s added from the shell", new.uid)
        self._secret(options, new, "Added")

    def _webhooks_rotate(self, options: dict[str, Any]) -> None:
        from feishu_inbox import webhooks

        hours = options["grace_hours"]
        new = webhooks.rotate_secret(
            options["endpoint"], grace=None if hours is None else timedelta(hours=hours)
        )
        self._secret(options, new, "Rotated")

    def _secret(self, options: dict[str, Any], new: Any, done: str) -> None:
        if options["json"]:
            self._print_json({**endpoint_as_dict(new.endpoint), "secret": new.secret})
            return
        self.stdout.write(f"{done} {new.uid}. Its secret (shown this once; keep it now):")
        self.stdout.write(new.secret)

    def _webhooks_update(self, options: dict[str, Any]) -> None:
        from feishu_inbox import webhooks

        rate = options["rate_limit"]
        webhooks.update(
            options["endpoint"],
            url=options["url"],
            event_types=options["event_types"],
            description=options["description"],
            rate_limit=False if rate is None else (rate or None),
        )
        self.stdout.write(f"Updated {options['endpoint']}.")

    def _webhooks_enable(self, options: dict[str, Any]) -> None:
        from feishu_inbox import webhooks

        released = webhooks.enable(options["endpoint"])
        self.stdout.write(f"Enabled {options['endpoint']}: {released} held deliveries released.")

    def _webhooks_disable(self, options: dict[str, Any]) -> None:
        from feishu_inbox import webhooks

        detail = options["reason"] or "disabled by an operator"
        changed = webhooks.disable(options["endpoint"], reason="operator", detail=detail)
        self.stdout.write(
            f"Disabled {options['endpoint']}." if changed else "It was disabled already."
        )

    def _webhooks_delete(self, options: dict[str, Any]) -> None:
        from feishu_inbox import webhooks

        webhooks.delete(options["endpoint"])
        self.stdout.write(f"Deleted {options['endpoint']}.")

    def _webhooks_attempts(self, options: dict[str, Any]) -> None:
        from feishu_inbox import webhooks
        from feishu_inbox.tables.webhooks import WebhookAttempt

        endpoint = webhooks.get(options["endpoint"])
        rows: list[dict[str, Any]] = [
            {
                "message": a.message.uid,
                "job": a.job_id,
                "at": a.at,
                "outcome": a.outcome,
                "status": a.status_code,
                "latency_ms": a.latency_ms,
                "response": a.response,
                "error": a.error,
            }
            for a in WebhookAttempt.objects.filter(endpoint=endpoint)
            .select_related("message")
            .order_by("-id")[: options["limit"]]
        ]
        if options["json"]:
            self._print_json(rows)
            return
        for row in rows:
            self.stdout.write(
                f"{row['at']}  {row['message']}  {row['outcome']}  {row['status'] or '-'}  "
                f"{row['latency_ms']:.1f} ms  {row['error'] or row['response'][:80]}"
            )

    def _webhooks_publish(self, options: dict[str, Any]) -> None:
        from feishu_inbox import webhooks

        try:
            payload = json.loads(options["payload"])
        except ValueError as exc:
            raise webhooks.WebhookEventInvalid(f"--payload is not JSON ({exc}).") from None
        done = webhooks.publish(options["event_type"], payload, key=options["key"])
        self.stdout.write(f"Published {done.message_id} to {len(done.endpoints)} endpoints.")

    def _webhooks_replay(self, options: dict[str, Any]) -> None:
        from feishu_inbox import webhooks

        if options["message"]:
            done = webhooks.replay(options["message"], options["endpoint"])
        elif options["since"] is not None:
            done = webhooks.replay_window(
                options["endpoint"], options["since"], options["until"] or timezone.now()
            )
        else:
            raise webhooks.WebhookEventInvalid(
                "Replay what? Give --message MSG_ID, or --since (and --until) for a window.",
                fix="Add --message or --since; nothing was replayed.",
            )
        log.info("webhook endpoint %s: %d deliveries replayed", options["endpoint"], len(done.jobs))
        if options["json"]:
            replayed = [{"message": m, "job": j} for m, j in done.jobs.items()]  # in order
            self._print_json({"replayed": replayed, "pending": done.pending})
            return
        self.stdout.write(
            f"Replayed {len(done.jobs)} messages to {options['endpoint']}"
            + (f"; {len(done.pending)} still pending, not replayed." if done.pending else ".")
        )
