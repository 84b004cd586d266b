"""The admin's Backfills page: progress (rows of the estimate, rate, ETA, stalled) to anyone
who may view it; pause, resume, cancel and run again only to holders of ``operate_backfill``,
each through ``feishu_inbox.backfills``, refused ones reported with their code, every one in
the admin history."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from feishu_inbox import backfills
from feishu_inbox.tables.backfills import Backfill
from tests.support import backfill_jobs

pytestmark = pytest.mark.django_db(transaction=True)

LIST = "admin:feishu_inbox_backfill_changelist"


def operator(*perms: str) -> Client:
    user = User.objects.create_user("op-" + "-".join(perms or ("viewer",)), is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=["view_backfill", *perms]))
    client = Client()
    client.force_login(user)
    return client


def act(client: Client, action: str, *names: str) -> str:
    ids = [str(Backfill.objects.get(name=n).pk) for n in names]
    answer = client.post(reverse(LIST), {"action": action, "_selected_action": ids}, follow=True)
    assert answer.status_code == 200
    return answer.content.decode()


def test_progress_is_shown_and_only_operators_act(table: Any) -> None:
    backfill_jobs.fill_table(1000)
    backfills.start("test.fill")
    Backfill.objects.filter(name="test.fill").update(
        rows_done=400, total_estimate=1000, rate=100.0, last_batch_at=timezone.now()
    )
    viewer = operator()
    page = viewer.get(reverse(LIST)).content.decode()
    assert "400 of ~1,000" in page and "100 rows/s" in page and "6 s" in page
    assert "pause_selected" not in page  # no action without the permission
    ops = operator("operate_backfill")
    assert "pause_selected" in ops.get(reverse(LIST)).content.decode()
    assert "1 backfill paused." in act(ops, "pause_selected", "test.fill")
    assert Backfill.objects.get(name="test.fill").state == "paused"
    refused = act(ops, "pause_selected", "test.fill")
    assert "[backfill_running] Cannot pause backfill" in refused
    assert "1 backfill resumed." in act(ops, "resume_selected", "test.fill")
    call_command("runworker", "--burst", "--concurrency", "1", "-v", "0")
    assert Backfill.objects.get(name="test.fill").state == "applied"
    assert "1 backfill run again." in act(ops, "run_again_selected", "test.fill")
    assert Backfill.objects.get(name="test.fill").run == 2
    assert "1 backfill cancelled." in act(ops, "cancel_selected", "test.fill")
    history = LogEntry.objects.order_by("id").values_list("change_message", flat=True)
    assert list(history) == [
        "Pause backfill test.fill",
        "Resume backfill test.fill",
        "Run backfill test.fill",
        "Cancel backfill test.fill",
    ]


def test_a_stalled_backfill_says_so_on_the_page(table: Any) -> None:
    backfills.start("test.fill")
    long_ago = timezone.now() - timedelta(hours=1)
    Backfill.objects.filter(name="test.fill").update(started_at=long_ago, resumed_at=long_ago)
    assert "running — STALLED" in operator().get(reverse(LIST)).content.decode()
