"""Configuration is typed, read lazily, and misconfiguration is caught by system checks."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from feishu_inbox.conf import checked_settings, inbox_settings, openapi_base_url
from feishu_inbox.errors import ConfigurationError

# Django 6.1's JSONField check asks SQLite whether it supports JSON: checks touch the database.
pytestmark = pytest.mark.django_db

APPS = {"default": {"VERIFICATION_TOKEN": "t"}}


def ids(**feishu_inbox: object) -> list[str]:
    with override_settings(FEISHU_INBOX={"APPS": APPS, **feishu_inbox}):
        return sorted(m.id for m in run_checks() if m.id and m.id.startswith("feishu_inbox"))


def test_defaults_are_valid_and_documented_values() -> None:
    conf = inbox_settings()
    assert (conf.MAX_ATTEMPTS, conf.COMPLETED_RETENTION, conf.UNKNOWN_RETENTION) == (
        5,
        timedelta(days=7),
        None,
    )
    assert ids() == []


def test_settings_are_read_at_use_time() -> None:
    with override_settings(FEISHU_INBOX={"MAX_ATTEMPTS": 9}):
        assert inbox_settings().MAX_ATTEMPTS == 9
    assert inbox_settings().MAX_ATTEMPTS == 5


@pytest.mark.parametrize(
    "bad",
    [
        {"COMPLETED_RETENTION": timedelta(hours=23)},
        {"UNKNOWN_RETENTION": timedelta(days=30)},  # with INTERRUPT_PRIVATE on (default)
        {"MAX_ATTEMPTS": 0},
        {"BACKOFF_JITTER": 2},
        {"LEASE_SECONDS": 0},
        # a store app's token margin past Feishu's 30 minutes: the same token fetched again
        # on every call until the old one's last 30 minutes
        {"STORE_TOKEN_MARGIN_SECONDS": 1800},
    ],
)
def test_invalid_combinations_are_errors(bad: dict[str, object]) -> None:
    assert ids(**bad) == ["feishu_inbox.E002"]
    with override_settings(FEISHU_INBOX={"APPS": APPS, **bad}), pytest.raises(ConfigurationError):
        checked_settings()


def test_expiring_unknowns_allowed_without_interruption() -> None:
    assert ids(UNKNOWN_RETENTION=timedelta(days=30), INTERRUPT_PRIVATE=False) == []


def test_unknown_key_and_wrong_type_are_reported() -> None:
    assert ids(MAX_ATEMPTS=3) == ["feishu_inbox.W001"]
    with override_settings(FEISHU_INBOX=["not", "a", "dict"]):
        assert [m.id for m in run_checks() if m.id == "feishu_inbox.E001"]


def test_sqlite_without_wal_and_immediate_is_warned() -> None:
    from django.db import connections

    db = connections["default"].settings_dict
    if db["ENGINE"] != "django.db.backends.sqlite3":
        pytest.skip("SQLite-only check")
    saved = db["OPTIONS"]
    db["OPTIONS"] = {}
    try:
        assert "feishu_inbox.W002" in [m.id for m in run_checks()]
    finally:
        db["OPTIONS"] = saved


def test_no_handler_registered_at_all_is_warned_w004() -> None:
    from feishu_inbox.runtime import registry

    saved = dict(registry._registry)
    try:
        registry._registry.clear()
        found = [m for m in run_checks() if m.id == "feishu_inbox.W004"]
        assert found and "feishu_handlers.py" in (found[0].hint or "")
    finally:
        registry._registry.update(saved)
    registry._registry.setdefault("t.any", []).append(lambda event: None)
    try:
        assert "feishu_inbox.W004" not in [m.id for m in run_checks()]
    finally:
        del registry._registry["t.any"]


# --- Open API credentials (APP_ID, APP_SECRET, DOMAIN) ----------------------------------------


def replying_app(**keys: object) -> dict[str, object]:
    return {"APPS": {"bot": {"VERIFICATION_TOKEN": "t", **keys}}}


def test_open_api_credentials_and_domains_are_accepted() -> None:
    import lark_oapi

    for domain in ("feishu", "lark", "Lark", "https://open.example.com/", "http://127.0.0.1:8123"):
        assert ids(**replying_app(APP_ID="cli_a", APP_SECRET="s", DOMAIN=domain)) == []
    assert openapi_base_url("feishu") == lark_oapi.FEISHU_DOMAIN
    assert openapi_base_url("lark") == lark_oapi.LARK_DOMAIN
    assert openapi_base_url("https://open.example.com/") == "https://open.example.com"


@pytest.mark.parametrize(
    ("domain", "why"),
    [
        ("larksuite", "must be"),
        ("http://open.example.com", "plain http"),
        ("https://open.example.com/open-apis", "without a path"),
        ("https://user:pw@open.example.com", "credentials"),
        ("https://open.example.com:port", "not a URL"),
    ],
)
def test_an_invalid_domain_is_an_error_saying_why(domain: str, why: str) -> None:
    assert ids(**replying_app(APP_ID="cli_a", APP_SECRET="s", DOMAIN=domain)) == [
        "feishu_inbox.E002"
    ]
    with (
        override_settings(FEISHU_INBOX=replying_app(DOMAIN=domain)),
        pytest.raises(ConfigurationError, match=why) as caught,
    ):
        checked_settings()
    assert "APPS['bot']" in caught.value.message


def test_app_keys_must_be_strings() -> None:
    with (
        override_settings(FEISHU_INBOX=replying_app(APP_ID=42, APP_SECRET="s")),
        pytest.raises(ConfigurationError, match=r"APPS\['bot'\]\['APP_ID'\] must be a string"),
    ):
        checked_settings()


def test_half_of_the_credentials_is_warned() -> None:
    assert ids(**replying_app(APP_ID="cli_a")) == ["feishu_inbox.W006"]
    assert ids(**replying_app(APP_SECRET="s", DOMAIN="lark")) == ["feishu_inbox.W006"]
    assert ids(**replying_app(APP_ID="", APP_SECRET="", DOMAIN="feishu")) == []  # demo defaults
    with override_settings(FEISHU_INBOX=replying_app(APP_ID="cli_a")):
        [message] = [m for m in run_checks() if m.id == "feishu_inbox.W006"]
    assert "has an APP_ID but no APP_SECRET" in message.msg


def test_a_misspelt_app_key_is_warned() -> None:
    assert ids(**replying_app(APP_ID="cli_a", APP_SECRET="s", DOMIAN="lark")) == [
        "feishu_inbox.W007"
    ]


def test_credentials_without_the_sdk_are_warned(monkeypatch: pytest.MonkeyPatch) -> None:
    # Not an error: the long connection needs the credentials and not the SDK.
    monkeypatch.setitem(sys.modules, "lark_oapi", None)  # find_spec: not installed
    assert ids(**replying_app(APP_ID="cli_a", APP_SECRET="s")) == ["feishu_inbox.W008"]
    assert ids(**replying_app()) == []  # an app that does not reply needs no SDK


def test_django_start_up_and_checks_do_not_import_the_sdk(tmp_path: Path) -> None:
    """lark_oapi takes seconds and 140 MB to import: only the first Open API call imports it."""
    code = (
        "import sys, django; django.setup();"
        "from django.core.management import call_command; call_command('check');"
        "import feishu_inbox, feishu_inbox.feishu.openapi;"
        "print('lark_oapi' in sys.modules)"
    )
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "FEISHU_APP_ID": "cli_a",
        "FEISHU_APP_SECRET": "s",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_a_handler_module_that_cannot_be_imported_is_e003_with_its_own_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The HANDLER_MODULES snippet pasted before its module exists: the hint says to create
    it, not to register one callable per event type."""
    from feishu_inbox.checks import check_handlers
    from feishu_inbox.runtime import registry

    monkeypatch.setattr(registry, "_problems", [])
    registry.load_modules(["mysite.feishu_handlers"])
    [error] = [m for m in check_handlers() if m.id == "feishu_inbox.E003"]
    assert "'mysite.feishu_handlers' cannot be imported" in error.msg
    assert error.hint is not None and "Create that module" in error.hint


