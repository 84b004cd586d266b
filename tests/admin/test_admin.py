"""The operator's admin: permissions, read-only rows, confirmed actions, refusals, queries."""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.db.models import JSONField, Value
from django.db.models.functions import Cast
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from feishu_inbox import ledger
from feishu_inbox.ledger import reports as connections
from feishu_inbox.management.demo_data import fill
from feishu_inbox.models import EventJob, FeishuConnection
from tests.support.factories import EventJobFactory
from tests.support.ledger_helpers import snapshot

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:feishu_inbox_eventjob_changelist"
ACTION_NAMES = [
    "requeue_failed",
    "reconcile_not_applied",
    "reconcile_applied",
    "discard_failed",
    "cancel_jobs",
    "replay_completed",
    "resume_waiting",
    "time_out_waiting",
]
ALL_PERMISSIONS = (
    "view_eventjob",
    "requeue_eventjob",
    "reconcile_eventjob",
    "discard_eventjob",
    "cancel_eventjob",
    "replay_eventjob",
    "signal_wait",
)


def staff(username: str, *codenames: str) -> Client:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="feishu_inbox", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer() -> Client:
    return staff("viewer", "view_eventjob")


@pytest.fixture
def operator() -> Client:
    return staff("operator", *ALL_PERMISSIONS)


@pytest.fixture
def ledger_data() -> dict[str, int]:
    return fill()


def ids(status: str) -> list[int]:
    return list(EventJob.objects.filter(status=status).values_list("pk", flat=True))


def act(client: Client, action: str, job_ids: list[int], **extra: str) -> Any:
    return client.post(
        reverse(CHANGELIST),
        {"action": action, "_selected_action": [str(i) for i in job_ids], **extra},
        follow=True,
    )


# --- permission matrix ----------------------------------------------------------------------


def test_viewer_sees_the_ledger_but_no_actions(viewer: Client, ledger_data: dict[str, int]) -> None:
    page = viewer.get(reverse(CHANGELIST))
    assert page.status_code == 200
    html = page.content.decode()
    for name in ACTION_NAMES:
        assert f'value="{name}"' not in html
    assert "fi-status" in html and "Dashboard" in html


@pytest.mark.parametrize("action", ACTION_NAMES)
def test_forged_action_post_without_permission_is_403_and_moves_nothing(
    viewer: Client, ledger_data: dict[str, int], action: str
) -> None:
    targets = ids("failed") + ids("unknown") + ids("queued") + ids("completed")
    before = {i: snapshot(i) for i in targets}
    response = viewer.post(
        reverse(CHANGELIST),
        {"action": action, "_selected_action": [str(i) for i in targets], "confirmed": "yes"},
    )
    assert response.status_code == 403
    assert {i: snapshot(i) for i in targets} == before


def test_each_permission_grants_only_its_actions(ledger_data: dict[str, int]) -> None:
    client = staff("requeuer", "view_eventjob", "requeue_eventjob")
    html = client.get(reverse(CHANGELIST)).content.decode()
    assert 'value="requeue_failed"' in html
    assert 'value="reconcile_applied"' not in html and 'value="discard_failed"' not in html
    assert (
        client.post(
            reverse(CHANGELIST), {"action": "discard_failed", "_selected_action": ids("failed")}
        ).status_code
        == 403
    )


def test_staff_without_view_permission_gets_403(ledger_data: dict[str, int]) -> None:
    client = staff("nobody")
    assert client.get(reverse(CHANGELIST)).status_code == 403
    assert client.get(reverse("admin:feishu_inbox_dashboard")).status_code == 403
    assert client.get(reverse("admin:feishu_inbox_dashboard_data")).status_code == 403


def test_rows_are_neither_editable_nor_deletable(operator: Client) -> None:
    job = EventJobFactory()
    change = reverse("admin:feishu_inbox_eventjob_change", args=[job.pk])
    page = operator.get(change)
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    before = snapshot(job.pk)
    assert operator.post(change, {"status": "completed"}).status_code == 403
    assert (
        operator.get(reverse("admin:feishu_inbox_eventjob_delete", args=[job.pk])).status_code
        == 403
    )
    assert operator.get(reverse("admin:feishu_inbox_eventjob_add")).status_code == 403
    assert snapshot(job.pk) == before


# --- actions -------------------------------------------------------------------------------


