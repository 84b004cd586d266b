"""A hung test is cut by the per-test timeout (pytest-timeout, ``timeout_method = "signal"``),
never by CI's limit: its failure shows the stack and the logs of the processes it started (and
where each thread of a worker was), the process is killed before the next test, and the rest of
the suite runs and reports.

The proof runs pytest on a generated module, in a subprocess, as the suites run it (on a
pytest-xdist process): its first test starts a real ``manage.py runworker`` that ignores
SIGTERM (``tests.support.stubborn_handlers``), gives it a job whose handler never returns, and
waits for the worker to exit after a SIGTERM, which it never does."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.processes import ROOT, subprocess_env, wait_for

pytestmark = pytest.mark.any_database

#: The inner run's per-test timeout: long enough for a worker to start on a loaded machine
#: (under the stress hog a plain start takes up to ~10 s), short enough for this test.
INNER_TIMEOUT = 45

HUNG_MODULE = """
import os

import pytest

from tests.support.processes import stop, wait_for
from tests.support.worker_helpers import enqueue

started = []


@pytest.mark.django_db(transaction=True)
def test_waits_for_a_worker_that_ignores_sigterm(workers):
    proc = workers.start(
        "--concurrency", "1", FEISHU_INBOX_HANDLERS="tests.support.stubborn_handlers"
    )
    started.append(proc.pid)
    enqueue("evt-stuck", [], event_type="test.stuck")
    wait_for(lambda: workers.lines("stuck"), 120, "the stuck handler to start")
    stop(proc, timeout=3600)  # SIGTERM, then a wait for an exit that never comes


def test_the_next_test_runs_and_the_worker_is_gone():
    assert len(started) == 1
    try:
        state = open(f"/proc/{started[0]}/stat").read().split(")")[-1].split()[0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z"), state
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_hung_test_is_cut_with_its_stack_and_its_workers_log(tmp_path: Path) -> None:
    module = tmp_path / "test_hung.py"
    module.write_text(textwrap.dedent(HUNG_MODULE))
    # The suite's fixtures and hooks (workers, the logs of what a test started) apply to it.
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    env = subprocess_env(
        FEISHU_INBOX_READ_DOTENV="0",
        # A plain `python manage.py runworker`: a child of the inner pytest, so one that
        # survived it would be an orphan still alive, which this test looks for.
        FEISHU_INBOX_TEST_PREFORK="0",
        SQLITE_TEST_NAME=str(tmp_path / "inner.sqlite3"),
    )
    env.pop("DATABASE_URL")
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    command += ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), "-n", "1"]
    command += ["--timeout", str(INNER_TIMEOUT), "-v", str(module)]
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=INNER_TIMEOUT * 5
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out  # one test failed, none errored out of pytest
    # Cut by the per-test timeout, with the stack of where it hung: in stop(), after SIGTERM.
    assert f"Failed: Timeout (>{float(INNER_TIMEOUT)}s)" in out, out
    assert "~ Stack of " in out, out  # pytest-timeout's dump of the test's other threads
    assert re.search(r"in stop\n.*proc\.wait\(timeout\)", out), out
    # The worker's log, attached to the failure: it was running (SIGTERM ignored) and started.
    section = re.search(r"log of worker-0 \(runworker .*\), pid (\d+), running \(last 60", out)
    assert section, out
    assert "INFO feishu_inbox.worker worker" in out and "started: concurrency 1" in out, out
    # And where each of its threads was (SIGUSR1: faulthandler's dump): the handler, waiting.
    assert re.search(r"threads of worker-0 \(runworker .*\) when the test failed", out), out
    assert re.search(r'stubborn_handlers\.py", line \d+ in stuck', out), out
    # The rest of the run ran and reported, and no worker is left.
    assert re.search(r"PASSED .*test_the_next_test_runs_and_the_worker_is_gone", out), out
    assert "1 failed, 1 passed" in out, out
    pid = int(section.group(1))
    status = Path(f"/proc/{pid}/status")
    wait_for(lambda: not alive(pid), 30, f"worker {pid} to be gone", seen=status.read_text)
