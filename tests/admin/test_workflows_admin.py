"""Workflows for operators (SPEC §9f): a job's tree on its page and in ``inbox show``, the
Workflows page with its counts, its actions behind ``manage_workflow``, the open-batches gauge."""

from __future__ import annotations

import json
import time
from io import StringIO
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.urls import reverse

import feishu_inbox
from feishu_inbox.ledger import rules
from feishu_inbox.models import EventJob
from feishu_inbox.tables.batches import Batch
from tests.admin.test_admin import staff
from tests.workflows.test_workflows import claim_job, complete, enqueue, fail, fire, run

pytestmark = pytest.mark.django_db


def tree() -> tuple[int, list[int], int]:
    """A waiting parent with three children (one of which spawned a grandchild)."""
    parent = enqueue("p1", event_type="test.parent")

    def body() -> Any:
        kids = feishu_inbox.spawn_many("test.child", [{}, {}, {}])
        return feishu_inbox.wait_all(kids)

    run(claim_job(parent), body)
    kids = list(
        EventJob.objects.filter(parent_id=parent).order_by("id").values_list("id", flat=True)
    )
    _, grandchild = run(claim_job(kids[0]), lambda: feishu_inbox.spawn("test.grandchild"))
    return parent, kids, grandchild.job_id


def test_a_jobs_page_shows_its_tree_and_its_childrens_their_parent() -> None:
    parent, kids, grandchild = tree()
    viewer = staff("viewer", "view_eventjob")
    page = viewer.get(reverse("admin:feishu_inbox_eventjob_change", args=[parent])).content
    html = page.decode()
    assert "Descendants by state" in html
    for job_id in [*kids, grandchild]:
        assert f"/feishu_inbox/eventjob/{job_id}/change/" in html
    assert "test.grandchild" in html and "children" in html  # its wait's batch
    child = viewer.get(reverse("admin:feishu_inbox_eventjob_change", args=[kids[1]])).content
    assert f'Child of <a href="/admin/feishu_inbox/eventjob/{parent}/change/"' in child.decode()
    assert "Counts in" in child.decode()


def test_inbox_show_prints_the_tree() -> None:
    parent, kids, grandchild = tree()
    out = StringIO()
    call_command("inbox", "show", str(parent), stdout=out)
    text = out.getvalue()
    assert "workflow:" in text and "descendants: 1 queued, 3 running" not in text
    assert f"    #{kids[0]} test.child running" in text
    assert f"      #{grandchild} test.grandchild queued" in text  # indented under its parent
    assert "children #" in text
    out = StringIO()
    call_command("inbox", "show", str(parent), "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert [n["id"] for n in data["workflow"]["tree"]] == [*kids, grandchild]
    assert data["workflow"]["descendants"] == {"queued": 3, "running": 1}


def test_the_workflows_page_lists_batches_and_its_actions_need_their_permission(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A claim folds due batches when its process has not swept for a second
    # (rules._maybe_sweep): under load the claims below are that far apart, and the listing
    # would show the fold before fire() does it. This test folds only by fire().
    monkeypatch.setattr(rules, "EXPIRY_SWEEP_INTERVAL", 3600.0)
    monkeypatch.setattr(rules, "_last_sweep", [time.monotonic()])
    handle = feishu_inbox.batch(
        ["test.member", "test.member", "test.member"], on_complete="test.always"
    )
    fail(handle.job_ids[0])
    complete(handle.job_ids[1])
    viewer = staff("viewer", "view_eventjob")
    listing = viewer.get(reverse("admin:feishu_inbox_batch_changelist")).content.decode()
    assert f">{handle.id}<" in listing and "2 / 3" not in listing  # folded: 1 pending of 3
    fire()
    listing = viewer.get(reverse("admin:feishu_inbox_batch_changelist")).content.decode()
    assert "1 / 3" in listing
    page = viewer.get(reverse("admin:feishu_inbox_batch_change", args=[handle.id])).content
    assert "on complete: test.always" in page.decode()
    # A viewer has no action; a forged POST moves nothing.
    assert "retry_failed_members" not in listing
    viewer.post(
        reverse("admin:feishu_inbox_batch_changelist"),
        {"action": "retry_failed_members", "_selected_action": [handle.id]},
    )
    assert EventJob.objects.get(pk=handle.job_ids[0]).status == "failed"

    manager = staff("manager", "view_eventjob", "manage_workflow")
    manager.post(
        reverse("admin:feishu_inbox_batch_changelist"),
        {"action": "retry_failed_members", "_selected_action": [handle.id]},
    )
    assert EventJob.objects.get(pk=handle.job_ids[0]).status == "queued"
    manager.post(
        reverse("admin:feishu_inbox_batch_changelist"),
        {"action": "cancel_workflow", "_selected_action": [handle.id]},
    )
    assert [(j.status, j.error_type) for j in EventJob.objects.filter(pk__in=handle.job_ids)] == [
        ("completed", "Cancelled"),
        ("completed", ""),
        ("completed", "Cancelled"),
    ]
    fire()
    assert Batch.objects.get(pk=handle.id).state == "fired"
    assert EventJob.objects.filter(event_type="test.always").count() == 1
    assert LogEntry.objects.filter(object_id=str(handle.id)).count() == 2


def test_the_open_batches_gauge_counts_batches_not_fired() -> None:
    pytest.importorskip("prometheus_client")
    from feishu_inbox.monitoring import _ledger_families

    feishu_inbox.batch(["test.member"], open=True)
    feishu_inbox.chain("test.a", "test.b")
    families = {f.name: f for f in _ledger_families()}
    samples = {
        (s.labels["kind"], s.labels["state"]): s.value
        for s in families["feishu_inbox_ledger_open_batches"].samples
    }
    assert samples == {("batch", "open"): 1, ("chain", "closed"): 1}