def test_requeue_failed_moves_only_failed_jobs_and_reports_refusals(
    operator: Client, ledger_data: dict[str, int]
) -> None:
    failed, queued = ids("failed"), ids("queued")[:1]
    page = act(operator, "requeue_failed", failed + queued)
    text = page.content.decode()
    assert "2 jobs: Requeue failed jobs" in text
    assert (
        f"#{queued[0]}: [invalid_state] Cannot requeue job {queued[0]}: it is queued, not failed."
        in text
    )
    assert all(EventJob.objects.get(pk=i).status == "queued" for i in failed)
    assert LogEntry.objects.filter(object_id__in=[str(i) for i in failed]).count() == 2


@pytest.mark.parametrize(
    ("action", "status", "after"),
    [
        ("reconcile_not_applied", "unknown", "queued"),
        ("reconcile_applied", "unknown", "completed"),
        ("discard_failed", "failed", "completed"),
    ],
)
def test_confirmed_actions_go_through_a_confirmation_page(
    operator: Client, ledger_data: dict[str, int], action: str, status: str, after: str
) -> None:
    targets = ids(status)
    confirm = act(operator, action, targets)
    html = confirm.content.decode()
    assert "Are you sure?" in html and 'name="confirmed" value="yes"' in html
    for i in targets:
        assert f'data-job="{i}"' in html
    assert all(EventJob.objects.get(pk=i).status == status for i in targets)  # not yet
    done = act(operator, action, targets, confirmed="yes")
    assert "2 jobs:" in done.content.decode()
    assert all(EventJob.objects.get(pk=i).status == after for i in targets)
    entries = LogEntry.objects.filter(object_id__in=[str(i) for i in targets])
    assert entries.count() == 2 and all(e.user.username == "operator" for e in entries)


def test_a_job_that_turned_live_before_confirmation_is_refused_and_not_moved(
    operator: Client, ledger_data: dict[str, int]
) -> None:
    target = ids("unknown")[0]
    act(operator, "reconcile_not_applied", [target])  # the confirmation page is open…
    ledger.reconcile([target], applied=False)  # …while someone else already reconciled it
    ledger.claim("w")  # and a worker picked it up
    before = snapshot(target)
    page = act(operator, "reconcile_not_applied", [target], confirmed="yes")
    text = page.content.decode()
    assert f"#{target}: [invalid_state] Cannot reconcile job {target}: it is" in text
    assert "nothing changed" in text
    assert snapshot(target) == before


# --- pages ---------------------------------------------------------------------------------


def test_detail_page_shows_payload_history_effects_and_neighbours(
    operator: Client, ledger_data: dict[str, int]
) -> None:
    job = EventJob.objects.get(pk=ids("unknown")[0])
    html = operator.get(reverse("admin:feishu_inbox_eventjob_change", args=[job.pk])).content
    text = html.decode()
    assert "im.message.receive_v1" in text and "&quot;chat_id&quot;" in text
    assert "an effect raised: outcome uncertain" in text
    assert "← this job" in text and f"head #{job.pk} (unknown)" in text
    assert "demo-worker-1" in text  # the attempt history


def test_dashboard_and_its_data(operator: Client, ledger_data: dict[str, int]) -> None:
    page = operator.get(reverse("admin:feishu_inbox_dashboard"))
    assert page.status_code == 200 and "fi-data" in page.content.decode()
    data = operator.get(reverse("admin:feishu_inbox_dashboard_data")).json()
    assert data["counts"] == ledger_data
    assert data["blocked_partitions"] == 4
    assert {b["state"] for b in data["blocked"]} == {"failed", "unknown"}
    assert all(b["waiting"] >= 1 for b in data["blocked"])
    act_page = operator.get(data["blocked"][0]["act_url"])  # the link lands on its head job
    assert act_page.status_code == 200
    assert f">{data['blocked'][0]['head_id']}</a>" in act_page.content.decode()
    assert "1 result" in act_page.content.decode()
    assert len(data["running"]) == 2 and sum(data["throughput_per_minute"]) == 24
    app_index = operator.get(reverse("admin:app_list", args=["feishu_inbox"])).content.decode()
    assert reverse("admin:feishu_inbox_dashboard") in app_index


