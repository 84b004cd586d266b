"""The demo settings with ``tests.backfill_app`` installed: a site whose migration needs a
backfill (``tests/backfills/test_migrate_gate.py``)."""

from __future__ import annotations

from project.settings import *  # noqa: F403
from project.settings import INSTALLED_APPS as _APPS

INSTALLED_APPS = [*_APPS, "tests.backfill_app"]
