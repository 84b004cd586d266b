"""A worker that ignores SIGTERM, running a handler that never returns: the hang that the
per-test timeout must cut (``tests/site/test_hung_tests.py``), as a past bug hung a worker.

Importing this module (``apps.ready``, on the worker's main thread, before it starts any other
thread) blocks SIGTERM on that thread; every thread started afterwards inherits the mask, so a
SIGTERM stays pending for ever: the worker neither drains nor exits. Only SIGKILL ends it.
"""

from __future__ import annotations

import os
import signal
import threading

import feishu_inbox
from feishu_inbox import Event
from tests.support.worker_handlers import record

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


@feishu_inbox.handler("test.stuck")
def stuck(event: Event) -> None:
    record("stuck", event.event_id, os.getpid())
    threading.Event().wait()  # never set: the handler blocks until the process is killed
