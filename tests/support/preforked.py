"""``manage.py`` commands for the tests, forked from a process that has imported their libraries.

A worker's start costs ~0.5 s of CPU in imports (Django, psycopg), and 3 s more when it sends
through Feishu's SDK: ``import lark_oapi`` loads ~10,500 modules, and ``runworker`` imports it
before its first claim whenever an app has credentials. The suites start a few hundred workers
on a 2-core machine, several dozen of them with credentials, and those imports were a quarter
of the suites' CPU. So ``start`` forks each command from a multiprocessing forkserver (one per
pytest process) that imported those libraries once (``tests.support.preloaded``), before any
settings exist.

Each command is still a process of its own, started as ``python manage.py ARGS`` would be: its
own environment, working directory and stderr file, ``manage.py``'s ``main`` with the test's
argv, its own settings, ``django.setup()``, handlers, database connections and signal handlers.
SIGKILL, SIGTERM and SIGSTOP reach it as they reach any process, and its exit status reads as
``subprocess``'s does (``-9`` after a SIGKILL). Nothing of the site is imported before the fork:
not Django's settings or apps, not feishu_inbox, not prometheus_client (it reads its environment
when imported).

The plain start, imports and all, stays covered by the tests that run ``python manage.py``
themselves (``tests/runtime/test_runworker_logging.py``, the burst and conformance tests, the
CLI and install tests). ``FEISHU_INBOX_TEST_PREFORK=0`` starts every command plainly.

What differs from a plain start, and no test depends on: the children share the forkserver's
hash seed (a plain start draws its own); an uncaught exception is printed by multiprocessing
(``Process ForkServerProcess-N:`` above the traceback) and exits 1, a KeyboardInterrupt too.
Run pytest from the project's directory (``make`` does): the forkserver imports the preload
from there, and ``python -m pytest`` (not the ``pytest`` script, which each child would import
again as its main module).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import threading
import weakref
from pathlib import Path

from tests.support.processes import ROOT

#: What the forkserver imports once: libraries only, none that reads settings or the
#: environment when imported.
PRELOAD = "tests.support.preloaded"

_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload([PRELOAD])


def start(args: list[str], env: dict[str, str], stderr: Path) -> subprocess.Popen[bytes] | Forked:
    """``python manage.py ARGS`` in the project's directory with ``env``; its stdout discarded,
    its stderr in the file ``stderr`` (``proc.stderr_path``)."""
    if os.environ.get("FEISHU_INBOX_TEST_PREFORK", "1") != "0":
        return Forked(args, env, ROOT, stderr)
    with open(stderr, "wb") as err:  # the child keeps its own fd
        proc = subprocess.Popen(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    proc.stderr_path = stderr  # type: ignore[attr-defined]
    return proc


class Forked:
    """A forked ``manage.py`` command, read and signalled as a ``subprocess.Popen`` is."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path, stderr: Path) -> None:
        self.args = args
        self.stderr_path = stderr
        stderr.write_bytes(b"")  # there at once, as the Popen's file is
        self._process = _context.Process(
            target=_run, args=(args, env, str(cwd), str(stderr)), daemon=False
        )
        self._process.start()
        assert self._process.pid is not None
        self.pid: int = self._process.pid
        _started.add(self)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None:
            self._process.join(timeout)
            if self.poll() is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            # The forkserver reaps it, not this process: between its waitpid and the exit code
            # reaching us the pid is gone (a Popen's zombie kept it), as Popen ignores too.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_started: weakref.WeakSet[Forked] = weakref.WeakSet()


@atexit.register  # before multiprocessing's own exit, which joins its live children unbounded
def _kill_the_left() -> None:
    """A command a test left running (a teardown that failed) is killed when pytest exits; a
    Popen one would be orphaned, a multiprocessing child would hold pytest's exit forever."""
    for proc in list(_started):
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def _run(args: list[str], env: dict[str, str], cwd: str, stderr: str) -> None:
    """In the forked child: become ``python manage.py ARGS`` run in ``cwd`` with ``env``."""
    os.chdir(cwd)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    err = os.open(stderr, os.O_WRONLY | os.O_APPEND)
    os.dup2(err, 2)
    os.close(devnull)
    os.close(err)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["manage.py", *args]
    sys.path[0] = cwd  # the script's directory, as `python manage.py` puts it first
    # lark_oapi's import sets an event loop on the main thread; the forkserver's is shared
    # with every sibling (one epoll instance across forks): this process gets its own.
    asyncio.set_event_loop(asyncio.new_event_loop())
    try:
        runpy.run_path(os.path.join(cwd, "manage.py"), run_name="__main__")
    finally:
        # What the interpreter's exit does, in its order (multiprocessing's exit skips atexit):
        # wait for the threads that are not daemons, then run the atexit functions.
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
