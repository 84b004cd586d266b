"""PostgreSQL's fast path for the hot statements (store/postgres.py ``_fast``).

In autocommit (the worker's and the webhook's statements) enqueue, claim and the end of an
attempt run on libpq directly, prepared once per connection under their own names; inside a
transaction, with queries logged or with execute wrappers they go through Django's cursor.
Either way the results and the errors are the same.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from django.db import DataError, OperationalError, connection, transaction
from django.test import override_settings

from feishu_inbox import ledger
from feishu_inbox.errors import LeaseLost
from feishu_inbox.models import EventJob
from feishu_inbox.runtime.finishing import finish_together
from feishu_inbox.runtime.writes import TRANSIENT_ERRORS
from tests.support.processes import subprocess_database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("postgres_only")]


@pytest.fixture(autouse=True)
def fresh_connection() -> Iterator[None]:
    connection.close()  # nothing prepared yet
    yield
    connection.close()


def prepared() -> set[str]:
    """Our statements prepared on this connection (read without preparing anything)."""
    with connection.cursor() as cur:
        cur.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'feishu_inbox_%%'")
        return {r[0] for r in cur.fetchall()}


def enqueue(i: int) -> int:
    return ledger.enqueue(
        event_id=f"e{i}", event_type="t", partition_key="c", payload={"i": i}
    ).job_id


def test_the_hot_statements_are_prepared_once_under_their_names_and_answer_as_before() -> None:
    first, second = enqueue(1), enqueue(2)
    assert second > first
    assert ledger.enqueue(event_id="e1", event_type="t", partition_key="c", payload={}) == (
        ledger.EnqueueResult(job_id=first, created=False)  # a duplicate, found
    )
    [job] = ledger.claim("w")
    assert (job.id, job.payload, job.lease.attempt) == (first, {"i": 1}, 1)
    assert job.lease_until.tzinfo is not None  # loaded as Django loads it: aware
    status, [nxt] = ledger.finish_and_claim(job.lease, limit=1)
    assert (status, nxt.id) == ("completed", second)
    assert prepared() == {
        "feishu_inbox_enqueue",
        "feishu_inbox_claim",
        "feishu_inbox_finish_and_claim",
    }
    stale = ledger.Lease(nxt.id, "w", "not-the-token", "c", 1)
    with pytest.raises(LeaseLost):  # fenced: nothing changed, nothing claimed
        ledger.finish_and_claim(stale, limit=1)
    assert EventJob.objects.get(id=second).status == "running"


def test_arrays_and_odd_keys_go_through_as_psycopg_would_send_them() -> None:
    """finish_together and a queue worker's claim send arrays: keys with the characters an
    array literal quotes (comma, quotes, braces, backslash, spaces) arrive whole."""
    keys = ["a,b", 'q"uote', "{brace}", "back\\slash", "sp ace", "NULL"]
    for i, key in enumerate(keys):
        for j in range(2):
            ledger.enqueue(event_id=f"e{i}-{j}", event_type="t", partition_key=key, payload={})
    running = ledger.claim("w", limit=len(keys), keys=ledger.KeyFilter(tuple(keys)))
    assert sorted(job.lease.partition_key for job in running) == sorted(keys)
    ended = finish_together([(job.lease, "", f"next{n}") for n, job in enumerate(running)])
    assert [status for status, _ in ended] == ["completed"] * len(keys)
    nexts = [jobs[0] for _, jobs in ended]
    assert [job.lease.partition_key for job in nexts] == [j.lease.partition_key for j in running]
    assert "feishu_inbox_finish_together" in prepared()


def test_every_fast_statement_prepares_untyped() -> None:
    """The fast path prepares without parameter types: the server must infer every one."""
    from feishu_inbox.store import store
    from feishu_inbox.store.postgres import PREPARED

    statements = store()._statements  # type: ignore[attr-defined]
    assert set(statements) == PREPARED
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    for statement in statements.values():
        done = pgconn.prepare(b"probe_" + statement.name, statement.sql)
        assert done.status == psycopg.pq.ExecStatus.COMMAND_OK, (
            statement.name,
            done.get_error_message("utf-8"),
        )


def test_statements_deallocated_behind_its_back_are_prepared_again() -> None:
    enqueue(1)
    with connection.cursor() as cur:
        cur.execute("DEALLOCATE ALL")  # as psycopg does after a rollback, or DISCARD ALL
    assert prepared() == set()
    enqueue(2)
    assert prepared() == {"feishu_inbox_enqueue"}
    assert EventJob.objects.count() == 2


def test_a_statement_already_prepared_under_its_name_is_used() -> None:
    """A session that lost track of what it prepared (its record is per connection object)
    finds the statement there and runs it."""
    enqueue(1)
    del connection._feishu_inbox_session  # type: ignore[attr-defined]
    enqueue(2)
    assert prepared() == {"feishu_inbox_enqueue"}
    assert EventJob.objects.count() == 2


def test_a_new_connection_prepares_them_again() -> None:
    enqueue(1)
    connection.close()
    enqueue(2)
    assert prepared() == {"feishu_inbox_enqueue"}


def test_a_statement_error_is_djangos_and_the_connection_goes_on() -> None:
    with pytest.raises(DataError, match="json"):
        ledger.enqueue(
            event_id="bad", event_type="t", partition_key="c", payload={}, payload_json="{not json"
        )
    assert not EventJob.objects.exists()  # nothing stored
    enqueue(1)
    assert EventJob.objects.count() == 1


def test_a_value_psycopg_cannot_send_is_a_data_error() -> None:
    """A NUL in a text value is refused by psycopg before it is sent: a DataError (the
    webhook's 400), as through Django's cursor, and nothing is stored."""
    with pytest.raises(DataError):
        ledger.enqueue(event_id="e\x00", event_type="t", partition_key="c", payload={})
    assert not EventJob.objects.exists()
    enqueue(1)


def test_a_statement_waiting_on_a_lock_can_be_interrupted_and_is_cancelled() -> None:
    """The wait is psycopg's, in slices: a signal's handler runs while a hot statement waits
    (runworker's second SIGTERM exits at once), and the interrupted query is cancelled. The
    signal is a real SIGINT sent to the main thread, as Ctrl-C or a supervisor sends it."""
    # Python's own handler, whatever the suite inherited: a process started in the background
    # by a non-interactive shell (CI's, often) begins with SIGINT ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupt_a_statement_waiting_on_a_lock()
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_a_statement_waiting_on_a_lock() -> None:
    enqueue(1)  # the partition row exists
    # holds the chat's partition row, as an enqueue does
    blocker = psycopg.connect(subprocess_database_url())
    blocker.execute("SELECT 1 FROM feishu_inbox_partition WHERE key = 'c' FOR UPDATE")
    me = connection.connection.info.backend_pid
    main = threading.main_thread().ident
    assert main is not None
    interrupted, returned = threading.Event(), threading.Event()
    seen: list[object] = []  # what the watcher read of this session, for a failure's message

    def interrupt_when_waiting() -> None:
        with psycopg.connect(subprocess_database_url(), autocommit=True) as watch:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not interrupted.is_set():
                seen[:] = watch.execute(
                    "SELECT wait_event_type, wait_event, state FROM pg_stat_activity "
                    "WHERE pid = %s",
                    (me,),
                ).fetchall()
                if seen and seen[0][0] == "Lock":  # type: ignore[index]
                    interrupted.set()
                    signal.pthread_kill(main, signal.SIGINT)
                else:
                    time.sleep(0.01)  # polling pg_stat_activity until the wait shows
        # Never hang the suite: a wait that cannot be interrupted ends when the lock goes
        # (and the test fails on the stored job).
        if not returned.wait(5):
            blocker.rollback()

    watcher = threading.Thread(target=interrupt_when_waiting)
    watcher.start()
    raised = False
    try:
        enqueue(2)
    except KeyboardInterrupt:
        raised = True
    finally:
        returned.set()
        watcher.join()
        blocker.rollback()
        blocker.close()
    assert interrupted.is_set(), f"the statement never waited on the lock: {seen}"
    assert raised, "SIGINT arrived while the statement waited, but it went on to the end"
    connection.close()  # as after any interrupted query
    assert EventJob.objects.count() == 1  # cancelled: nothing of it stored
    enqueue(3)


def test_a_connection_lost_mid_call_is_a_blink_the_worker_retries() -> None:
    enqueue(1)
    pid = connection.connection.info.backend_pid
    with psycopg.connect(subprocess_database_url(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(OperationalError) as caught:
        enqueue(2)
    assert isinstance(caught.value, TRANSIENT_ERRORS)
    connection.close()  # as writes.drop_connection does
    enqueue(2)
    assert EventJob.objects.count() == 2


def test_inside_a_transaction_it_goes_through_django_and_rolls_back_with_it() -> None:
    with transaction.atomic():
        enqueue(1)
        assert prepared() == set()  # not the fast path: psycopg prepares its own
        transaction.set_rollback(True)
    assert not EventJob.objects.exists()
    enqueue(2)
    assert prepared() == {"feishu_inbox_enqueue"}


@override_settings(FEISHU_INBOX={"PREPARE_STATEMENTS": False})
def test_nothing_is_prepared_when_the_site_says_so() -> None:
    enqueue(1)
    [job] = ledger.claim("w")
    assert ledger.finish(job.lease) == "completed"
    assert prepared() == set()
