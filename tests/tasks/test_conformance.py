"""The django.tasks contract as the framework states it (Django 6.1's documentation and its
own ``tests/tasks``, django-tasks-db's backend tests), written here against
``feishu_inbox.tasks.LedgerBackend``: what code written for the framework relies on (issue
30). Both databases, both Django lines (6's ``django.tasks``, 5.2's backport).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from feishu_inbox.tasks import InvalidLedgerTask
from feishu_inbox.tasks.framework import framework
from tests.support import worker_tasks as t
from tests.support.outages import database_away
from tests.support.processes import ROOT, subprocess_env, wait_for
from tests.tasks.test_tasks import _log_in_tmp, run_worker

fw = framework()
Status = fw.TaskResultStatus
#: The framework's logger: django.tasks on Django 6, django_tasks for the backport.
LOGGER = "django.tasks" if fw.package == "django.tasks" else "django_tasks"

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["_log_in_tmp"]  # the tasks' log in the test's directory (an autouse fixture)


@pytest.fixture
def signals() -> Iterator[list[tuple[str, Any]]]:
    """(signal name, a copy of its task result's status and id) for each signal sent."""
    sent: list[tuple[str, Any]] = []

    def receiver(name: str) -> Any:
        def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
            sent.append((name, task_result.status, task_result.id, sender))

        return receive

    receivers = {name: receiver(name) for name in ("enqueued", "started", "finished")}
    for name, fn in receivers.items():
        getattr(fw, f"task_{name}").connect(fn, weak=False)
    try:
        yield sent
    finally:
        for name, fn in receivers.items():
            getattr(fw, f"task_{name}").disconnect(fn)


# --- 1. enqueue() gives back what get_result() reads -------------------------------------------


def test_the_enqueued_result_is_the_stored_one() -> None:
    backend = fw.task_backends["default"]
    result = t.add.enqueue(1, 2)
    assert backend.get_result(result.id) == result
    assert t.add.get_result(result.id) == result
    before = (result.status, result.enqueued_at, result.args)
    result.refresh()  # nothing changed: refresh changes nothing
    assert (result.status, result.enqueued_at, result.args) == before
    deferred = t.add.using(priority=10).enqueue(3, 4)  # three statements in a transaction
    assert backend.get_result(deferred.id) == deferred


# --- 2. arguments that are not JSON -------------------------------------------------------------


def test_arguments_that_are_not_json_raise_type_error_as_the_frameworks_backends_do() -> None:
    with pytest.raises(TypeError, match="Unsupported type") as refused:
        t.echo.enqueue(object())
    assert isinstance(refused.value, fw.InvalidTask) and isinstance(
        refused.value, InvalidLedgerTask
    )
    assert "not JSON serializable" in str(refused.value)

    async def enqueue() -> None:
        await t.echo.aenqueue(key={1, 2})

    import asyncio

    with pytest.raises(TypeError):
        asyncio.run(enqueue())


def test_a_return_value_that_is_not_json_says_so_in_the_words_users_search_for() -> None:
    result = t.returns_object.enqueue()
    run_worker()
    result.refresh()
    [error] = result.errors
    assert error.exception_class is TypeError
    assert "is not JSON serializable" in error.traceback
    assert "Unsupported type" in error.traceback


# --- 3. signals and the framework's log records -------------------------------------------------


def test_the_worker_sends_task_started_and_task_finished(
    signals: list[tuple[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    ok, failed = t.add.enqueue(2, 2), t.fail.enqueue("kaboom")
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    run_worker()
    by_id: dict[str, list[tuple[str, Any]]] = {}
    for name, status, result_id, sender in signals:
        by_id.setdefault(result_id, []).append((name, status))
        assert sender is type(fw.task_backends["default"])
    assert by_id[ok.id] == [
        ("enqueued", Status.READY),
        ("started", Status.RUNNING),
        ("finished", Status.SUCCESSFUL),
    ]
    assert by_id[failed.id] == [
        ("enqueued", Status.READY),
        ("started", Status.RUNNING),
        ("finished", Status.FAILED),
    ]
    records = [r for r in caplog.records if r.name == LOGGER]
    lines = [(r.levelno, r.getMessage()) for r in records]
    assert (logging.INFO, f"Task id={ok.id} path={ok.task.module_path} state=RUNNING") in lines
    assert (
        logging.INFO,
        f"Task id={ok.id} path={ok.task.module_path} state=SUCCESSFUL",
    ) in lines
    [error] = [r for r in records if r.levelno == logging.ERROR]
    assert error.getMessage().endswith("state=FAILED") and failed.id in error.getMessage()
    assert error.exc_info is not None and error.exc_info[0] is ValueError  # the traceback


def test_a_retried_failure_finishes_once_when_it_succeeds(
    signals: list[tuple[str, Any]],
) -> None:
    result = t.flaky.enqueue("once", 1)  # fails, then is retried after 0.1 s

    def finished() -> list[Any]:
        return [s for s in signals if s[0] == "finished" and s[2] == result.id]

    deadline = time.monotonic() + 30
    while not finished() and time.monotonic() < deadline:
        run_worker()  # a burst run each time the retry may be due: a condition, polled
    assert [s[1] for s in finished()] == [Status.SUCCESSFUL]
    assert [s[1] for s in signals if s[0] == "started" and s[2] == result.id] == [
        Status.RUNNING,
        Status.RUNNING,
    ]
    assert t.flaky.get_result(result.id).return_value == "once after 2"


# --- 4. a burst run leaves nothing behind -------------------------------------------------------


def open_connections() -> int:
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        return int(cur.fetchone()[0])


def test_call_command_runworker_burst_leaves_no_thread_and_no_connection() -> None:
    t.add.enqueue(1, 1)
    run_worker("--concurrency", "4")  # the first run may import and warm up
    threads, connections_open = threading.active_count(), open_connections()
    for n in range(3):
        t.add.enqueue(n, n)
        t.async_add.enqueue(n, n)
        t.async_effect.enqueue(n)  # its effect's writes open connections on executor threads
        run_worker("--concurrency", "4")
    assert threading.active_count() <= threads, [th.name for th in threading.enumerate()]
    # A backend leaves pg_stat_activity only once it has exited, a moment after its client
    # closed it: a connection still open at the end would stay, one closed is gone soon.
    wait_for(lambda: open_connections() <= connections_open, 10, "the closed connections' ends")


# --- 5. a burst run gives up on an unreachable database -----------------------------------------


@pytest.mark.stops_postgres
def test_runworker_burst_exits_with_an_error_when_the_database_stays_away() -> None:
    t.add.enqueue(1, 1)
    with database_away():
        started = time.monotonic()
        proc = subprocess.run(
            # (--skip-checks: Django's own start-up checks query SQLite too, and fail first)
            [
                sys.executable,
                "manage.py",
                "runworker",
                "--burst",
                "--database-patience",
                "2",
                "--skip-checks",
            ],
            cwd=ROOT,
            # SQLite's busy timeout is how long one claim waits on the lock before it fails
            env=subprocess_env(LOG_LEVEL="INFO", SQLITE_BUSY_TIMEOUT="1"),
            capture_output=True,
            timeout=120,
        )
        took = time.monotonic() - started
    stderr = proc.stderr.decode()
    assert proc.returncode != 0, stderr
    assert "gave up: the database was unreachable for 2s" in stderr
    assert took < 30, took  # a bounded wait, not forever


def test_the_patience_must_be_positive() -> None:
    with pytest.raises(CommandError, match="--database-patience"):
        call_command("runworker", "--burst", "--database-patience", "0")


# --- 6. get_result's round trips ----------------------------------------------------------------


def test_get_result_is_one_query_before_a_task_runs_and_two_after() -> None:
    backend = fw.task_backends["default"]
    result = t.add.enqueue(20, 22)
    with CaptureQueriesContext(connection) as ready:
        backend.get_result(result.id)
    assert len(ready.captured_queries) == 1
    run_worker()
    with CaptureQueriesContext(connection) as done:
        got = backend.get_result(result.id)
    assert len(done.captured_queries) == 2
    assert got.return_value == 42 and got.status == Status.SUCCESSFUL
