"""The demo's background task (``django.tasks`` on the ledger, docs/tasks.md).

``tally_replies`` counts what the bot wrote. Its schedule (``FEISHU_INBOX["SCHEDULES"]`` in
``project/settings.py``) runs it every five minutes, and the bot enqueues it when someone
writes "tally"; the admin's *Schedules* page and its ledger (kind *task*) show both.
"""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport (the `tasks` extra)
    from django_tasks import task  # type: ignore[no-redef]

from .models import Reply


@task
def tally_replies() -> dict[str, int]:
    """How many replies the bot wrote, in how many chats (its result, in the ledger)."""
    return {
        "replies": Reply.objects.count(),
        "chats": Reply.objects.values("chat").distinct().count(),
    }
