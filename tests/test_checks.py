"""Configuration is typed, read lazily, and misconfiguration is caught by system checks."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from feishu_inbox.conf import checked_settings, inbox_settings
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
    from feishu_inbox import handlers

    saved = dict(handlers._registry)
    try:
        handlers._registry.clear()
        found = [m for m in run_checks() if m.id == "feishu_inbox.W004"]
        assert found and "feishu_handlers.py" in (found[0].hint or "")
    finally:
        handlers._registry.update(saved)
    handlers._registry.setdefault("t.any", []).append(lambda event: None)
    try:
        assert "feishu_inbox.W004" not in [m.id for m in run_checks()]
    finally:
        del handlers._registry["t.any"]
