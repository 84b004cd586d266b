from __future__ import annotations

from django.apps import AppConfig


class FeishuInboxConfig(AppConfig):
    name = "feishu_inbox"
    verbose_name = "Feishu inbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
