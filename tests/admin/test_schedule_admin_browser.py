"""The Schedules page in a real browser: an operator pauses a schedule and runs one now.

Screenshots go to ``artifacts/screenshots/<database>/schedules*.png``.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection

from feishu_inbox.models import EventJob, Schedule
from feishu_inbox.schedules import scheduler
from tests.admin.test_admin_browser import browser_page  # noqa: F401  (the fixture)
from tests.support.processes import ROOT
from tests.support.schedule_helpers import declare

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("registry")]


def test_operator_pauses_a_schedule_and_runs_another_now_in_the_browser(
    live_server: Any,
    browser_page: Any,  # noqa: F811
) -> None:
    # Inside Playwright's event loop Django keeps a connection per context, and the one this
    # thread used there in the admin browser test was ended by that test's teardown (which
    # ends every other session of the test database): start with a fresh one.
    connection.close()
    shots = ROOT / "artifacts" / "screenshots" / connection.vendor
    shots.mkdir(parents=True, exist_ok=True)
    declare("daily-digest", "0 9 * * 1-5", tz="Asia/Shanghai", partition="digest")
    declare("hourly-sync", "5 * * * *", tz="Europe/Berlin", catch_up="run-all")
    declare("weekly-reminder", "30 17 * * FRI", tz="Asia/Shanghai", catch_up="run-once")
    scheduler.run_now(["hourly-sync"], by="earlier")
    user = User.objects.create_user("oncall", password="s3cret-pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="feishu_inbox",
            codename__in=["view_schedule", "pause_schedule", "resume_schedule", "run_schedule"],
        )
    )
    page = browser_page.new_page()
    page.goto(f"{live_server.url}/admin/login/?next=/admin/feishu_inbox/schedule/")
    page.fill("#id_username", "oncall")
    page.fill("#id_password", "s3cret-pw")
    page.click("input[type=submit]")
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 3
    assert "At 09:00 on Monday through Friday" in page.inner_text("#result_list")
    page.screenshot(path=str(shots / "schedules.png"), full_page=True)

    page.check("#result_list tbody tr:has-text('daily-digest') input.action-select")
    page.select_option("select[name=action]", "pause_schedules")
    page.click("button[name=index]")
    page.wait_for_selector(".messagelist .success")
    assert "1 schedule: Pause" in page.inner_text(".messagelist")
    assert Schedule.objects.get(name="daily-digest").paused

    page.check("#result_list tbody tr:has-text('weekly-reminder') input.action-select")
    page.select_option("select[name=action]", "run_schedules_now")
    page.click("button[name=index]")
    page.wait_for_selector(".messagelist .success")
    job = EventJob.objects.get(event_type="schedule.weekly-reminder")
    assert job.payload["requested_by"] == "oncall"
    row = page.locator("#result_list tbody tr:has-text('weekly-reminder')")
    assert f"#{job.pk}" in row.inner_text() and "queued" in row.inner_text()
    page.screenshot(path=str(shots / "schedules-after.png"), full_page=True)
    for name in ("schedules", "schedules-after"):
        assert (shots / f"{name}.png").stat().st_size > 10_000
