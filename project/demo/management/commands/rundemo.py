"""``python manage.py rundemo``: the webhook under gunicorn and a worker, together.

Collects the static files first (WhiteNoise serves the admin's CSS and JS from STATIC_ROOT).
Stops both on Ctrl-C (SIGINT) or SIGTERM, passing the signal on; exits when either stops,
non-zero when one stopped by itself (the server could not bind its address, say). An address
already in use is refused before anything starts, saying how to choose another (``BIND``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from argparse import ArgumentParser
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

HOW_TO_CHOOSE = (
    "choose another address: BIND=127.0.0.1:8001 make demo, or "
    "manage.py rundemo --bind 127.0.0.1:8001 (send-test-event --url http://127.0.0.1:8001/"
    "feishu/events/ then)"
)


def check_free(bind: str) -> None:
    """Refuse an address the server could not listen on, before anything starts."""
    host, _, port = bind.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise CommandError(f"[bad_bind] {bind!r} is not HOST:PORT — {HOW_TO_CHOOSE}") from None
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 - what gunicorn takes ":8000" for
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
        try:
            probe.bind((host, number))
        except OSError as exc:
            raise CommandError(
                f"[address_in_use] cannot listen on {bind} ({exc.strerror}) — {HOW_TO_CHOOSE}"
            ) from None


class Command(BaseCommand):
    help = "Run the demo: webhook server (gunicorn) and a worker."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--bind", default=os.environ.get("BIND", "127.0.0.1:8000"))
        parser.add_argument("--concurrency", type=int, default=4)

    def handle(self, *args: Any, **options: Any) -> None:
        root = str(settings.BASE_DIR)
        check_free(options["bind"])
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
        if not stopping:  # one stopped by itself: the demo is not running
            codes = ", ".join(
                f"{name} {p.returncode}"
                for name, p in zip(("server", "worker"), procs, strict=True)
            )
            raise CommandError(
                f"[demo_stopped] the demo stopped by itself (exit codes: {codes}) — see the lines "
                f"above; if the server could not bind, {HOW_TO_CHOOSE}"
            )


def _python() -> str:
    """This interpreter as a command to paste in another terminal (the checkout's .venv)."""
    try:
        return os.path.relpath(sys.executable)
    except ValueError:  # another drive (Windows)
        return sys.executable
