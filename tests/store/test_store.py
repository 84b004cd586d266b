"""The store layer: its query files, the choice of store, and the stored-function migrations."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from feishu_inbox.store import store
from feishu_inbox.store.postgres import PostgresStore
from feishu_inbox.store.queries import QueryFileError, load, parse_query_file, render
from feishu_inbox.store.schema import JOB_TABLE, SQL_NAMES
from feishu_inbox.store.sqlite import SqliteStore
from tests.support.ledger_helpers import catalog_texts

PACKAGE = Path(__file__).resolve().parents[2] / "feishu_inbox"
STORES = {"postgres.sql": PostgresStore, "sqlite.sql": SqliteStore}


def names(filename: str) -> dict[str, str]:
    """Query name → description, of one file as written (no common.sql)."""
    text = (PACKAGE / "store" / filename).read_text()
    every_name = {**SQL_NAMES, **SqliteStore.list_parameters}
    parsed = parse_query_file(text, source=filename, names=every_name)
    return {q.name: q.description for q in parsed.values()}


def test_both_databases_load_every_query_and_no_placeholder_is_left() -> None:
    for filename, cls in STORES.items():
        queries = load(filename, tuple(sorted(cls.list_parameters.items())))
        for query in queries.values():
            assert not re.search(r"\{[a-z_]+\}", query.sql), (filename, query.name)
            assert query.description, (filename, query.name)


def test_a_query_on_one_database_only_says_so() -> None:
    """The two files hold what differs under the same names; the rest says why it is alone."""
    postgres, sqlite = names("postgres.sql"), names("sqlite.sql")
    for alone, mine, theirs in (
        (set(postgres) - set(sqlite), postgres, "PostgreSQL"),
        (set(sqlite) - set(postgres), sqlite, "SQLite"),
    ):
        for name in alone:
            assert f"Only on {theirs}" in mine[name], name
    for name in set(postgres) & set(sqlite):
        assert "Differs from PostgreSQL" in sqlite[name] or "The same as" in sqlite[name], name


def test_common_queries_are_not_redefined_by_a_database() -> None:
    common = set(names("common.sql"))
    assert common.isdisjoint(names("postgres.sql"))
    assert common.isdisjoint(names("sqlite.sql"))


def test_every_query_the_code_names_exists_for_the_store_that_runs_it() -> None:
    """A query named in Python (rows/row/execute("name")) exists where that code runs."""
    shared = _named_queries(PACKAGE / "store" / "base.py")
    for filename, cls in STORES.items():
        queries = load(filename, tuple(sorted(cls.list_parameters.items())))
        own = _named_queries(PACKAGE / "store" / filename.replace(".sql", ".py"))
        missing = (shared | own) - set(queries)
        assert not missing, (filename, missing)
    transitions = {"run_again", "mark_done", "expire_unknown"}
    assert transitions <= set(names("common.sql"))


def _named_queries(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("rows", "row", "execute")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value)
    return found


def test_malformed_query_files_are_refused_with_the_reason() -> None:
    with pytest.raises(QueryFileError, match="unknown placeholder"):
        render("SELECT * FROM {jobs}", source="x.sql")
    with pytest.raises(QueryFileError, match="defined twice"):
        parse_query_file("-- a --\n-- one\nSELECT 1\n-- a --\n-- two\nSELECT 2\n")
    with pytest.raises(QueryFileError, match="needs a description"):
        parse_query_file("-- a --\nSELECT 1\n")


def test_comment_lines_are_for_readers_not_sent() -> None:
    [query] = parse_query_file(
        "-- a --\n-- what it does\nSELECT 1\n-- why this line\n  -- and this\nFROM {job}\n"
    ).values()
    assert query.description == "what it does"
    assert query.sql == "SELECT 1\nFROM feishu_inbox_eventjob"


def test_no_module_outside_the_store_names_a_database() -> None:
    """Only the store chooses by vendor (and migrations, which load the store's files)."""
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(("store/", "migrations/")):
            continue
        text = path.read_text()
        for needle in ("vendor ==", '"postgresql"', '"sqlite"', "sqlite3"):
            assert needle not in text, (relative, needle)


@pytest.mark.django_db
def test_the_store_is_chosen_once_per_vendor() -> None:
    chosen = store()
    assert chosen is store()
    assert isinstance(chosen, PostgresStore if connection.vendor == "postgresql" else SqliteStore)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("postgres_only")
def test_stored_function_migrations_go_back_and_forth() -> None:
    """0002, 0005, 0010, 0012, 0013, 0014, 0015, 0024, 0027, 0028, 0029, 0034, 0039 and 0040 load
    their function files; migrating back drops them (or restores their earlier versions),
    forward again creates them, and the ledger works after the round trip."""

    def functions() -> set[str]:
        with connection.cursor() as cur:
            cur.execute("SELECT proname FROM pg_proc WHERE proname LIKE 'feishu_inbox_%%'")
            return {r[0] for r in cur.fetchall()}

    expected = {
        "feishu_inbox_enqueue",
        "feishu_inbox_claim",
        "feishu_inbox_end_attempt",
        "feishu_inbox_now_plus",
        "feishu_inbox_claim_prefixed",
        "feishu_inbox_finish_together",
        "feishu_inbox_finish_batch",
        "feishu_inbox_end_attempts",
        "feishu_inbox_job_check",
        "feishu_inbox_partition_check",
        "feishu_inbox_member_moved",
        "feishu_inbox_claim_fair",
    }
    row_checks = {"feishu_inbox_job_check", "feishu_inbox_partition_check"}

    def check_constraints() -> int:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_constraint WHERE contype = 'c' AND conrelid IN "
                "('feishu_inbox_eventjob'::regclass, 'feishu_inbox_partition'::regclass)"
            )
            return int(cur.fetchone()[0])

    def arguments(function: str) -> int:
        with connection.cursor() as cur:
            cur.execute("SELECT pronargs FROM pg_proc WHERE proname = %s", [function])
            [(count,)] = cur.fetchall()  # one version: never an overload left behind
            return int(count)

    def finish_together_arguments() -> int:
        return arguments("feishu_inbox_finish_together")

    def claim_prefixed_arguments() -> int:
        return arguments("feishu_inbox_claim_prefixed")

    def body_of(function: str) -> str:
        with connection.cursor() as cur:
            cur.execute("SELECT prosrc FROM pg_proc WHERE proname = %s", [function])
            [(body,)] = cur.fetchall()
            return str(body)

    def end_attempt_merged() -> bool:
        """0015: the job's update and its history row are one statement."""
        with connection.cursor() as cur:
            cur.execute("SELECT prosrc FROM pg_proc WHERE proname = 'feishu_inbox_end_attempt'")
            [(body,)] = cur.fetchall()
            return "WITH ended AS (UPDATE" in body

    def finish_batch_in_sets() -> bool:
        """0028: a batch's finishes through feishu_inbox_end_attempts (three statements), not
        feishu_inbox_end_attempt each."""
        with connection.cursor() as cur:
            cur.execute("SELECT prosrc FROM pg_proc WHERE proname = 'feishu_inbox_finish_batch'")
            [(body,)] = cur.fetchall()
            return "feishu_inbox_end_attempt(" not in body and "end_attempts(" in body

    def claim_settings() -> list[str] | None:
        with connection.cursor() as cur:
            cur.execute("SELECT proconfig FROM pg_proc WHERE proname = 'feishu_inbox_claim'")
            [(settings,)] = cur.fetchall()
            return settings  # type: ignore[no-any-return]

    def end_attempts_settings() -> list[str] | None:
        with connection.cursor() as cur:
            cur.execute("SELECT proconfig FROM pg_proc WHERE proname = 'feishu_inbox_end_attempts'")
            [(settings,)] = cur.fetchall()
            return settings  # type: ignore[no-any-return]

    forbidden = ["enable_sort=off", "enable_seqscan=off"]  # 0013: the claim reads its index
    generic = ["plan_cache_mode=force_generic_plan"]  # 0028; 0029 adds enable_seqscan=off
    assert functions() == expected and finish_together_arguments() == 9  # 0024: excluding
    assert claim_prefixed_arguments() == 6
    assert claim_settings() == forbidden
    assert check_constraints() == 0  # 0014: row triggers instead
    assert end_attempt_merged() and finish_batch_in_sets()
    assert end_attempts_settings() == [*generic, "enable_seqscan=off"]
    assert "feishu_inbox_claim_fair(" in body_of("feishu_inbox_claim")  # 0039: fair claims
    assert "RECURSIVE ring" in body_of("feishu_inbox_claim_fair")  # 0040: a bounded ring
    try:
        call_command("migrate", "feishu_inbox", "0039", verbosity=0)
        assert functions() == expected and "RECURSIVE tenants" in body_of("feishu_inbox_claim_fair")
        call_command("migrate", "feishu_inbox", "0038", verbosity=0)
        expected -= {"feishu_inbox_claim_fair"}  # new in 0039
        assert functions() == expected and claim_settings() == forbidden
        assert "claim_fair" not in body_of("feishu_inbox_claim")
        assert "head_tenant" not in body_of("feishu_inbox_end_attempt")
        assert "head_tenant" not in body_of("feishu_inbox_end_attempts")
        assert "head_tenant" not in body_of("feishu_inbox_enqueue")
        call_command("migrate", "feishu_inbox", "0033", verbosity=0)
        expected -= {"feishu_inbox_member_moved"}  # new in 0034: the workflows' trigger
        assert functions() == expected
        call_command("migrate", "feishu_inbox", "0028", verbosity=0)
        assert end_attempts_settings() == generic and finish_batch_in_sets()
        call_command("migrate", "feishu_inbox", "0027", verbosity=0)
        expected -= {"feishu_inbox_end_attempts"}  # new in 0028
        assert functions() == expected and not finish_batch_in_sets()  # 0027's again
        call_command("migrate", "feishu_inbox", "0026", verbosity=0)
        expected -= {"feishu_inbox_finish_batch"}  # new in 0027
        assert functions() == expected and finish_together_arguments() == 9
        call_command("migrate", "feishu_inbox", "0023", verbosity=0)
        assert finish_together_arguments() == 8 and claim_prefixed_arguments() == 5  # 0013's
        assert functions() == expected and end_attempt_merged()
        call_command("migrate", "feishu_inbox", "0014", verbosity=0)
        assert not end_attempt_merged()
        call_command("migrate", "feishu_inbox", "0013", verbosity=0)
        assert functions() == expected - row_checks and check_constraints() == 7
        call_command("migrate", "feishu_inbox", "0012", verbosity=0)
        expected -= row_checks
        assert functions() == expected and finish_together_arguments() == 7
        assert claim_settings() is None
        call_command("migrate", "feishu_inbox", "0009", verbosity=0)
        new = {"feishu_inbox_claim_prefixed", "feishu_inbox_finish_together"}
        assert functions() == expected - new
        call_command("migrate", "feishu_inbox", "0004", verbosity=0)
        assert functions() == expected - new - {"feishu_inbox_now_plus"}
        call_command("migrate", "feishu_inbox", "0001", verbosity=0)
        assert functions() == set()
    finally:
        call_command("migrate", "feishu_inbox", verbosity=0)
    expected |= {"feishu_inbox_finish_batch", "feishu_inbox_end_attempts"}
    expected |= {"feishu_inbox_member_moved"}
    expected |= {"feishu_inbox_claim_fair"}
    assert functions() == expected | row_checks and claim_settings() == forbidden
    assert "head_tenant" in body_of("feishu_inbox_end_attempts")
    assert check_constraints() == 0 and end_attempt_merged() and finish_batch_in_sets()
    assert end_attempts_settings() == [*generic, "enable_seqscan=off"]
    assert finish_together_arguments() == 9 and claim_prefixed_arguments() == 6
    with connection.cursor() as cur:  # what a process of the version before still sends
        cur.execute(  # (a rolling deploy): the new arguments have defaults
            "SELECT job_id FROM feishu_inbox_enqueue('default', 'old', 't', 'old', 'old-p', "
            "FALSE, '{}'::jsonb, NULL)"
        )
        cur.execute("SELECT id FROM feishu_inbox_claim_prefixed('w', 't', 60, 1, ARRAY['old-'])")
        [(claimed,)] = cur.fetchall()
        cur.execute(
            "SELECT feishu_inbox_end_attempt(%s, 'w', 't', 'old-p', FALSE, '', '', 0, 0)",
            [claimed],
        )
        assert cur.fetchone()[0] == "completed"
    from feishu_inbox import ledger

    ledger.enqueue(event_id="e", event_type="t", partition_key="p", payload={})
    [job] = ledger.claim("w")
    ledger.renew(job.lease)
    assert ledger.finish(job.lease) == "completed"


