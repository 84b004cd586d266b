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

from feishu_inbox.management.demo_data import fill
from feishu_inbox.models import EventJob
from tests.support.browser import chromium_context
from tests.support.processes import ROOT, wait_for
from tests.support.worker_helpers import Workers, enqueue

pytestmark = pytest.mark.django_db(transaction=True)


def log_in(context: Any, base: str, next_path: str) -> Any:
    """A new page of the browser, logged in as the tests' ``oncall`` user, at ``next_path``."""
    page = context.new_page()
    page.goto(f"{base}/admin/login/?next={next_path}")
    page.fill("#id_username", "oncall")
    page.fill("#id_password", "s3cret-pw")
    page.click("input[type=submit]")
    return page


@pytest.fixture
def browser_page(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    # Playwright's sync API keeps an event loop in this thread; the ORM calls made here
    # between browser steps are plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with chromium_context() as context:
        yield context


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

    page = log_in(browser_page, base, "/admin/feishu_inbox/eventjob/")
    page.wait_for_selector("#result_list")
    # The whole list fits a 1,400 px window: no column behind a horizontal scroll.
    widths = page.evaluate(
        "() => { const r = document.querySelector('#changelist .results');"
        " const last = document.querySelector('#result_list thead th:last-child');"
        " return [r.scrollWidth, r.clientWidth, last.getBoundingClientRect().right,"
        " document.documentElement.scrollWidth, window.innerWidth]; }"
    )
    page.screenshot(path=str(shots / "list.png"), full_page=True)
    scroll, visible, last_right, page_width, window_width = widths
    assert scroll <= visible and last_right <= window_width, widths
    assert page_width <= window_width, widths

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


def test_operator_cancels_a_running_job_from_its_page(
    live_server: Any, browser_page: Any, workers: Workers
) -> None:
    shots = ROOT / "artifacts" / "screenshots" / connection.vendor
    shots.mkdir(parents=True, exist_ok=True)
    running = enqueue("runaway", ["checkpoints:60", "effect"])
    workers.start()
    wait_for(lambda: workers.lines("start", "runaway"), 30, "the runaway handler to start")
    user = User.objects.create_user("oncall", password="s3cret-pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="feishu_inbox",
            codename__in=["view_eventjob", "cancel_eventjob"],
        )
    )
    base = live_server.url
    page = log_in(browser_page, base, f"/admin/feishu_inbox/eventjob/{running}/change/")
    page.wait_for_selector('[data-action="cancel_jobs"]')
    assert page.locator(".fi-job-action button").count() == 1  # running: cancel only
    page.click('[data-action="cancel_jobs"]')
    page.wait_for_selector(".fi-confirm")
    page.screenshot(path=str(shots / "confirm-cancel.png"), full_page=True)
    page.click(".fi-confirm input[type=submit]")
    page.wait_for_url(f"**/eventjob/{running}/change/")
    assert "asked to stop at the next checkpoint" in page.inner_text(".messagelist")
    wait_for(lambda: EventJob.objects.get(pk=running).status == "completed", 10, "the job to end")
    page.reload()
    assert "Cancelled" in page.inner_text("#content-main")
    page.screenshot(path=str(shots / "cancelled.png"), full_page=True)
    assert not workers.lines("effect", "runaway")


