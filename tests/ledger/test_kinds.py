"""The kinds of job in one open registry: the built-in kinds are registered when the app is
ready, and a kind registered later is read by the worker, the admin's filter and the CLI."""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import call_command

from feishu_inbox import ledger
from feishu_inbox.admin.filters import KindFilter
from feishu_inbox.ledger import kinds
from feishu_inbox.models import EventJob
from feishu_inbox.runtime import registry

pytestmark = pytest.mark.django_db


@pytest.fixture
def reports() -> Iterator[kinds.JobKind]:
    """A kind as a capability adds one: its jobs all run one function (not a built-in's name
    or prefix: its teardown must not unregister one)."""
    ran: list[str] = []
    kind = kinds.JobKind(
        "report",
        "data reports",
        "report:",
        run=lambda event: ran.append(event.event_id),
        timeout=lambda event_type: 15.0,
        describe_error=lambda error: ("DeliveryFailed", str(error)),
    )
    kinds.register(kind)
    yield kind
    kinds.unregister("report")


def test_the_built_in_kinds_are_registered_when_the_app_is_ready() -> None:
    assert kinds.choices() == {
        "event": "Feishu events",
        "schedule": "schedule occurrences",
        "task": "django.tasks tasks",
        "webhook": "outbound webhook deliveries",
        "reaction": "reaction cleanups",
        "backfill": "backfill runs",
        "export": "exports",
    }
    assert kinds.kind_of("im.message.receive_v1").name == "event"
    assert kinds.kind_of("webhook:ep_1").name == "webhook"
    assert kinds.kind_of("schedule.nightly").name == "schedule"
    assert kinds.kind_of("task:app.tasks.send").name == "task"
    assert kinds.kind_of("backfill:orders.fill").name == "backfill"
    assert kinds.kind_of("export:orders-2026").name == "export"


def test_a_registered_kind_is_what_the_worker_runs_and_the_admin_and_cli_offer(
    reports: kinds.JobKind, rf: object
) -> None:
    for event_id, event_type in [("e1", "im.message.receive_v1"), ("w1", "report:orders")]:
        ledger.enqueue(event_id=event_id, event_type=event_type, partition_key=event_id, payload={})
    assert registry.handler_for("report:orders", {}) is reports.run
    assert registry.timeout_for("report:orders") == 15.0
    assert registry.describe_error("report:orders", ValueError("410")) == (
        "DeliveryFailed",
        "410",
    )
    jobs = EventJob.objects.all()
    assert [j.event_id for j in kinds.of_kind(jobs, "report")] == ["w1"]
    assert [j.event_id for j in kinds.of_kind(jobs, "event")] == ["e1"]  # no longer its own
    assert ("report", "data reports") in KindFilter.lookups(
        KindFilter.__new__(KindFilter),
        None,
        None,  # type: ignore[arg-type]
    )
    out = StringIO()
    call_command("inbox", "list", "--kind", "report", stdout=out, stderr=StringIO())
    assert "w1" in out.getvalue() and "e1" not in out.getvalue()


def test_two_kinds_cannot_claim_one_prefix(reports: kinds.JobKind) -> None:
    with pytest.raises(ValueError, match="has the prefix 'report:' of kind 'report'"):
        kinds.register(kinds.JobKind("reports", "reports", "report:"))
    assert "reports" not in kinds.choices()
