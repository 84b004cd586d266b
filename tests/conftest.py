from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections
from django.test import override_settings

from tests.support import processes
from tests.support.fake_feishu import FakeFeishu
from tests.support.worker_helpers import Workers


def _remove_stale_sqlite_test_database(settings: Any) -> None:
    """A run that was killed leaves its SQLite test database's -wal and -shm files behind;
    ``--create-db`` removes the database file but not them, and the new database beside an old
    shared-memory file fails with "disk I/O error" in every test of the next run. Remove all
    of this process's (its xdist suffix, as pytest-django names it) before it is made."""
    database = settings.DATABASES["default"]
    name = str(database.get("TEST", {}).get("NAME") or "")
    in_memory = name == ":memory:" or "mode=memory" in name
    if "sqlite" not in database["ENGINE"] or not name or in_memory:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        name = f"{name}_{worker}"
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(name + suffix)


def pytest_configure(config: pytest.Config) -> None:
    # Django's advice for test settings: hash the tests' passwords with a fast hasher. The
    # default's 1,000,000 PBKDF2 rounds cost ~0.3 s of CPU per user made, and the admin tests
    # and fuzzers make hundreds (each fuzz example makes its operator again in its rolled-back
    # transaction). Every hasher of the defaults still verifies what a subprocess made.
    from django.conf import global_settings, settings

    settings.PASSWORD_HASHERS = [
        "django.contrib.auth.hashers.MD5PasswordHasher",
        *global_settings.PASSWORD_HASHERS,
    ]
    _flush_what_tests_wrote()
    _remove_stale_sqlite_test_database(settings)
    # Under CI the suite runs once per database; a PostgreSQL run that cannot reach its server
    # must fail loudly, never pass by skipping.
    url = os.environ.get("DATABASE_URL", "")
    if os.environ.get("CI") and url.startswith("postgres"):
        import psycopg

        try:
            psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", connect_timeout=5).close()
        except psycopg.OperationalError as exc:
            raise pytest.UsageError(f"CI=true and PostgreSQL is unreachable: {exc}") from exc


#: Rows no test writes, that Django's post_migrate makes again after each flush: a flush that
#: leaves them makes post_migrate find them all (a few reads) instead of writing them again.
KEPT_BY_FLUSH = frozenset({"django_content_type", "auth_permission"})
#: A table with more rows than this is truncated, not deleted from (the query plan tests fill
#: 300,000 rows; every other test writes a few).
DELETE_AT_MOST = 1000


