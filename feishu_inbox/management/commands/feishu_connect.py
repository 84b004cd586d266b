"""``python manage.py feishu_connect [--app NAME …]``: thin over ``feishu.gateway``.

Holds one long connection to Feishu per app (every app with APP_ID and APP_SECRET, or the
``--app`` ones) and stores each event before it ACKs it. Exits 0 on SIGTERM/SIGINT, 78 when
Feishu refuses an app for good (the log says how to fix it), 1 on any other failure.
"""

from __future__ import annotations

import logging
import sys
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from feishu_inbox.conf import checked_settings
from feishu_inbox.errors import ConfigurationError
from feishu_inbox.feishu.gateway import Gateway

from .runworker import LEVELS, StderrHandler, site_configured_logging


def connecting_apps(apps: dict[str, dict[str, str]]) -> list[str]:
    """The apps that can open a long connection: those with an APP_ID and an APP_SECRET."""
    return [name for name, keys in apps.items() if keys.get("APP_ID") and keys.get("APP_SECRET")]


class Command(BaseCommand):
    help = "Receive Feishu events over the long connection; each is stored before its ACK."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--app",
            action="append",
            default=[],
            metavar="NAME",
            help="connect this app of FEISHU_INBOX['APPS'] (repeatable); default: every app "
            "with APP_ID and APP_SECRET",
        )
        parser.add_argument(
            "--health-port",
            type=int,
            help="serve GET /healthz (200 when every connection is up, else 503) on this port",
        )
        parser.add_argument(
            "--health-host", default="127.0.0.1", help="address of the probe (127.0.0.1)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        package = logging.getLogger("feishu_inbox")
        package.setLevel(LEVELS.get(options["verbosity"], logging.INFO))
        if not site_configured_logging(package):
            package.addHandler(StderrHandler(self.stderr))
        try:
            conf = checked_settings()
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        apps = self._apps(options["app"], conf.APPS)
        port = options["health_port"]
        if port is not None and not 0 < port < 65536:
            raise CommandError(f"--health-port {port}: a port is 1 to 65535.")
        health = (options["health_host"], port) if port is not None else None
        try:
            gateway = Gateway(apps, conf, health=health)
        except ConfigurationError as exc:  # the connect extra is missing
            raise CommandError(exc.described()) from exc
        code = gateway.run()
        if code:
            sys.exit(code)

    def _apps(self, asked: list[str], configured: dict[str, dict[str, str]]) -> list[str]:
        able = connecting_apps(configured)
        if not asked:
            if not able:
                raise CommandError(
                    "No app can open a long connection: give one an APP_ID and an APP_SECRET "
                    "in FEISHU_INBOX['APPS'] (its DOMAIN says where: feishu, lark or a URL)."
                )
            return able
        unknown = [a for a in asked if a not in configured]
        if unknown:
            raise CommandError(
                f"--app {unknown[0]!r} is not in FEISHU_INBOX['APPS'] "
                f"(configured: {', '.join(configured) or 'none'})."
            )
        missing = [a for a in asked if a not in able]
        if missing:
            raise CommandError(
                f"--app {missing[0]!r} has no APP_ID or APP_SECRET: a long connection needs both."
            )
        return list(dict.fromkeys(asked))
