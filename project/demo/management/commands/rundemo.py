"""``python manage.py rundemo``: the webhook under gunicorn and a worker, together.

Collects the static files first (WhiteNoise serves the admin's CSS and JS from STATIC_ROOT).
Stops both on Ctrl-C (SIGINT) or SIGTERM, passing the signal on; exits when either stops.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from argparse import ArgumentParser
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run the demo: webhook server (gunicorn) and a worker."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--bind", default=os.environ.get("BIND", "127.0.0.1:8000"))
        parser.add_argument("--concurrency", type=int, default=4)

    def handle(self, *args: Any, **options: Any) -> None:
        root = str(settings.BASE_DIR)
        call_command("collectstatic", interactive=False, verbosity=0)
        sqlite = settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")
        # SQLite has one writer: one server process with threads answers steadiest.
        server_args = ["--workers", "1", "--threads", "8"] if sqlite else ["--workers", "4"]
        procs = [
            subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "project.wsgi",
                    "--bind",
                    options["bind"],
                    *server_args,
                    "--config",  # timeouts, and a quick shutdown that is quick
                    "python:project.demo.serving",
                    "--access-logfile",
                    "-",
                ],
                cwd=root,
            ),
            subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
                [
                    sys.executable,
                    "manage.py",
                    "runworker",
                    "--concurrency",
                    str(options["concurrency"]),
                ],
                cwd=root,
            ),
        ]
        self.stdout.write(
            f"Webhook: http://{options['bind']}/feishu/events/  "
            f"Admin: http://{options['bind']}/admin/ ({_python()} manage.py createsuperuser)\n"
            "Ctrl-C stops both."
        )
        stopping = 0

        def stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = signum

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        while not stopping and all(p.poll() is None for p in procs):
            time.sleep(0.2)  # supervising two children; nothing to synchronise with
        for p in procs:
            if p.poll() is None:
                p.send_signal(stopping or signal.SIGTERM)  # SIGINT: gunicorn's quick shutdown
        for p in procs:
            try:
                p.wait(40)
            except subprocess.TimeoutExpired:
                p.kill()


def _python() -> str:
    """This interpreter as a command to paste in another terminal (the checkout's .venv)."""
    try:
        return os.path.relpath(sys.executable)
    except ValueError:  # another drive (Windows)
        return sys.executable
