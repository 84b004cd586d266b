"""The deploy gate inside ``migrate`` (SPEC §9i): a site's migration that makes a column NOT
NULL refuses (``backfill_pending``, with its fix, exit 1) until the backfill that fills the
column is applied, then applies; ``inbox backfills check`` fails until then, but not in the
deploy that ships the backfill ahead of that migration. Real ``manage.py`` processes on a
database of their own, with the app of ``tests/backfill_app`` (its column added nullable by
0001; 0002 is ``RequireBackfill`` then ``AlterField``; ``BACKFILL_APP_DEPLOY=2``: its code
without 0002). Then ``RequireBackfill`` in this process, as ``migrate`` runs it: on a second
database, under a router, over a table as an earlier migration state has it."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections, models
from django.db.migrations.state import ModelState, ProjectState
from django.test import override_settings
from django.utils import timezone

from feishu_inbox.backfills import BackfillPending, RequireBackfill
from feishu_inbox.tables.backfills import Backfill
from tests.support.backfill_cases import LaterRow
from tests.support.backfill_jobs import Row
from tests.support.processes import ROOT, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def site_database(tmp_path: Path) -> Iterator[str]:
    """A URL of an empty database for the site's processes (dropped at the end)."""
    if connection.vendor == "sqlite":
        yield f"sqlite:///{tmp_path / 'site.sqlite3'}"
        return
    name = f"fi_gate_{secrets.token_hex(4)}"
    with connection.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    db = connection.settings_dict
    try:
        host, port = db.get("HOST") or "127.0.0.1", db.get("PORT") or 5432
        yield f"postgres://{db['USER']}@{host}:{port}/{name}"
    finally:
        with connection.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def manage(url: str, *args: str, deploy: int = 3) -> subprocess.CompletedProcess[str]:
    env = subprocess_env(DJANGO_SETTINGS_MODULE="tests.support.settings_backfill_app")
    env["DATABASE_URL"] = url
    env["BACKFILL_APP_DEPLOY"] = str(deploy)
    env.pop("FEISHU_INBOX_HANDLERS", None)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def shell(url: str, code: str) -> str:
    """What ``code`` printed last (Django's shell says first what it imported)."""
    return ok(manage(url, "shell", "-c", code)).strip().splitlines()[-1]


def applied(url: str, deploy: int = 3) -> list[str]:
    out = ok(manage(url, "showmigrations", "backfill_app", deploy=deploy))
    return [line.split()[-1] for line in out.splitlines() if line.strip().startswith("[X]")]


@pytest.mark.timeout(600)
def test_migrate_refuses_the_not_null_migration_until_its_backfill_is_applied(
    site_database: str,
) -> None:
    url = site_database
    # A new database, nothing migrated (the ledger's tables neither): the gate lets it through.
    assert "gate.fill_value  pending" in ok(manage(url, "inbox", "backfills", "check"))
    # Deploy 1: the nullable column, and rows without a value.
    ok(manage(url, "migrate", "backfill_app", "0001", "-v", "0"))
    shell(
        url,
        "from tests.backfill_app.models import Item; "
        "Item.objects.bulk_create([Item(value=None) for _ in range(50)])",
    )
    # Deploy 2: the backfill's declaration ships, the migration that needs it not yet. The
    # deploy script's gate (check, then migrate) lets it through: nothing it migrates needs it.
    shipped = ok(manage(url, "inbox", "backfills", "check", deploy=2))
    assert "gate.fill_value  pending" in shipped and "holds back no migration to apply" in shipped
    ok(manage(url, "migrate", "-v", "0", deploy=2))
    assert applied(url, deploy=2) == ["0001_initial"]
    # Deploy 3 before the backfill is done: refused, nothing of 0002 applied.
    refused = manage(url, "migrate", "-v", "0")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "[backfill_pending]" in refused.stderr, refused.stderr
    assert "gate.fill_value" in refused.stderr and "inbox backfills start" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert applied(url) == ["0001_initial"]
    check = manage(url, "inbox", "backfills", "check")
    assert check.returncode == 1 and "gate.fill_value  pending" in check.stdout, check.stdout
    assert "backfill_app.0002_value_not_null" in check.stderr, check.stderr
    # The backfill, run by a worker; a started one is still pending for migrate.
    ok(manage(url, "inbox", "backfills", "start", "gate.fill_value"))
    assert "it is running" in manage(url, "migrate", "-v", "0").stderr
    ok(manage(url, "runworker", "--burst", "-v", "0"))
    assert "gate.fill_value  applied  50 of 50 rows" in ok(
        manage(url, "inbox", "backfills", "status", "gate.fill_value")
    )
    ok(manage(url, "inbox", "backfills", "check"))
    # Deploy 3 again: applied, and the column is NOT NULL.
    ok(manage(url, "migrate", "-v", "0"))
    assert applied(url) == ["0001_initial", "0002_value_not_null"]
    assert (
        shell(
            url,
            "from django.db import IntegrityError, transaction\n"
            "from tests.backfill_app.models import Item\n"
            "assert not Item.objects.filter(value=None).exists()\n"
            "assert sorted(Item.objects.values_list('value', flat=True))[0] == 1001\n"
            "try:\n"
            "    with transaction.atomic(): Item.objects.create(value=None)\n"
            "except IntegrityError: print('not null')",
        )
        == "not null"
    )
    # A database with nothing to fill (a new site, a test database) migrates straight through.
    ok(manage(url, "migrate", "backfill_app", "0001", "-v", "0"))
    shell(
        url,
        "from feishu_inbox.tables.backfills import Backfill\n"
        "from tests.backfill_app.models import Item\n"
        "Backfill.objects.all().delete(); Item.objects.all().delete()",
    )
    ok(manage(url, "migrate", "-v", "0"))
    assert applied(url) == ["0001_initial", "0002_value_not_null"]


