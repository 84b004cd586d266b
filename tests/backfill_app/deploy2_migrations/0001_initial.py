"""The app's 0001, the same migration (its module name starts with a digit: imported by name)."""

from importlib import import_module

Migration = import_module("tests.backfill_app.migrations.0001_initial").Migration