def test_dashboard_shows_each_long_connection_live_or_lost(operator: Client) -> None:
    now = time.time()
    up = connections.Report("main", "connected", now - 60, now - 60, now - 5, now - 1, 42, "")
    down = connections.Report("other", "waiting", now - 3, None, None, None, 0, "no pong within 5s")
    connections.report("host-a", 101, [up, down])
    connections.report("host-b", 202, [up])
    FeishuConnection.objects.filter(host="host-b").update(
        reported_at=timezone.now() - connections.LOST_AFTER - timedelta(seconds=1)
    )
    data = operator.get(reverse("admin:feishu_inbox_dashboard_data")).json()
    seen = {(c["app"], c["process"]): c for c in data["connections"]}
    assert {k: c["state"] for k, c in seen.items()} == {
        ("main", "host-a:101"): "connected",
        ("other", "host-a:101"): "waiting",
        ("main", "host-b:202"): "lost",
    }
    main = seen[("main", "host-a:101")]
    assert main["events"] == 42 and main["last_pong_at"] and main["last_event_at"]
    assert seen[("other", "host-a:101")]["error"] == "no pong within 5s"
    page = operator.get(reverse("admin:feishu_inbox_dashboard")).content.decode()
    assert "Long connections (feishu_connect)" in page and "host-b:202" in page
    out = StringIO()
    call_command("inbox", "connections", "--json", stdout=out)
    assert json.loads(out.getvalue()) == data["connections"]
    out = StringIO()
    call_command("inbox", "connections", stdout=out)
    assert "host-b:202" in out.getvalue() and "lost" in out.getvalue()
    # a process that starts removes rows not reported for a day; one that stops, its own
    FeishuConnection.objects.filter(host="host-b").update(
        reported_at=timezone.now() - connections.FORGET_AFTER - timedelta(seconds=1)
    )
    assert connections.forget_lost() == 1
    connections.forget("host-a", 101)
    assert not FeishuConnection.objects.exists()


@pytest.mark.parametrize("query", ["", "?status=unknown", "?blocking=yes", "?q=default:chat"])
def test_list_page_queries_do_not_grow_with_the_ledger(
    operator: Client, django_assert_max_num_queries: Any, query: str
) -> None:
    fill()
    url = reverse(CHANGELIST) + query
    operator.get(url)  # warm caches (content types, session)
    with django_assert_max_num_queries(14) as small:
        assert operator.get(url).status_code == 200
    for _ in range(3):
        fill()
    with django_assert_max_num_queries(len(small.captured_queries)):
        assert operator.get(url).status_code == 200


def test_dashboard_queries_do_not_grow_with_the_ledger(
    operator: Client, django_assert_max_num_queries: Any
) -> None:
    fill()
    url = reverse("admin:feishu_inbox_dashboard_data")
    operator.get(url)
    # 22 on PostgreSQL, one of them stats' count of claimable due heads (which splits "due"),
    # one the long connections' rows, three the rate limits' (the clock, the buckets, the
    # jobs waiting for one), one the pauses'.
    with django_assert_max_num_queries(22) as small:
        operator.get(url)
    for _ in range(3):
        fill()
    with django_assert_max_num_queries(len(small.captured_queries)):
        operator.get(url)


def test_list_page_never_counts_the_whole_ledger(operator: Client, ledger_data: Any) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        operator.get(reverse(CHANGELIST))
    sql = " ".join(q["sql"] for q in queries.captured_queries).upper()
    assert "COUNT(" not in sql  # the paginator reads at most COUNT_CAP + 1 ids instead


def test_detail_page_renders_a_payload_of_any_depth(operator: Client) -> None:
    """A payload stored before the depth limit (or by raw SQL) still renders: the page reads
    it as text and indents it only where Python's recursion allows."""
    job = EventJobFactory()
    deep = "[" * 950 + "]" * 950
    EventJob.objects.filter(pk=job.pk).update(payload=Cast(Value(deep), JSONField()))
    response = operator.get(reverse("admin:feishu_inbox_eventjob_change", args=[job.pk]))
    assert response.status_code == 200
    # Indented (Python 3.13 encodes this deep) or as stored (older ones hit recursion limits).
    assert response.content.decode().count("[") >= 950


@pytest.mark.parametrize(
    ("codename", "action", "eligible"),
    [
        ("requeue_eventjob", "requeue_failed", "failed"),
        ("reconcile_eventjob", "reconcile_applied", "unknown"),
        ("discard_eventjob", "discard_failed", "failed"),
        ("cancel_eventjob", "cancel_jobs", "queued"),
        ("replay_eventjob", "replay_completed", "completed"),
    ],
)
def test_each_permission_grants_only_its_action(
    ledger_data: dict[str, int], codename: str, action: str, eligible: str
) -> None:
    client = staff(f"only-{codename}", "view_eventjob", codename)
    html = client.get(reverse(CHANGELIST)).content.decode()
    assert f'value="{action}"' in html
    for other in set(ACTION_NAMES) - {action}:
        if other.split("_")[0] != action.split("_")[0]:  # the two reconciles share one
            assert f'value="{other}"' not in html, other
    target = ids(eligible)[0]
    page = client.get(reverse("admin:feishu_inbox_eventjob_change", args=[target])).content
    assert f'data-action="{action}"'.encode() in page  # the job's own page offers it


