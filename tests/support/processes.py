"""Real processes for tests: the demo under gunicorn, ``manage.py runworker``; condition waits."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def wait_for(condition: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Poll ``condition`` until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(0.01)  # the polling interval of a condition wait, not synchronisation


def subprocess_database_url() -> str:
    """The URL of the database this test runs on, for a subprocess."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return f"postgres://{db['USER']}@{host}:{port}/{db['NAME']}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(DATABASE_URL=subprocess_database_url(), DJANGO_SETTINGS_MODULE="project.settings")
    env.update(extra)
    return env


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


#: How the tests' gunicorn runs unless a test says otherwise.
SERVER_ARGS = ("--workers", "2", "--log-level", "warning")


def gunicorn(port: int, args: Sequence[str] = SERVER_ARGS, **popen: Any) -> subprocess.Popen[bytes]:
    """The site under gunicorn on ``port`` (started, not yet listening)."""
    command = [sys.executable, "-m", "gunicorn", "project.wsgi", "--bind", f"127.0.0.1:{port}"]
    return subprocess.Popen([*command, *args], cwd=ROOT, **popen)


def start_server(port: int, **env: str) -> subprocess.Popen[bytes]:
    proc = gunicorn(port, env=subprocess_env(**env))
    try:
        wait_for(lambda: port_open(port) or proc.poll() is not None, 30, "gunicorn to listen")
    except AssertionError:
        proc.kill()
        raise
    assert proc.poll() is None, "gunicorn exited at start"
    return proc


class Subprocesses:
    """Subprocesses a test started, each with its stderr in a file; killed at the end."""

    def __init__(self) -> None:
        self.procs: list[Any] = []  # subprocess.Popen, or preforked.Forked (read the same way)

    def stderr(self, proc: subprocess.Popen[bytes]) -> str:
        return Path(proc.stderr_path).read_text(errors="replace")  # type: ignore[attr-defined]

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)  # a stopped one would not die
                proc.kill()
            proc.wait(10)


def stop(proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
