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
def exports() -> Iterator[kinds.JobKind]:
    """A kind as a capability adds one: its jobs all run one function."""
    ran: list[str] = []
    kind = kinds.JobKind(
        "export",
        "data exports",
        "export:",
        run=lambda event: ran.append(event.event_id),
        timeout=lambda event_type: 15.0,
        describe_error=lambda error: ("DeliveryFailed", str(error)),
    )
    kinds.register(kind)
    yield kind
    kinds.unregister("export")


def test_the_built_in_kinds_are_registered_when_the_app_is_ready() -> None:
    assert kinds.choices() == {
        "event": "Feishu events",
        "schedule": "schedule occurrences",
        "task": "django.tasks tasks",
        "webhook": "outbound webhook deliveries",
        "reaction": "reaction cleanups",
    }
    assert kinds.kind_of("im.message.receive_v1").name == "event"
    assert kinds.kind_of("webhook:ep_1").name == "webhook"
    assert kinds.kind_of("schedule.nightly").name == "schedule"
    assert kinds.kind_of("task:app.tasks.send").name == "task"


def test_a_registered_kind_is_what_the_worker_runs_and_the_admin_and_cli_offer(
    exports: kinds.JobKind, rf: object
) -> None:
    for event_id, event_type in [("e1", "im.message.receive_v1"), ("w1", "export:orders")]:
        ledger.enqueue(event_id=event_id, event_type=event_type, partition_key=event_id, payload={})
    assert registry.handler_for("export:orders", {}) is exports.run
    assert registry.timeout_for("export:orders") == 15.0
    assert registry.describe_error("export:orders", ValueError("410")) == (
        "DeliveryFailed",
        "410",
    )
    jobs = EventJob.objects.all()
    assert [j.event_id for j in kinds.of_kind(jobs, "export")] == ["w1"]
    assert [j.event_id for j in kinds.of_kind(jobs, "event")] == ["e1"]  # no longer its own
    assert ("export", "data exports") in KindFilter.lookups(
        KindFilter.__new__(KindFilter),
        None,
        None,  # type: ignore[arg-type]
    )
    out = StringIO()
    call_command("inbox", "list", "--kind", "export", stdout=out, stderr=StringIO())
    assert "w1" in out.getvalue() and "e1" not in out.getvalue()


def test_two_kinds_cannot_claim_one_prefix(exports: kinds.JobKind) -> None:
    with pytest.raises(ValueError, match="has the prefix 'export:' of kind 'export'"):
        kinds.register(kinds.JobKind("exports", "exports", "export:"))
    assert "exports" not in kinds.choices()
