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
from typing import Any

#: A worker process silent for ``timeout`` seconds (stuck: the webhook answers in milliseconds)
#: is killed and restarted. Idle keep-alive connections close after ``keepalive``. On SIGTERM,
#: requests in flight get ``graceful_timeout``. None of these frees a thread that a slow client
#: holds while it sends its body byte by byte: in production, put a buffering reverse proxy in
#: front (docs/production.md).
timeout = 30
graceful_timeout = 10
keepalive = 5


def worker_int(worker: Any) -> None:
    """gunicorn calls this on the worker's SIGINT or SIGQUIT, in its signal handler, before it
    exits. It writes its line straight to the file descriptor and ends the process: inside a
    signal handler, a logging call could wait on a lock that a request thread holds."""
    os.write(2, f"[{os.getpid()}] Worker exiting at once on Ctrl-C\n".encode())
    os._exit(0)
