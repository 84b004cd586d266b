"""The deploy gate inside ``migrate`` (SPEC §9i): a site's migration that makes a column NOT
NULL refuses (``backfill_pending``, with its fix, exit 1) until the backfill that fills the
column is applied, then applies; ``inbox backfills check`` fails until then. Real
``manage.py`` processes on a database of their own, with the app of ``tests/backfill_app``
(its column added nullable by 0001; 0002 is ``RequireBackfill`` then ``AlterField``)."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

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


def manage(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = subprocess_env(DJANGO_SETTINGS_MODULE="tests.support.settings_backfill_app")
    env["DATABASE_URL"] = url
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


def applied(url: str) -> list[str]:
    out = ok(manage(url, "showmigrations", "backfill_app"))
    return [line.split()[-1] for line in out.splitlines() if line.strip().startswith("[X]")]


@pytest.mark.timeout(600)
def test_migrate_refuses_the_not_null_migration_until_its_backfill_is_applied(
    site_database: str,
) -> None:
    url = site_database
    # Deploy 1: the nullable column, and rows without a value.
    ok(manage(url, "migrate", "backfill_app", "0001", "-v", "0"))
    shell(
        url,
        "from tests.backfill_app.models import Item; "
        "Item.objects.bulk_create([Item(value=None) for _ in range(50)])",
    )
    # Deploy 3 before deploy 2 is done: refused, nothing of 0002 applied.
    refused = manage(url, "migrate", "-v", "0")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "[backfill_pending]" in refused.stderr, refused.stderr
    assert "gate.fill_value" in refused.stderr and "inbox backfills start" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert applied(url) == ["0001_initial"]
    check = manage(url, "inbox", "backfills", "check")
    assert check.returncode == 1 and "gate.fill_value  pending" in check.stdout, check.stdout
    # Deploy 2: the backfill, run by a worker; a started one is still pending for migrate.
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
