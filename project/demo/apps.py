from __future__ import annotations

from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "project.demo"
    label = "demo"
    verbose_name = "Demo bot"
    default_auto_field = "django.db.models.BigAutoField"
