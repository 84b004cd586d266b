"""The app's migrations as deploy 2's code has them: 0001 only, 0002 (RequireBackfill, then
NOT NULL) not written yet (``BACKFILL_APP_DEPLOY=2``, ``tests.support.settings_backfill_app``)."""
