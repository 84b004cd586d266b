"""Pauses in the admin: the jobs list's "Pause their chats", the Pauses page's add and
"Resume", each behind its own permission and written to the history; the dashboard shows
what is paused. A refused action moves no row."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from feishu_inbox.ledger import pauses
from feishu_inbox.models import EventJob, Pause
from tests.admin.test_admin import CHANGELIST, staff
from tests.support.ledger_helpers import snapshot
from tests.support.worker_helpers import enqueue

pytestmark = pytest.mark.django_db

PAUSES = "admin:feishu_inbox_pause_changelist"


def test_pause_chats_then_resume_them_from_the_admin() -> None:
    jobs = [enqueue(f"a{i}", ["work:0"], partition="chat-a") for i in range(3)]
    other = enqueue("b0", ["work:0"], partition="chat-b")
    ops = staff("ops", "view_eventjob", "pause_work", "resume_work", "view_pause")
    answer = ops.post(
        reverse(CHANGELIST), {"action": "pause_chats", "_selected_action": [str(jobs[0])]}
    )
    assert answer.status_code == 302
    (pause,) = Pause.objects.all()
    assert (pause.kind, pause.value, pause.by) == ("partition", "chat-a", "ops")
    held = EventJob.objects.filter(pk__in=jobs, available_at__gte=pauses.HELD_FROM).count()
    assert held == 3
    assert EventJob.objects.get(pk=other).available_at < pauses.HELD_FROM
    assert LogEntry.objects.filter(change_message="Paused partition chat-a").count() == 1
    page = ops.get(reverse(PAUSES)).content.decode()
    assert "chat-a" in page and ">3<" in page  # jobs held now
    board = ops.get(reverse("admin:feishu_inbox_dashboard_data")).json()
    assert [(p["value"], p["by"], p["held"]) for p in board["pauses"]] == [("chat-a", "ops", 3)]
    answer = ops.post(
        reverse(PAUSES), {"action": "resume_selected", "_selected_action": [pause.pk]}
    )
    assert answer.status_code == 302 and not Pause.objects.exists()
    assert not EventJob.objects.filter(available_at__gte=pauses.HELD_FROM).exists()
    assert LogEntry.objects.filter(change_message="Resumed partition chat-a").count() == 1


def test_the_add_page_pauses_and_a_user_without_the_permission_moves_nothing() -> None:
    job = enqueue("t0", ["work:0"], event_type="test.timed")
    viewer = staff("viewer", "view_eventjob", "view_pause")
    before = snapshot(job)
    refused = viewer.post(reverse(CHANGELIST), {"action": "pause_chats", "_selected_action": [job]})
    assert refused.status_code in (200, 302, 403)
    assert (
        reverse("admin:feishu_inbox_pause_add") not in viewer.get(reverse(PAUSES)).content.decode()
    )
    assert viewer.post(reverse("admin:feishu_inbox_pause_add"), {}).status_code == 403
    assert snapshot(job) == before and not Pause.objects.exists()

    ops = staff("ops", "view_eventjob", "pause_work", "resume_work")
    added = ops.post(
        reverse("admin:feishu_inbox_pause_add"),
        {"kind": "event_type", "value": "test.timed", "reason": "rollback"},
    )
    assert added.status_code == 302, added.content.decode()[:500]
    (pause,) = Pause.objects.all()
    assert (pause.by, pause.reason) == ("ops", "rollback")
    assert EventJob.objects.get(pk=job).available_at >= pauses.HELD_FROM
    board = ops.get(reverse("admin:feishu_inbox_dashboard_data")).json()
    assert [(p["kind"], p["value"], p["held"]) for p in board["pauses"]] == [
        ("event_type", "test.timed", 1)
    ]