#: What a running job's own updates change (renew; begin_effect and end_effect; record_step's
#: first step): in no index of the job table, so each of those updates can be HOT (written in
#: the row's page, with no new index entry) while the job runs.
RUNNING_JOB_COLUMNS = (
    "lease_until",
    "effects_in_flight",
    "side_effect_started",
    "effect_uncertain",
    "idempotent_effect",
    "idempotent_since",
    "idempotent_until",
    "idempotent_window",
    "has_steps",
)


@pytest.mark.django_db
def test_no_index_of_the_job_table_names_what_a_running_jobs_updates_change() -> None:
    """An index naming a column, as a key or in its predicate, makes every update of that
    column write a new entry in every index of the table. A new index on one of these would
    make each heartbeat and effect of a long job cost as much as its claim (migration 0016)."""
    if connection.vendor == "postgresql":
        query = "SELECT indexdef FROM pg_indexes WHERE tablename = %s"
    else:
        query = "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = %s"
    definitions = catalog_texts(query, [JOB_TABLE])
    assert any("partition_key" in d for d in definitions), definitions  # the catalog was read
    for definition in definitions:
        named = set(re.findall(r"\w+", definition)) & set(RUNNING_JOB_COLUMNS)
        assert not named, f"{definition} names {named}"


@pytest.mark.django_db(transaction=True)
def test_a_new_sqlite_connection_behind_a_busy_writer_still_knows_it_has_json() -> None:
    """Django probes SQLite's JSON support in a transaction, which IMMEDIATE makes take the
    write lock: behind a writer that held it past the busy timeout, the probe failed and read
    as "no JSON", and a worker started under load was refused (fields.E180 on every
    JSONField; without the store's probe this test fails so, after the busy timeout). The
    store probes outside a transaction, which needs no lock: whether the wrapper connects first
    or the probe is the first thing to touch it (as the system checks at a worker's start are,
    and where a probe set on each new connection was overwritten by Django's own)."""
    import sqlite3

    from django.db import connections

    if connection.vendor != "sqlite":
        pytest.skip("SQLite's probe")
    writer = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another process's write transaction, held
    try:
        for connect_first in (False, True):
            fresh = connections.create_connection("default")
            if connect_first:
                fresh.ensure_connection()
            assert fresh.features.supports_json_field is True
            assert fresh.features.has_json_object_function is True
            fresh.close()
    finally:
        writer.execute("ROLLBACK")
        writer.close()
