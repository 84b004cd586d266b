"""``python manage.py runworker``: thin over ``runtime.worker.Worker``.

It hands the worker what the layers above the runtime offer (``worker_services``): the
schedules' tick, the Feishu SDK's warm-up, the partition prefixes of ``--queue`` (or
``--exclude-queues``) tasks.

It logs to stderr by itself when the site configured no logging for ``feishu_inbox`` (as
Celery's and procrastinate's workers do): a fresh ``startproject`` site has none, and a worker
that prints nothing hides a handler module that was never imported.
"""

from __future__ import annotations

import logging
import os
import sys
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError, OutputWrapper

from feishu_inbox import monitoring, schedules
from feishu_inbox.errors import ConfigurationError
from feishu_inbox.extras import require
from feishu_inbox.feishu import openapi
from feishu_inbox.ledger.kinds import queue_prefix
from feishu_inbox.ledger.rules import KeyFilter
from feishu_inbox.runtime import registry
from feishu_inbox.runtime.worker import Services, Worker, WorkerOptions
from feishu_inbox.schedules import scheduler

LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}
FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

log = logging.getLogger("feishu_inbox.worker")


class Command(BaseCommand):
    help = "Process stored Feishu events: in receipt order per chat, under leases."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--concurrency", type=int, default=4, help="jobs in flight (4)")
        parser.add_argument("--lease-seconds", type=float, help="lease length (LEASE_SECONDS)")
        parser.add_argument("--worker-id", help="default: hostname:pid:random")
        parser.add_argument("--burst", action="store_true", help="exit when nothing is due")
        parser.add_argument("--max-jobs", type=int, help="exit after this many jobs")
        parser.add_argument(
            "--database-patience",
            type=float,
            default=30.0,
            metavar="SECONDS",
            help="with --burst: exit with an error once the database has been unreachable "
            "this long (30); a worker without --burst keeps trying",
        )
        parser.add_argument(
            "--grace-seconds",
            type=float,
            default=30.0,
            help="on SIGTERM, how long running handlers may finish (30)",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            metavar="PORT",
            help="serve Prometheus metrics on http://HOST:PORT/metrics (and /healthz)",
        )
        parser.add_argument(
            "--metrics-host",
            default="127.0.0.1",
            metavar="ADDR",
            help="the address --metrics-port listens on (127.0.0.1; 0.0.0.0 for every one)",
        )
        parser.add_argument(
            "--queue",
            action="append",
            default=[],
            metavar="NAME",
            help="run only django.tasks tasks of this queue (repeatable); default: every job "
            "(Feishu events, schedules, tasks of every queue)",
        )
        parser.add_argument(
            "--exclude-queues",
            action="append",
            default=[],
            metavar="NAMES",
            help="run every job but the django.tasks tasks of these queues (comma-separated, "
            "repeatable); not with --queue",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        package = logging.getLogger("feishu_inbox")
        configured = site_configured_logging(package)
        # -v 0, 2 or 3 set the level; the default (1) keeps one the site's LOGGING set (a
        # LOG_LEVEL of WARNING stays WARNING) and is INFO otherwise.
        if options["verbosity"] != 1 or not (configured and package.level):
            package.setLevel(LEVELS.get(options["verbosity"], logging.INFO))
        added = None if configured else StderrHandler(self.stderr)
        if added is not None:
            package.addHandler(added)
        try:
            self._run(options)
        finally:
            if added is not None:
                package.removeHandler(added)

    def _run(self, options: dict[str, Any]) -> None:
        if options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1.")
        if not options["database_patience"] > 0:
            raise CommandError("--database-patience must be more than 0 seconds.")
        if options["lease_seconds"] is not None and options["lease_seconds"] < 1:
            raise CommandError("--lease-seconds must be at least 1.")
        queues = _queue_names("--queue", options["queue"])
        named = [q.strip() for names in options["exclude_queues"] for q in names.split(",")]
        excluded = _queue_names("--exclude-queues", named)
        if queues and excluded:
            raise CommandError(
                "--queue and --exclude-queues cannot be combined: --queue already leaves out "
                "every queue it does not name (and Feishu events and schedules)."
            )
        prefixes = tuple(queue_prefix(q) for q in queues or excluded)
        try:
            worker = Worker(
                WorkerOptions(
                    concurrency=options["concurrency"],
                    lease_seconds=options["lease_seconds"],
                    worker_id=options["worker_id"],
                    burst=options["burst"],
                    max_jobs=options["max_jobs"],
                    grace_seconds=options["grace_seconds"],
                    database_patience=options["database_patience"],
                    queues=queues,
                    excluded_queues=excluded,
                    keys=KeyFilter(prefixes, excluding=bool(excluded)),
                ),
                worker_services(),
            )
            schedules.validate()  # after the handlers, which the worker checked
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        log_handlers(worker.handlers)
        server = self._metrics(options, worker)
        try:
            worker.run()
        finally:
            if server is not None:
                server.stop()
        if worker.failure is not None:
            raise CommandError(
                f"runworker stopped: {worker.failure}; its traceback is in the log above. "
                "Its jobs were handed back (or, inside an effect, left to their leases). This "
                "is a bug of feishu_inbox: please report it with that traceback."
            )
        if worker.gave_up:
            raise CommandError(
                f"runworker --burst gave up: the database was unreachable for "
                f"{options['database_patience']:g}s (see the log above). Nothing was lost: "
                "the due jobs wait for the next run."
            )
        if worker.restart_requested:
            # Handler threads stuck past their timeout cannot be stopped from Python: a new
            # process image replaces them (same pid, same arguments; a supervisor sees no exit).
            log.warning("worker %s: starting again (os.execv)", worker.worker_id)
            logging.shutdown()
            os.execv(sys.executable, [sys.executable, *sys.argv])  # noqa: S606

    def _metrics(self, options: dict[str, Any], worker: Worker) -> Any:
        """The metrics server of ``--metrics-port``, started; None without the option."""
        port = options["metrics_port"]
        if port is None:
            return None
        if not 0 <= port <= 65535:
            raise CommandError(f"--metrics-port {port}: a port is 0 to 65535.")
        if not monitoring.available():
            try:
                require("metrics", "--metrics-port")
            except ConfigurationError as exc:
                raise CommandError(exc.described()) from exc
            raise CommandError(  # installed, but FEISHU_INBOX_METRICS=off
                "--metrics-port: metrics are off (FEISHU_INBOX_METRICS in the environment)."
            )
        try:
            server = monitoring.serve(options["metrics_host"], port, worker.health)
        except OSError as exc:
            raise CommandError(
                f"--metrics-port {port}: cannot listen on {options['metrics_host']}:{port} "
                f"({exc.strerror or exc}). Choose a free port."
            ) from exc
        log.info(
            "worker %s: metrics on http://%s:%s/metrics, health on /healthz",
            worker.worker_id,
            options["metrics_host"],
            server.port,
        )
        return server


def worker_services() -> Services:
    """The schedules' tick (when any schedule is declared) and the Feishu SDK's warm-up."""

    def warm_up() -> str:
        return f"Feishu SDK loaded for {openapi.sending_apps()}" if openapi.warm_up() else ""

    def tick(worker_id: str) -> scheduler.TickResult:
        return scheduler.tick(worker_id=worker_id)

    return Services(warm_up=warm_up, tick=tick if schedules.declared() else None)


def site_configured_logging(logger: logging.Logger) -> bool:
    """Whether the site gave ``logger``'s records somewhere to go.

    True when the logger or an ancestor it propagates to has a handler: one the site configured
    (also a NullHandler: that silence is deliberate). ``logging.lastResort`` does not count: it
    is used only when no handler is found, and prints warnings and errors only.
    """
    return logger.hasHandlers()


class StderrHandler(logging.Handler):
    """Log lines on the command's stderr, unstyled (they are not errors)."""

    def __init__(self, stderr: OutputWrapper) -> None:
        super().__init__()
        self.stderr = stderr
        self.setFormatter(logging.Formatter(FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.stderr.write(self.format(record), style_func=str)
            self.stderr.flush()
        except Exception:
            self.handleError(record)


def log_handlers(registered: dict[str, registry.Handler]) -> None:
    """The start line: which handler modules were imported and the event types they handle."""
    modules = registry.loaded_modules()
    log.info(
        "handler modules: %s; event types: %s",
        ", ".join(modules) or "none",
        ", ".join(
            f"{t} ({fn.__module__}.{fn.__qualname__})" for t, fn in sorted(registered.items())
        )
        or "none",
    )
    if not registered:
        log.warning(
            "no handler is registered: every event will complete as NoHandler. Put handlers in "
            "a %s.py module of an app in INSTALLED_APPS, or list their module in "
            'FEISHU_INBOX["HANDLER_MODULES"] (a %s.py beside settings.py is not an app: list it).',
            registry.AUTODISCOVERED_MODULE,
            registry.AUTODISCOVERED_MODULE,
        )


def _queue_names(flag: str, names: list[str]) -> tuple[str, ...]:
    """The queue names a flag gave, each once, in order; a CommandError for a bad one."""
    bad = [q for q in names if not q or ":" in q or len(q) > 64]
    if bad:
        raise CommandError(
            f"{flag} {bad[0]!r}: a queue name has 1 to 64 characters, without ':' "
            "(as in TASKS[...]['QUEUES'])."
        )
    return tuple(dict.fromkeys(names))
