from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection, connections

from .worker_helpers import Workers


def pytest_configure(config: pytest.Config) -> None:
    # Under CI the suite runs once per database; a PostgreSQL run that cannot reach its server
    # must fail loudly, never pass by skipping.
    url = os.environ.get("DATABASE_URL", "")
    if os.environ.get("CI") and url.startswith("postgres"):
        import psycopg

        try:
            psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", connect_timeout=5).close()
        except psycopg.OperationalError as exc:
            raise pytest.UsageError(f"CI=true and PostgreSQL is unreachable: {exc}") from exc


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


@pytest.fixture
def postgres_only() -> None:
    if not is_postgres():
        pytest.skip("needs PostgreSQL (run the suite with DATABASE_URL=postgres://…)")


@pytest.fixture
def close_thread_connections() -> Iterator[None]:
    yield
    connections.close_all()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    w = Workers(tmp_path)
    try:
        yield w
    finally:
        w.stop_all()
