"""gunicorn settings for ``manage.py rundemo`` (``--config python:project.demo.serving``).

Ctrl-C in a terminal sends SIGINT to gunicorn's master and its worker processes at once:
gunicorn's quick shutdown. Its threaded (gthread) worker then raises ``SystemExit`` on its
main thread, and the interpreter's exit waits for every request thread. A thread that holds a
connection which has sent nothing yet, as a browser's spare connection is, waits up to five
seconds for its first byte; on a busy machine the master's graceful timeout runs out first and
it logs ``Worker ... was sent SIGKILL! Perhaps out of memory?``. A quick shutdown is meant to
drop what is in flight, so the worker process ends at once here: a webhook delivery cut off
before its answer was not acknowledged, and Feishu delivers it again (the event is stored once
either way). SIGTERM keeps gunicorn's graceful shutdown.
"""

from __future__ import annotations

import os
import signal
from typing import Any

#: A worker process silent for ``timeout`` seconds (stuck: the webhook answers in milliseconds)
#: is killed and restarted. Idle keep-alive connections close after ``keepalive``. On SIGTERM,
#: requests in flight get ``graceful_timeout``. None of these frees a thread that a slow client
#: holds while it sends its body byte by byte: in production, put a buffering reverse proxy in
#: front (docs/production.md).
timeout = 30
graceful_timeout = 10
keepalive = 5


def _exit_at_once(signum: int = 0, frame: Any = None) -> None:
    """Write the line straight to the file descriptor and end the process, taking no lock: a
    signal handler runs on the main thread between two of its instructions, so a lock that
    thread (or a request thread) holds would never be released."""
    os.write(2, f"[{os.getpid()}] Worker exiting at once on Ctrl-C\n".encode())
    os._exit(0)


def post_worker_init(worker: Any) -> None:
    """Once the worker has booted, SIGINT (Ctrl-C) and SIGQUIT (the master's quick shutdown)
    end it at once. gthread's own handler first shuts its thread pool down, under the pool's
    lock (not reentrant), before it calls ``worker_int``. Ctrl-C that came while the main
    thread was handing an accepted connection to the pool (inside that lock), or the master's
    SIGQUIT inside the SIGINT handler, deadlocked the worker until the master's SIGKILL after
    ``graceful_timeout``. Seen once in the suite: 10.5 s to stop."""
    for signum in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, _exit_at_once)


def worker_int(worker: Any) -> None:
    """gunicorn calls this on SIGINT or SIGQUIT that came while the worker was still booting
    (its own handler then), before it exits."""
    _exit_at_once()
