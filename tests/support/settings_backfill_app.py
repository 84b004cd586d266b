"""The demo settings with ``tests.backfill_app`` installed: a site whose migration needs a
backfill (``tests/backfills/test_migrate_gate.py``). ``BACKFILL_APP_DEPLOY=2``: its code as
the second of the three deploys ships it, with the backfill declared and the migration that
needs it not written yet."""

from __future__ import annotations

import os

from project.settings import *  # noqa: F403
from project.settings import INSTALLED_APPS as _APPS

INSTALLED_APPS = [*_APPS, "tests.backfill_app"]
if os.environ.get("BACKFILL_APP_DEPLOY") == "2":
    MIGRATION_MODULES = {"backfill_app": "tests.backfill_app.deploy2_migrations"}