def test_a_jobs_page_offers_only_the_actions_its_state_allows(operator: Client) -> None:
    fill()
    offered = {
        state: set(
            re.findall(
                r'data-action="([a-z_]+)"',
                operator.get(
                    reverse("admin:feishu_inbox_eventjob_change", args=[ids(state)[0]])
                ).content.decode(),
            )
        )
        for state in ("queued", "running", "retry_wait", "completed", "failed", "unknown")
    }
    assert offered == {
        "queued": {"cancel_jobs"},
        "running": {"cancel_jobs"},
        "retry_wait": {"cancel_jobs"},
        "completed": {"replay_completed"},
        "failed": {"requeue_failed", "discard_failed"},
        "unknown": {"reconcile_applied", "reconcile_not_applied"},
    }


def test_a_waiting_jobs_page_says_what_it_waits_for_and_offers_resume_time_out_and_cancel(
    operator: Client,
) -> None:
    import feishu_inbox
    from tests.runtime.test_waits import claim, enqueue, run_to_wait

    waiting, sleeping = enqueue("w1", chat="a"), enqueue("s1", chat="b")
    for job_id, wait in (
        (waiting, lambda: feishu_inbox.wait_for("pay:9", timeout=3600)),
        (sleeping, lambda: feishu_inbox.sleep(3600)),
    ):
        claimed = claim()
        assert claimed is not None and claimed.id == job_id
        assert run_to_wait(claimed, wait) == ("suspended", "waiting")
    page = operator.get(reverse("admin:feishu_inbox_eventjob_change", args=[waiting]))
    html = page.content.decode()
    assert set(re.findall(r'data-action="([a-z_]+)"', html)) == {
        "cancel_jobs",
        "resume_waiting",
        "time_out_waiting",
    }
    assert "signal &#x27;pay:9&#x27; (wait:1): open" in html and "its chat a given back" in html
    listed = operator.get(reverse(CHANGELIST) + "?status=waiting").content.decode()
    assert "(its chat given back while it waits)" in listed
    act(operator, "resume_waiting", [waiting], confirmed="yes")
    act(operator, "time_out_waiting", [sleeping], confirmed="yes")
    assert {j.pk: (j.status, j.partition_key) for j in EventJob.objects.all()} == {
        waiting: ("queued", "a"),
        sleeping: ("queued", "b"),
    }
    page = act(operator, "time_out_waiting", [waiting], confirmed="yes")  # not waiting now
    assert f"Cannot time out job {waiting}: it is queued" in page.content.decode()
    history = LogEntry.objects.filter(object_id=str(waiting)).values_list("change_message")
    assert any("Resume waiting jobs" in m for (m,) in history)


def test_a_button_on_a_jobs_page_goes_through_the_confirmation_and_comes_back(
    operator: Client,
) -> None:
    job = EventJobFactory()
    page_url = reverse("admin:feishu_inbox_eventjob_change", args=[job.pk])
    form = {"action": "cancel_jobs", "_selected_action": [str(job.pk)], "next": page_url}
    confirm = operator.post(reverse(CHANGELIST), form)
    assert confirm.status_code == 200 and b"fi-confirm" in confirm.content
    assert EventJob.objects.get(pk=job.pk).status == "queued"  # nothing moved yet
    done = operator.post(reverse(CHANGELIST), {**form, "confirmed": "yes"})
    assert done.status_code == 302 and done["Location"] == page_url
    assert EventJob.objects.get(pk=job.pk).error_type == "Cancelled"
    history = LogEntry.objects.get(object_id=str(job.pk))
    assert "Cancel jobs" in history.change_message and history.user.username == "operator"


def test_replay_and_cancel_report_what_they_did_in_the_admin(operator: Client) -> None:
    fill()
    completed, running = ids("completed")[:1], ids("running")[:1]
    page = act(operator, "replay_completed", completed + running, confirmed="yes")
    text = page.content.decode()
    assert f"#{running[0]}: [not_requeueable] Cannot replay job {running[0]}" in text
    page = act(operator, "cancel_jobs", running, confirmed="yes")
    assert "asked to stop at the next checkpoint" in page.content.decode()
    assert EventJob.objects.get(pk=running[0]).cancel_requested


