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


@contextmanager
def postgresql_stopped() -> Iterator[None]:
    """The cluster stopped: every database on it, those of other pytest-xdist processes too.
    A test that stops it carries ``@pytest.mark.stops_postgres`` and runs in a process alone."""
    if os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") != "1":
        raise AssertionError(
            "this test stops the PostgreSQL cluster, which would fail the tests of the other "
            "pytest-xdist processes: run `pytest -m stops_postgres` without -n (make test-postgres "
            "does), and mark the test @pytest.mark.stops_postgres"
        )
    cluster = sorted(Path("/etc/postgresql").iterdir())[-1].name
    command = ["pg_ctlcluster", "--skip-systemctl-redirect", cluster, "main"]
    connection.close()
    subprocess.run([*command, "stop", "-m", "fast"], check=True, timeout=60)
    try:
        yield
    finally:
        subprocess.run([*command, "start"], check=True, timeout=60)


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
