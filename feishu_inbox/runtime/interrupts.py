"""SIGTERM and SIGINT for a worker: acted on by a thread of their own, never in the handler.

Python runs a signal handler on the main thread between two of its bytecodes, wherever that
thread is: inside a ``with lock:`` block too. ``threading.Event``'s ``set``, ``clear`` and
``wait`` hold their condition's lock, which is not reentrant, and the worker's main thread calls
them all the time; a handler that sets an event (or logs, or takes any other lock) while the
main thread holds that lock waits for itself for ever: the worker stops claiming and never
exits. The handler here does only what is safe anywhere: it writes the signal's number to a
pipe. A thread blocked on the pipe's other end calls ``on_signal`` for it, as ordinary code.

A second signal ends the process at once, from the handler (``os._exit``: no lock either).

SIGUSR1 writes the stack of every thread to stderr and changes nothing (``faulthandler``, in C:
no lock, no Python code runs): ``kill -USR1 PID`` shows where a worker that seems stuck is.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

#: The signals that ask a worker to stop.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: The signal that dumps every thread's stack to stderr, the process running on.
DUMP_SIGNAL = signal.SIGUSR1
#: Written to the pipe to end the relay's thread (no signal has the number 0).
_END = b"\0"


class SignalRelay:
    """While installed, SIGTERM and SIGINT call ``on_signal(signum)`` on the relay's thread."""

    def __init__(self, on_signal: Callable[[int], None], second_signal_message: bytes) -> None:
        self._on_signal = on_signal
        self._message = second_signal_message
        self._received = 0
        self._previous: dict[int, Any] = {}
        self._pipe: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self._dumps = False

    def install(self) -> None:
        """Take over the stop signals (only the main thread can; elsewhere, nothing)."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._pipe = os.pipe()
        self._thread = threading.Thread(target=self._relay, name="feishu-signals", daemon=True)
        self._thread.start()
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        self._dumps = dump_stacks_on_signal()

    def restore(self) -> None:
        """Give the signals back to their previous handlers and end the relay's thread."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if self._dumps:
            faulthandler.unregister(DUMP_SIGNAL)
            self._dumps = False
        self._previous.clear()
        if self._pipe is None or self._thread is None:
            return
        read, write = self._pipe
        os.write(write, _END)
        self._thread.join()
        os.close(read)
        os.close(write)
        self._pipe = self._thread = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._received += 1
        if self._received > 1:
            os.write(2, self._message)
            os._exit(1)
        assert self._pipe is not None
        os.write(self._pipe[1], bytes([signum]))

    def _relay(self) -> None:
        assert self._pipe is not None
        read = self._pipe[0]
        while True:
            got = os.read(read, 1)
            if not got or got == _END:
                return
            self._on_signal(got[0])


def dump_stacks_on_signal() -> bool:
    """From now on, ``DUMP_SIGNAL`` writes every thread's stack to stderr; whether it does
    (only the main thread can register it, and only a stderr that is a file: not one a test
    runner captures in memory)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return False
    faulthandler.register(DUMP_SIGNAL, all_threads=True, chain=False)
    return True
