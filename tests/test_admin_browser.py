"""The operator's flow in a real browser: Playwright driving Debian's Chromium.

Screenshots of the list, detail, confirmation and dashboard pages are saved under
``artifacts/screenshots/`` (per database).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection

from feishu_inbox.demo_data import fill
from feishu_inbox.models import EventJob

from .browser import chromium_context
from .processes import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def browser_page(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    # Playwright's sync API keeps an event loop in this thread; the ORM calls made here
    # between browser steps are plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with chromium_context() as context:
        yield context
    if connection.vendor == "postgresql":
        # The live server's request threads are daemons that Django does not join: one may
        # still hold its connection when the session drops the test database.
        with connection.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )


def test_operator_reconciles_unknown_jobs_in_the_browser(
    live_server: Any, browser_page: Any
) -> None:
    shots = ROOT / "artifacts" / "screenshots" / connection.vendor
    shots.mkdir(parents=True, exist_ok=True)
    counts = fill()
    unknown = sorted(EventJob.objects.filter(status="unknown").values_list("pk", flat=True))
    assert len(unknown) == counts["unknown"] == 2
    user = User.objects.create_user("oncall", password="s3cret-pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="feishu_inbox",
            codename__in=[
                "view_eventjob",
                "reconcile_eventjob",
                "requeue_eventjob",
                "discard_eventjob",
            ],
        )
    )
    base = live_server.url

    page = browser_page.new_page()
    page.goto(f"{base}/admin/login/?next=/admin/feishu_inbox/eventjob/")
    page.fill("#id_username", "oncall")
    page.fill("#id_password", "s3cret-pw")
    page.click("input[type=submit]")
    page.wait_for_selector("#result_list")

    # A dashboard left open in another tab must follow the change without a reload.
    dashboard = browser_page.new_page()
    dashboard.goto(f"{base}/admin/feishu_inbox/eventjob/dashboard/")
    dashboard.wait_for_selector('[data-state="unknown"] .n')
    assert dashboard.inner_text('[data-state="unknown"] .n') == "2"
    dashboard.screenshot(path=str(shots / "dashboard.png"), full_page=True)

    # Filter `unknown` in the sidebar.
    page.click("#changelist-filter a:text-is('unknown')")
    page.wait_for_url("**status__exact=unknown**")
    assert page.locator("#result_list tbody tr").count() == 2
    page.screenshot(path=str(shots / "list-unknown.png"), full_page=True)

    page.goto(f"{base}/admin/feishu_inbox/eventjob/{unknown[0]}/change/")
    assert "an effect raised: outcome uncertain" in page.content()
    page.screenshot(path=str(shots / "detail.png"), full_page=True)
    page.go_back()

    # Select them, choose "not applied, run again", confirm.
    page.check("#action-toggle")
    page.select_option("select[name=action]", "reconcile_not_applied")
    page.click("button[name=index]")
    page.wait_for_selector(".fi-confirm")
    assert page.locator("tr.fi-job").count() == 2
    page.screenshot(path=str(shots / "confirm.png"), full_page=True)
    page.click(".fi-confirm input[type=submit]")

    page.wait_for_selector(".messagelist .success")
    assert "2 jobs: Reconcile unknown: the effect did NOT happen" in page.inner_text(".messagelist")
    page.goto(f"{base}/admin/feishu_inbox/eventjob/?status__exact=queued")
    listed = {int(t) for t in page.locator("#result_list tbody th a").all_inner_texts()}
    assert set(unknown) <= listed
    assert set(EventJob.objects.filter(pk__in=unknown).values_list("status", flat=True)) == {
        "queued"
    }

    dashboard.wait_for_function(
        "document.querySelector('[data-state=\"unknown\"] .n').textContent === '0'",
        timeout=15_000,
    )
    assert dashboard.inner_text('[data-state="queued"] .n') == str(counts["queued"] + 2)
    dashboard.screenshot(path=str(shots / "dashboard-after.png"), full_page=True)
    for name in ("list-unknown", "detail", "confirm", "dashboard", "dashboard-after"):
        assert (shots / f"{name}.png").stat().st_size > 10_000
    print(f"screenshots: {shots}")