def forwards(op: RequireBackfill, alias: str, state: ProjectState, app_label: str = "demo") -> None:
    """``op`` as ``migrate`` runs it on database ``alias``, the migration's state before it
    ``state``."""
    with connections[alias].schema_editor() as editor:
        op.database_forwards(app_label, editor, state, state)


class KeepsDemoOff:
    """A site's router: the demo app is not migrated on database ``alias``."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return False if (db, app_label) == (self.alias, "demo") else None


def test_the_gate_reads_the_ledger_where_it_is_and_passes_where_the_router_migrates_nothing(
    other_database: str,
) -> None:
    """The site's table on another database than the ledger: ``migrate --database other``
    reads the backfill's state in the ledger (there is none on ``other``), and passes on a
    database where the site's router does not migrate the app."""
    Row.objects.using(other_database).bulk_create([Row(label="to fill") for _ in range(5)])
    op, state = RequireBackfill("test.fill"), ProjectState()
    with pytest.raises(BackfillPending, match="never started"):
        forwards(op, other_database, state)
    Backfill.objects.create(name="test.fill", state="applied", started_at=timezone.now())
    forwards(op, other_database, state)  # applied, as the ledger says
    Backfill.objects.filter(name="test.fill").update(state="running")
    with pytest.raises(BackfillPending, match="it is running"):
        forwards(op, other_database, state)
    with override_settings(DATABASE_ROUTERS=[KeepsDemoOff(other_database)]):
        forwards(op, other_database, state)  # the migration changes nothing there
        with pytest.raises(BackfillPending, match="it is running"):
            forwards(op, "default", state)


@pytest.fixture
def later_table(table: Any) -> Iterator[ProjectState]:
    """``LaterRow``'s table as a migration state before its column ``filled`` has it."""
    state = ProjectState()
    state.add_model(
        ModelState(
            "demo",
            "LaterRow",
            [("id", models.BigAutoField(primary_key=True))],
            options={"db_table": LaterRow._meta.db_table},
        )
    )
    model = state.apps.get_model("demo", "LaterRow")
    with connection.schema_editor() as editor:
        editor.create_model(model)
    try:
        yield state
    finally:
        with connection.schema_editor() as editor:
            editor.delete_model(model)


def test_the_gate_reads_the_table_as_the_migration_state_has_it(later_table: ProjectState) -> None:
    """A new database migrated from zero: the declared queryset names a column a later
    migration adds, so only the state's model can say the table has nothing to fill."""
    op = RequireBackfill("test.fill_later")
    forwards(op, "default", later_table)  # an empty table: nothing to fill
    later_table.apps.get_model("demo", "LaterRow").objects.create()
    with pytest.raises(BackfillPending, match="never started"):
        forwards(op, "default", later_table)
