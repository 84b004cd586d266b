"""The admin's Schedules page: what it shows, and pause, resume and run now, each behind its
own permission, refused per schedule with the reason, written to the admin history."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse

from feishu_inbox import ledger
from feishu_inbox.models import EventJob, Schedule
from feishu_inbox.schedules import scheduler
from tests.admin.test_admin import staff
from tests.support.schedule_helpers import declare

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:feishu_inbox_schedule_changelist"
ACTIONS = ["pause_schedules", "resume_schedules", "run_schedules_now"]


@pytest.fixture
def declared(registry: None) -> None:
    declare("digest", "0 9 * * 1-5", tz="Asia/Shanghai", catch_up="run-all", max_catch_up=3)
    declare("sync", "*/15 * * * *")


def act(client: Client, action: str, names: list[str]) -> Any:
    return client.post(
        reverse(CHANGELIST), {"action": action, "_selected_action": names}, follow=True
    )


@pytest.mark.usefixtures("declared")
def test_the_page_shows_each_schedule_in_words_with_its_next_and_last_job() -> None:
    viewer = staff("viewer", "view_schedule")
    (job_id,) = scheduler.run_now(["digest"]).job_ids.values()
    scheduler.pause(["sync"])
    html = viewer.get(reverse(CHANGELIST)).content.decode()
    assert "At 09:00 on Monday through Friday" in html and ">0 9 * * 1-5</code>" in html
    assert "Every 15th minute of every hour" in html
    assert "Asia/Shanghai" in html and "run-all, ≤ 3 a tick" in html
    assert " 09:00:00 CST" in html  # the next occurrence, in the schedule's time zone
    job_url = reverse("admin:feishu_inbox_eventjob_change", args=[job_id])
    assert f'<a href="{job_url}">#{job_id}</a>' in html and 'data-status="queued"' in html
    assert html.count('data-paused="yes"') == 1 and html.count('data-paused="no"') == 1
    assert " ago</span>" in html and "never" in html  # last fired: digest, and sync (never)
    for name in ACTIONS:
        assert f'value="{name}"' not in html  # a viewer may not act


@pytest.mark.usefixtures("declared")
def test_each_action_needs_its_own_permission() -> None:
    pauser = staff("pauser", "view_schedule", "pause_schedule")
    html = pauser.get(reverse(CHANGELIST)).content.decode()
    assert 'value="pause_schedules"' in html
    assert 'value="resume_schedules"' not in html and 'value="run_schedules_now"' not in html
    for forged in ("resume_schedules", "run_schedules_now"):
        response = pauser.post(
            reverse(CHANGELIST), {"action": forged, "_selected_action": ["digest"]}
        )
        assert response.status_code == 403
    assert not EventJob.objects.exists()
    assert staff("nobody").get(reverse(CHANGELIST)).status_code == 403


@pytest.mark.usefixtures("declared")
def test_pause_resume_and_run_now_are_recorded_and_refusals_named() -> None:
    operator = staff(
        "operator", "view_schedule", "pause_schedule", "resume_schedule", "run_schedule"
    )
    scheduler.ensure_rows()
    scheduler.pause(["sync"])
    text = act(operator, "pause_schedules", ["digest", "sync"]).content.decode()
    assert "1 schedule: Pause: enqueue nothing until resumed." in text
    assert "1 schedule refused, nothing changed for it: sync: Cannot pause schedule" in text
    assert Schedule.objects.get(name="digest").paused

    text = act(operator, "resume_schedules", ["digest", "sync"]).content.decode()
    assert "2 schedules: Resume" in text
    assert not Schedule.objects.filter(paused=True).exists()

    act(operator, "run_schedules_now", ["digest"])
    (job,) = EventJob.objects.all()
    assert (job.event_type, job.payload["requested_by"]) == ("schedule.digest", "operator")
    history = [
        (e.object_id, e.get_change_message())
        for e in LogEntry.objects.order_by("id")
        if e.user.username == "operator"
    ]
    assert history == [
        ("digest", "Pause (schedule digest)"),
        ("digest", "Resume (schedule digest)"),
        ("sync", "Resume (schedule sync)"),
        ("digest", f"Run now (schedule digest): job #{job.pk}"),
    ]


@pytest.mark.usefixtures("registry")
def test_a_schedule_no_longer_declared_is_shown_and_refused() -> None:
    declare("gone")
    scheduler.ensure_rows()
    from feishu_inbox import schedules

    schedules._declared.clear()  # the next deploy removed it from the code
    operator = staff("operator", "view_schedule", "run_schedule")
    assert "no longer declared" in operator.get(reverse(CHANGELIST)).content.decode()
    text = act(operator, "run_schedules_now", ["gone"]).content.decode()
    assert "gone: Cannot run schedule &#x27;gone&#x27;: no schedule of that name" in text
    assert not EventJob.objects.exists()
    assert ledger.claim("w") == []
