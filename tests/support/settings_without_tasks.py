"""The demo project's settings as a site that uses no background tasks has them: no TASKS, and
not the demo app (its handlers enqueue tasks)."""

from project.settings import *  # noqa: F403

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "project.demo"]  # noqa: F405
del TASKS  # noqa: F821 - defined by the star import