def test_the_confirmation_page_offers_the_jobs_steps_to_run_again_from(operator: Client) -> None:
    import feishu_inbox
    from feishu_inbox.models import Step
    from tests.runtime.test_steps import InHandler

    job = EventJobFactory()
    [claimed] = ledger.claim("w")
    with InHandler(claimed):
        for name in ("fetch", "think", "draft"):
            feishu_inbox.step(name, str, name)
    with override_settings(FEISHU_INBOX={"MAX_ATTEMPTS": 1}):
        assert ledger.fail(claimed.lease, error_type="Boom") == "failed"
    page = act(operator, "requeue_failed", [job.pk])  # requeue confirms when there are steps
    html = page.content.decode()
    assert "fi-confirm" in html and 'name="from_step"' in html
    assert html.index('value="fetch"') < html.index('value="think"') < html.index('value="draft"')
    act(operator, "requeue_failed", [job.pk], confirmed="yes", from_step="think")
    assert list(Step.objects.filter(job_id=job.pk).values_list("name", flat=True)) == ["fetch"]
    assert EventJob.objects.get(pk=job.pk).status == "queued"


def test_the_job_page_shows_its_streamed_reply(operator: Client) -> None:
    from django.utils import timezone

    from feishu_inbox.models import CardStream

    job = EventJobFactory()
    CardStream.objects.create(
        job=job,
        name="answer",
        card_id="7355372766134157313",
        element_id="answer",
        message_id="om_card",
        sequence=9,
        text="Half an answer",
        marked=True,
        streaming=False,
        updated_at=timezone.now(),
    )
    html = operator.get(f"/admin/feishu_inbox/eventjob/{job.pk}/change/").content.decode()
    assert "Streamed replies" in html and "Attempts" in html  # to one who may view jobs
    for shown in ("7355372766134157313", "om_card", "14 characters: Half an answer"):
        assert shown in html
    assert "streaming off, interrupted" in html


def test_the_job_page_and_inbox_show_hide_the_verification_token(operator: Client) -> None:
    from feishu_inbox.ledger.payloads import REDACTED, text_without_secrets

    secret = "v-token-0123456789abcdef"
    job = EventJobFactory(
        payload={"schema": "2.0", "header": {"token": secret, "event_id": "e1"}, "event": {}},
    )
    v1 = EventJobFactory(payload={"token": secret, "type": "event_callback", "event": {}})
    for one in (job, v1):
        html = operator.get(f"/admin/feishu_inbox/eventjob/{one.pk}/change/").content.decode()
        assert secret not in html and "redacted" in html
    out = StringIO()
    call_command("inbox", "show", str(job.pk), stdout=out)
    assert secret not in out.getvalue() and "redacted" in out.getvalue()
    assert EventJob.objects.get(pk=job.pk).payload["header"]["token"] == secret  # kept as stored
    deep = '{"a": [[[{"token": "' + secret + '", "x": "\\"token\\": \\"y\\""}]]]}'
    assert secret not in text_without_secrets(deep) and REDACTED in text_without_secrets(deep)


def test_no_page_shows_a_secret_of_an_apps_settings(operator: Client) -> None:
    """A message that quotes an app's Encrypt Key or App Secret (pasted into a chat by
    mistake) is shown with the secret replaced, on the job page and by inbox show."""
    from django.conf import settings

    apps = {
        "default": {"ENCRYPT_KEY": "ek-0123456789-secret", "VERIFICATION_TOKEN": "short"},
        "bot": {"APP_ID": "cli_1", "APP_SECRET": "as-9876543210-secret"},
    }
    text = "my keys: ek-0123456789-secret and as-9876543210-secret, token short"
    job = EventJobFactory(payload={"event": {"message": {"content": [{"text": text}]}}})
    with override_settings(FEISHU_INBOX={**settings.FEISHU_INBOX, "APPS": apps}):
        html = operator.get(f"/admin/feishu_inbox/eventjob/{job.pk}/change/").content.decode()
        out = StringIO()
        call_command("inbox", "show", str(job.pk), "--json", stdout=out)
    for shown in (html, out.getvalue()):
        assert "0123456789" not in shown and "9876543210" not in shown
        assert "the ENCRYPT_KEY of app default" in shown and "the APP_SECRET of app bot" in shown
        assert "token short" in shown  # too short to be treated as a secret