def _flush_what_tests_wrote() -> None:
    """The flush after each transactional test (``transaction=True``: every test with worker
    subprocesses) empties the tables that tests write, as Django's does, only cheaper.

    Django's flush on PostgreSQL TRUNCATEs every table: each table and index gets a new file,
    0.3-0.5 s per test on this machine, ~200 times per suite. A DELETE of a few rows is
    milliseconds (Django's foreign keys are deferred, so the order does not matter; the ledger's
    triggers fire on INSERT and UPDATE only). A table with many rows is still truncated. On
    SQLite Django's flush already DELETEs. Either way, leaving the content types and
    permissions spares post_migrate writing them again; the database a test starts from is
    the same."""
    from django.db import connection

    ops = type(connection.ops)
    django_flush = ops.sql_flush

    def sql_flush(
        self: Any,
        style: Any,
        tables: Any,
        *,
        reset_sequences: bool = False,
        allow_cascade: bool = False,
    ) -> list[str]:
        tables = [table for table in tables if table not in KEPT_BY_FLUSH]
        if self.connection.vendor != "postgresql" or reset_sequences or not tables:
            return django_flush(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        with self.connection.cursor() as cur:
            big = []
            for table in tables:
                cur.execute(
                    f"SELECT 1 FROM {self.quote_name(table)} OFFSET {DELETE_AT_MOST} LIMIT 1"
                )
                if cur.fetchone():
                    big.append(table)
        truncate = django_flush(self, style, big, allow_cascade=True) if big else []
        return truncate + [
            f"DELETE FROM {self.quote_name(table)};" for table in tables if table not in big
        ]

    ops.sql_flush = sql_flush  # type: ignore[method-assign]


#: What gives a test the test database: a test that asks for one of these, or is marked
#: ``django_db``, is no ``any_database`` test.
DATABASE_FIXTURES = frozenset(
    {
        "db",
        "transactional_db",
        "django_db_reset_sequences",
        "django_db_serialized_rollback",
        "live_server",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """An ``any_database`` test runs in the SQLite suite only: one that uses the test database
    would drop its PostgreSQL run unseen, so such a mark is refused before anything runs."""
    wrong = [
        item.nodeid
        for item in items
        if item.get_closest_marker("any_database")
        and (
            item.get_closest_marker("django_db")
            or DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))
        )
    ]
    if wrong:
        raise pytest.UsageError(
            "marked any_database but uses the test database (remove the mark): " + ", ".join(wrong)
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failure says why without a rerun: the last lines of the log of every process (worker,
    connector, server, Prometheus) and fake the test started, and the condition wait that the
    per-test timeout cut, if any. After its teardown, what the test left running is killed
    (SIGKILL: a process that ignores SIGTERM too) before the next test starts."""
    report: pytest.TestReport = yield
    if report.failed:
        cut = processes.cut_wait()
        if cut is not None:
            report.sections.append(
                (
                    "the condition wait that was cut",
                    f"waiting for {cut.what}, cut after {cut.cut_after:.1f}s of its own timeout "
                    f"{cut.timeout}s; {processes.saw(cut)}",
                )
            )
        for title, text in processes.started_logs():
            report.sections.append((title, text))
    if report.when == "teardown":
        left = processes.end_started()
        if left:
            report.sections.append(("killed after the test", "still running: " + ", ".join(left)))
    return report


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
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Schedules (and their handlers) declared by a test are forgotten after it."""
    from feishu_inbox import schedules
    from feishu_inbox.ledger import retry
    from feishu_inbox.runtime import registry

    monkeypatch.setattr(schedules, "_declared", {})
    monkeypatch.setattr(schedules, "_problems", [])
    monkeypatch.setattr(registry, "_registry", {k: list(v) for k, v in registry._registry.items()})
    monkeypatch.setattr(registry, "_problems", list(registry._problems))
    monkeypatch.setattr(registry, "_timeouts", dict(registry._timeouts))
    monkeypatch.setattr(retry, "_policies", dict(retry._policies))
    yield


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    w = Workers(tmp_path)
    try:
        yield w
    finally:
        w.stop_all()


@pytest.fixture(scope="session", autouse=True)
def _no_connection_left_at_the_end(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """The live server's request threads are daemons that Django does not join: one may still
    hold its connection when the session drops the PostgreSQL test database. End them then
    (once, at the end: a sweep between tests could end a connection a test still uses)."""
    yield
    if connection.vendor == "postgresql":
        with django_db_blocker.unblock(), connection.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )


@pytest.fixture
def fake_feishu() -> Iterator[FakeFeishu]:
    """A running fake of Feishu's Open API, and settings whose apps "bot" and "other" use it.

    Each test gets fresh app ids: the SDK caches tokens per app id for the whole process.
    """
    from feishu_inbox.feishu import openapi

    ids = {name: f"cli_{name}_{secrets.token_hex(6)}" for name in ("bot", "other")}
    with FakeFeishu(apps={app_id: f"secret-{app_id}" for app_id in ids.values()}) as fake:
        apps = {
            name: {"APP_ID": app_id, "APP_SECRET": f"secret-{app_id}", "DOMAIN": fake.url}
            for name, app_id in ids.items()
        }
        with override_settings(FEISHU_INBOX={"APPS": apps}):
            try:
                yield fake
            finally:
                openapi.forget_clients()


@pytest.fixture
def fake_ws() -> Iterator[Any]:
    """A running fake of Feishu's long-connection endpoint with two apps, cli_a and cli_b; an
    event not ACKed with code 200 within 1 s is delivered again every half second."""
    from tests.support.fake_feishu_ws import FakeLongConnection

    fake = FakeLongConnection(
        {"cli_a": "secret-a", "cli_b": "secret-b"},
        client_config={"PingInterval": 1},
        ack_timeout=1.0,
        redeliver_after=(0.5,) * 60,
    )
    with fake:
        yield fake


@pytest.fixture
def connectors(tmp_path: Path) -> Iterator[Any]:
    from tests.support.connect_helpers import Connectors

    c = Connectors(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()
