"""``python manage.py runworker``: thin over ``worker.Worker``."""

from __future__ import annotations

import logging
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from feishu_inbox.errors import ConfigurationError
from feishu_inbox.worker import Worker, WorkerOptions

LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


class Command(BaseCommand):
    help = "Process stored Feishu events: in receipt order per chat, under leases."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--concurrency", type=int, default=4, help="jobs in flight (4)")
        parser.add_argument("--lease-seconds", type=float, help="lease length (LEASE_SECONDS)")
        parser.add_argument("--worker-id", help="default: hostname:pid:random")
        parser.add_argument("--burst", action="store_true", help="exit when nothing is due")
        parser.add_argument("--max-jobs", type=int, help="exit after this many jobs")
        parser.add_argument(
            "--grace-seconds",
            type=float,
            default=30.0,
            help="on SIGTERM, how long running handlers may finish (30)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        logging.getLogger("feishu_inbox").setLevel(LEVELS.get(options["verbosity"], logging.INFO))
        if options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1.")
        if options["lease_seconds"] is not None and options["lease_seconds"] < 1:
            raise CommandError("--lease-seconds must be at least 1.")
        try:
            worker = Worker(
                WorkerOptions(
                    concurrency=options["concurrency"],
                    lease_seconds=options["lease_seconds"],
                    worker_id=options["worker_id"],
                    burst=options["burst"],
                    max_jobs=options["max_jobs"],
                    grace_seconds=options["grace_seconds"],
                )
            )
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        worker.run()
