from __future__ import annotations

from django.apps import AppConfig


class BackfillAppConfig(AppConfig):
    """A site's app whose column is made NOT NULL in three deploys (``test_migrate_gate.py``):
    installed only by ``tests.support.settings_backfill_app``."""

    name = "tests.backfill_app"
    label = "backfill_app"
    default_auto_field = "django.db.models.BigAutoField"