def test_listen_url_and_poll_only_together_are_refused() -> None:
    assert ids(LISTEN_URL="postgres://db/app", POLL_ONLY=True) == ["feishu_inbox.E002"]


def test_a_transaction_pooler_refuses_what_needs_a_session(
    postgres_only: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind PgBouncer in transaction mode: psycopg's prepared statements and Django's
    server-side cursors are errors (E009), and wake-ups without LISTEN_URL a warning (W009)."""
    from django.db import connections

    db = connections["default"].settings_dict
    monkeypatch.setitem(db, "DISABLE_SERVER_SIDE_CURSORS", False)
    monkeypatch.setitem(db, "OPTIONS", {**db.get("OPTIONS", {}), "prepare_threshold": 5})
    assert ids(TRANSACTION_POOLER=True) == [
        "feishu_inbox.E009",
        "feishu_inbox.E009",
        "feishu_inbox.W009",
    ]
    monkeypatch.setitem(db, "DISABLE_SERVER_SIDE_CURSORS", True)
    monkeypatch.setitem(
        db, "OPTIONS", {k: v for k, v in db["OPTIONS"].items() if k != "prepare_threshold"}
    )
    assert ids(TRANSACTION_POOLER=True, LISTEN_URL="postgres://db/app") == []
    assert ids(TRANSACTION_POOLER=True, POLL_ONLY=True) == []
    assert ids() == []  # no pooler declared: nothing to say


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"LISTEN_URL": "postgres://db/app"}, "LISTEN on LISTEN_URL (direct):"),
        ({"TRANSACTION_POOLER": True, "LISTEN_URL": "postgres://db/app"}, "LISTEN_URL (direct)"),
        ({"TRANSACTION_POOLER": True, "POLL_ONLY": True}, "poll-only"),
    ],
)
def test_check_deploy_says_how_workers_are_woken_and_what_it_costs(
    postgres_only: None, settings: dict[str, object], words: str
) -> None:
    with override_settings(FEISHU_INBOX={"APPS": APPS, **settings}):
        found = [
            m for m in run_checks(include_deployment_checks=True) if m.id == "feishu_inbox.I001"
        ]
    assert len(found) == 1 and words in found[0].msg, found


def test_check_deploy_says_nothing_of_the_default_wakeups() -> None:
    """A site that chose no topology (LISTEN on its database, or SQLite's polling) gets no
    message: ``check --deploy`` stays clean."""
    with override_settings(FEISHU_INBOX={"APPS": APPS}):
        assert not [
            m for m in run_checks(include_deployment_checks=True) if m.id == "feishu_inbox.I001"
        ]
