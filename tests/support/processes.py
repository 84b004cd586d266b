"""Real processes for tests: the demo under gunicorn, ``manage.py runworker``; condition waits;
what the current test started, so that its failure shows their logs (``tests/conftest.py``)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


#: How many lines of each process's log a failure shows (the last ones).
LOG_LINES = 60


@dataclass
class Waiting:
    """The condition wait in progress on this thread: what for, since when, what it saw last."""

    what: str
    timeout: float
    started: float
    last: object = None
    cut_after: float = 0.0


_waiting = threading.local()


def waiting_now() -> Waiting | None:
    """The condition wait this thread is in, if any."""
    return getattr(_waiting, "current", None)


#: A condition wait polls at once, then every 10 ms, the interval growing to 100 ms: a wait
#: of seconds polls ~10 times a second, not 100 (a condition is often a few queries on a new
#: connection: at 10 ms, the suites' waiting tests alone kept a core busy), and what ends
#: within a few polls is seen within 10-20 ms.
POLL_FIRST, POLL_GROWTH, POLL_LONGEST = 0.01, 1.25, 0.1


def wait_for(
    condition: Callable[[], object],
    timeout: float = 10.0,
    what: str = "",
    seen: Callable[[], object] | None = None,
) -> None:
    """Poll ``condition`` until it is true; fail after ``timeout`` seconds, saying what it
    waited for and what it saw last: ``seen()`` when given (read once, at the end), else the
    condition's last value when that says more than False (a count, a status, a list)."""
    now = time.monotonic()
    waiting = Waiting(what or getattr(condition, "__qualname__", repr(condition)), timeout, now)
    outer, _waiting.current = waiting_now(), waiting
    interval = POLL_FIRST
    try:
        while not (value := condition()):
            waiting.last = value
            if time.monotonic() > now + timeout:
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {waiting.what}; {saw(waiting, seen)}"
                )
            time.sleep(interval)  # the polling interval of a condition wait, not synchronisation
            interval = min(interval * POLL_GROWTH, POLL_LONGEST)
    except AssertionError:
        raise
    except BaseException:  # the per-test timeout (or Ctrl-C) cut the wait: its failure says so
        waiting.cut_after = time.monotonic() - now
        _waiting.cut = waiting
        raise
    finally:
        _waiting.current = outer


def cut_wait() -> Waiting | None:
    """The condition wait that something other than its own timeout ended last (forgotten
    once read), or None."""
    waiting, _waiting.cut = getattr(_waiting, "cut", None), None
    return waiting


def saw(waiting: Waiting, seen: Callable[[], object] | None = None) -> str:
    if seen is not None:
        try:
            last: object = seen()
        except Exception as exc:  # the failure to say is the timeout, not this
            last = f"(seen() raised {exc!r})"
    else:
        last = waiting.last
    text = last if isinstance(last, str) else repr(last)
    if len(text) > 2000:
        text = text[:1000] + " … " + text[-1000:]
    return f"saw last: {text}"


@dataclass
class Started:
    """A process (or an in-process fake) the current test started, and how to read its log."""

    name: str
    read: Callable[[], str]
    proc: Any = None  # a subprocess.Popen or preforked.Forked: killed after the test if alive
    #: Whether SIGUSR1 dumps its threads' stacks (runworker, feishu_connect): another process
    #: may use the signal for something else (gunicorn reopens its logs, PgBouncer pauses).
    dumps: bool = False


_started: list[Started] = []


def started(name: str, read: Callable[[], str], proc: Any = None, dumps: bool = False) -> None:
    """Register what the current test started: its failure shows the end of ``read()``, and a
    ``proc`` still alive when the test's teardown is over is killed before the next test."""
    _started.append(Started(name, read, proc, dumps))


def log_file(path: Path) -> Callable[[], str]:
    return lambda: path.read_text(errors="replace") if path.exists() else "(no log file)"


def tail(text: str, lines: int = LOG_LINES) -> str:
    kept = text.splitlines()
    cut = f"[… {len(kept) - lines} earlier lines]\n" if len(kept) > lines else ""
    return cut + "\n".join(kept[-lines:])


def proc_status(pid: int, field: str) -> str:
    """A field of ``/proc/PID/status`` (Linux), "" when the process is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""
    for line in status.splitlines():
        if line.startswith(f"{field}:"):
            return line.split(":", 1)[1].strip()
    return ""


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler of its own for ``signum`` (SigCgt)."""
    caught = proc_status(pid, "SigCgt")
    return bool(caught) and bool(int(caught, 16) >> (signum - 1) & 1)


