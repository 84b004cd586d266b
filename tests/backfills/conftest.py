from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection, connections
from django.db.utils import load_backend

from tests.conftest import is_postgres
from tests.support import backfill_jobs

#: The alias of ``other_database``, and its schema on PostgreSQL.
OTHER, OTHER_SCHEMA = "other", "fi_other"


@pytest.fixture
def table(transactional_db: None) -> type[backfill_jobs.Row]:
    """The test table, created in the test database if it is not there yet (empty)."""
    backfill_jobs.make_table()
    return backfill_jobs.Row


@pytest.fixture(autouse=True)
def _media_in_tmp(settings: pytest.FixtureRequest, tmp_path: object) -> None:
    """The default storage writes under the test's own folder, never the checkout's."""
    settings.MEDIA_ROOT = str(tmp_path)  # type: ignore[attr-defined]


@pytest.fixture
def other_database(table: type[backfill_jobs.Row], tmp_path: Path) -> Iterator[str]:
    """A second database alias (this thread's connection only), with the test table in it,
    empty, and no ledger: on SQLite a file of its own; on PostgreSQL the test database seen
    through a schema of its own (its ``search_path``)."""
    conf = copy.deepcopy(connection.settings_dict)
    if is_postgres():
        with connection.cursor() as cur:
            cur.execute(f"CREATE SCHEMA {OTHER_SCHEMA}")
        conf["OPTIONS"] = {**conf.get("OPTIONS", {}), "options": f"-c search_path={OTHER_SCHEMA}"}
    else:
        conf["NAME"] = str(tmp_path / "other.sqlite3")
    other = load_backend(conf["ENGINE"]).DatabaseWrapper(conf, OTHER)
    connections[OTHER] = other
    try:
        with other.schema_editor() as editor:
            editor.create_model(backfill_jobs.Row)
        yield OTHER
    finally:
        other.close()
        del connections[OTHER]
        if is_postgres():
            with connection.cursor() as cur:
                cur.execute(f"DROP SCHEMA {OTHER_SCHEMA} CASCADE")
