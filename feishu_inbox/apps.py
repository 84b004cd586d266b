from __future__ import annotations

from django.apps import AppConfig


class FeishuInboxConfig(AppConfig):
    name = "feishu_inbox"
    verbose_name = "Feishu inbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from . import (
            checks,  # noqa: F401  (registers the system checks)
            store,  # noqa: F401  (prepares each new database connection)
        )
        from .backfills.exports import EXPORT_KIND
        from .backfills.running import BACKFILL_KIND
        from .conf import inbox_settings
        from .feishu.turns import REACTION_KIND
        from .ledger import kinds
        from .tasks.jobs import TASK_KIND
        from .webhooks.delivery import WEBHOOK_KIND

        # The kinds of job (ledger/kinds.py): each capability's, before any handler module.
        for kind in (
            kinds.FEISHU_EVENTS,
            kinds.SCHEDULE_OCCURRENCES,
            TASK_KIND,
            WEBHOOK_KIND,
            REACTION_KIND,
            BACKFILL_KIND,
            EXPORT_KIND,
        ):
            kinds.register(kind)
        from .workflows import ready as workflows_ready

        workflows_ready()  # the ledger enqueues workflows' jobs (children, callbacks, links)
        from .runtime.registry import load_modules
        from .schedules import load_settings as load_schedules

        # Handlers: a ``feishu_handlers`` module in any installed app, then the listed modules.
        autodiscover_modules("feishu_handlers")
        try:
            modules = list(inbox_settings().HANDLER_MODULES)
        except Exception:
            modules = []
        load_modules(modules)
        load_schedules()  # FEISHU_INBOX["SCHEDULES"], after the handler modules