def test_operator_resumes_a_waiting_job_from_its_page(
    live_server: Any, browser_page: Any, workers: Workers
) -> None:
    """A real worker's job waits for a signal that never comes; the operator sees what it waits
    for on its page, resumes it by hand, and the worker runs it to the end."""
    shots = ROOT / "artifacts" / "screenshots" / connection.vendor
    shots.mkdir(parents=True, exist_ok=True)
    waiting = enqueue("stuck-approval", ["step:before", "wait:approval:42", "effect"])
    workers.start()
    wait_for(lambda: EventJob.objects.get(pk=waiting).status == "waiting", 30, "the job to wait")
    user = User.objects.create_user("oncall", password="s3cret-pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="feishu_inbox",
            codename__in=["view_eventjob", "cancel_eventjob", "signal_wait"],
        )
    )
    page = log_in(browser_page, live_server.url, f"/admin/feishu_inbox/eventjob/{waiting}/change/")
    page.wait_for_selector('[data-action="resume_waiting"]')
    assert "signal 'approval:42' (wait:1): open" in page.inner_text("#content-main")
    buttons = page.locator(".fi-job-action button")
    assert sorted(buttons.nth(i).get_attribute("data-action") for i in range(buttons.count())) == [
        "cancel_jobs",
        "resume_waiting",
        "time_out_waiting",
    ]
    page.screenshot(path=str(shots / "waiting.png"), full_page=True)
    page.click('[data-action="resume_waiting"]')
    page.wait_for_selector(".fi-confirm")
    page.click(".fi-confirm input[type=submit]")
    page.wait_for_url(f"**/eventjob/{waiting}/change/")
    wait_for(lambda: EventJob.objects.get(pk=waiting).status == "completed", 30, "the job to end")
    page.reload()
    assert "signal 'approval:42' (wait:1): delivered" in page.inner_text("#content-main")
    assert [line[1:3] for line in workers.lines("waited")] == [["stuck-approval", "null"]]
    assert len(workers.lines("ran", "stuck-approval")) == 1  # the step before: once
    assert len(workers.lines("effect", "stuck-approval")) == 1


def test_operator_sees_a_workflows_tree_and_cancels_it_in_the_browser(
    live_server: Any, browser_page: Any, workers: Workers
) -> None:
    """A real worker's parent waits for three running children; the operator sees the tree on
    the parent's page, follows it to the Workflows page and cancels the workflow there: the
    children stop, the parent resumes with their outcomes and ends."""
    from feishu_inbox import ledger
    from feishu_inbox.tables.batches import Batch

    shots = ROOT / "artifacts" / "screenshots" / connection.vendor
    shots.mkdir(parents=True, exist_ok=True)
    parent = ledger.enqueue(
        event_id="tree",
        event_type="test.fanout",
        partition_key="chat-tree",
        payload={"n": 3, "steps": ["checkpoints:300"]},
    ).job_id
    workers.start("--concurrency", "4")

    def fresh_count(**where: object) -> int:
        connection.close()
        return EventJob.objects.filter(**where).count()

    wait_for(
        lambda: (
            fresh_count(parent_id=parent, status="running") == 3
            and fresh_count(pk=parent, status="waiting") == 1
        ),
        60,
        "the parent to wait for its three running children",
    )
    user = User.objects.create_user("oncall", password="s3cret-pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="feishu_inbox",
            codename__in=["view_eventjob", "manage_workflow"],
        )
    )
    page = log_in(browser_page, live_server.url, f"/admin/feishu_inbox/eventjob/{parent}/change/")
    page.wait_for_selector("text=Descendants by state")
    main = page.inner_text("#content-main")
    assert "3 running" in main and main.count("test.wf_child") == 3
    page.screenshot(path=str(shots / "workflow-tree.png"), full_page=True)
    batch = Batch.objects.get(parent_id=parent)
    page.click(f"text=batch #{batch.pk}")
    page.wait_for_selector("text=members by state")
    page.goto(f"{live_server.url}/admin/feishu_inbox/batch/")
    page.check(f'input[name="_selected_action"][value="{batch.pk}"]')
    page.select_option('select[name="action"]', "cancel_workflow")
    page.click('button[name="index"]')
    page.wait_for_selector(".messagelist")
    assert "3 members cancelled (3 running: asked to stop)" in page.inner_text(".messagelist")
    page.screenshot(path=str(shots / "workflow-cancelled.png"), full_page=True)
    wait_for(lambda: fresh_count(pk=parent, status="completed") == 1, 60, "the parent to end")
    assert fresh_count(parent_id=parent, status="completed", error_type="Cancelled") == 3
    assert [line[2:5] for line in workers.lines("resumed", "tree")] == [["3", "0", "0"]]
