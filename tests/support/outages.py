"""The database made to go away for a while, as a test's stimulus: PostgreSQL stopped (the
whole cluster, as a failover or restart does) or the SQLite file locked by another process."""

from __future__ import annotations

import os
import sqlite3
import subprocess
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


@contextmanager
def database_away() -> Iterator[None]:
    """The test database, whichever it is, unavailable to other processes."""
    with postgresql_stopped() if connection.vendor == "postgresql" else sqlite_locked():
        yield