def dump_stacks(timeout: float = 5.0) -> dict[int, tuple[int, str]]:
    """Ask each live process the test started that dumps its threads' stacks on SIGUSR1 (a
    worker, a connector: ``feishu_inbox.runtime.interrupts``) to do so, and wait until each
    dump is in its log: a failure then shows where a process that did nothing was. By index in
    ``_started``: (where its log was when asked, the dump)."""
    asked: dict[int, tuple[int, int]] = {}
    for index, each in enumerate(_started):
        proc = each.proc
        if not each.dumps or proc is None or proc.poll() is not None:
            continue
        if not catches(proc.pid, signal.SIGUSR1):  # (not yet: the signal would kill it)
            continue
        size = len(each.read())
        threads = min(int(proc_status(proc.pid, "Threads") or 1), 100)  # (faulthandler's cap)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGUSR1)
            asked[index] = (size, threads)
    deadline = time.monotonic() + timeout
    dumps = {}
    for index, (size, threads) in asked.items():
        each = _started[index]
        # every thread's heading written (a thread that ended meanwhile: until the deadline)
        while each.read()[size:].count(STACK_MARK) < threads and time.monotonic() < deadline:
            if each.proc.poll() is not None:
                break
            time.sleep(0.05)  # the polling interval of a condition wait
        dumps[index] = (size, stacks_in(each.read()[size:]))
    return dumps


def stacks_in(text: str, most: int = 400) -> str:
    """faulthandler's lines in a log's text (the process logged on while it dumped), at most
    ``most`` of them."""
    kept = [
        line
        for line in text.splitlines()
        if line.startswith(("Thread 0x", "Current thread 0x", "  File ", "  <"))
    ]
    cut = f"\n[… {len(kept) - most} more lines]" if len(kept) > most else ""
    return "\n".join(kept[:most]) + cut


#: faulthandler's heading of each thread's stack.
STACK_MARK = "(most recent call first)"


def started_logs() -> list[tuple[str, str]]:
    """(section title, the log's last lines) of each thing the current test started; a live
    worker or connector adds its threads' stacks (``dump_stacks``)."""
    dumps = dump_stacks()
    sections = []
    for index, each in enumerate(_started):
        try:
            text = each.read()
            if index in dumps:
                text = text[: dumps[index][0]]
            text = tail(text)
        except Exception as exc:  # a log that cannot be read says so, it hides no other
            text = f"(could not read it: {exc!r})"
        state = ""
        if each.proc is not None:
            code = each.proc.poll()
            state = f", pid {each.proc.pid}, " + ("running" if code is None else f"exit {code}")
        sections.append((f"log of {each.name}{state} (last {LOG_LINES} lines)", text or "(empty)"))
        if index in dumps:
            sections.append((f"threads of {each.name} when the test failed", dumps[index][1]))
    return sections


def end_started() -> list[str]:
    """After a test: SIGKILL (after SIGCONT: a stopped one would not die) what it started and
    left alive, wait for each, forget them all; the names of those that were left alive."""
    alive = [each for each in _started if each.proc is not None and each.proc.poll() is None]
    for each in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each.proc.pid, signal.SIGCONT)
        each.proc.kill()
    for each in alive:
        with contextlib.suppress(subprocess.TimeoutExpired):
            each.proc.wait(30)
    _started.clear()
    return [f"{each.name} (pid {each.proc.pid})" for each in alive]


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
    """A subprocess's environment: the test's database, reached as the suite's topology says
    (``FEISHU_INBOX_TEST_TOPOLOGY``: directly, or through PgBouncer, ``pgbouncer.py``)."""
    from tests.support.pgbouncer import topology, topology_env

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    url = subprocess_database_url()
    env.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="project.settings")
    env.update(topology_env(url, topology()))
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
    """gunicorn on ``port``, listening; its stderr is the test's (pytest shows it on failure)."""
    proc = gunicorn(port, env=subprocess_env(**env))
    started(f"gunicorn :{port}", lambda: "(its stderr is the test's captured stderr)", proc)
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

    def add(self, proc: Any, name: str, dumps: bool = False) -> None:
        """One more process of this test's, its stderr in ``proc.stderr_path``; ``dumps``: it
        writes its threads' stacks there on SIGUSR1."""
        self.procs.append(proc)
        started(name, log_file(Path(proc.stderr_path)), proc, dumps)

    def stop_all(self) -> None:
        """SIGKILL every one still running (a SIGTERM could be ignored), then wait for each."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)  # a stopped one would not die
                proc.kill()
        for proc in self.procs:
            proc.wait(30)


def stop(proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
