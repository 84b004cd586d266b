"""The database made to go away for a while, as a test's stimulus: PostgreSQL stopped (the
whole cluster, as a failover or restart does) or the SQLite file locked by another process."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from django.db import connection

from tests.support.private_postgres import pg_ctl


@contextmanager
def postgresql_stopped() -> Iterator[None]:
    """The cluster stopped: every database on it, those of other pytest-xdist processes too.
    A test that stops it carries ``@pytest.mark.stops_postgres``; ``make test`` runs those on a
    cluster of their own (``tests.support.private_postgres``), in one process."""
    if os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") != "1":
        raise AssertionError(
            "this test stops the PostgreSQL cluster, which would fail the tests of the other "
            "pytest-xdist processes: run `pytest -m stops_postgres` without -n (make "
            "test-postgres-outages does), and mark the test @pytest.mark.stops_postgres"
        )
    connection.close()
    _cluster("stop")
    try:
        yield
    finally:
        _cluster("start")


def _cluster(verb: str) -> None:
    """Stop or start the test database's cluster: the private one ``make test`` made, or the
    machine's own (Debian's layout), for ``pytest -m stops_postgres`` run by hand."""
    private = os.environ.get("FEISHU_INBOX_TEST_PGDATA")
    if private:
        log = ["-l", str(Path(private).parent / "server.log")]
        pg_ctl(Path(private), *(["-m", "fast", "stop"] if verb == "stop" else [*log, "start"]))
        return
    cluster = sorted(Path("/etc/postgresql").iterdir())[-1].name
    command = ["pg_ctlcluster", "--skip-systemctl-redirect", cluster, "main", verb]
    subprocess.run([*command, *(["-m", "fast"] if verb == "stop" else [])], check=True, timeout=60)


@contextmanager
def sqlite_locked() -> Iterator[None]:
    """Another process's write lock on the database file, held past the busy timeout."""
    with closing(sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)) as db:
        db.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            db.execute("ROLLBACK")


def frozen_outside_a_write(pid: int, timeout: float = 30.0) -> None:
    """SIGSTOP a process at a moment it is inside no transaction on the test database. A
    worker frozen inside one (a lease renewal, its heartbeat row) would hold what it wrote
    for good: on SQLite the file's write lock, every other writer locked out; on PostgreSQL
    the rows of its job and chat, which the next owner's lease sweep then skips. A test of
    a paused worker is about neither. The test's own connection must be the only other."""
    deadline = time.monotonic() + timeout
    while True:
        os.kill(pid, signal.SIGSTOP)
        if not _a_transaction_open():
            return
        os.kill(pid, signal.SIGCONT)  # caught inside one: let it end it, then again
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} stayed inside a transaction for {timeout}s")


def _a_transaction_open() -> bool:
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
            )
            return bool(cur.fetchone()[0])
    path = connection.settings_dict["NAME"]
    with closing(sqlite3.connect(path, isolation_level=None, timeout=0.05)) as db:
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:  # "database is locked": a writer holds it
            return True
        db.execute("ROLLBACK")
        return False


@contextmanager
def database_away() -> Iterator[None]:
    """The test database, whichever it is, unavailable to other processes."""
    with postgresql_stopped() if connection.vendor == "postgresql" else sqlite_locked():
        yield
