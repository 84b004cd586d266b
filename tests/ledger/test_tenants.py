"""Tenants (issue 53, SPEC §9j): every job belongs to one; dedupe keys are unique per tenant;
a site may require a tenant; admin, ``inbox list`` and the queryset filter by it; the
per-tenant gauges stay bounded."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client, override_settings

import feishu_inbox
from feishu_inbox import ledger, webhooks
from feishu_inbox.errors import CATALOGUE, TenantRequired, WorkflowRefused
from feishu_inbox.ledger import stats
from feishu_inbox.ledger.schedules import Occurrence
from feishu_inbox.models import EventJob
from feishu_inbox.monitoring import exposition
from feishu_inbox.workflows import job
from tests.support import worker_tasks as t

pytestmark = pytest.mark.django_db


def enqueue(key: str = "k1", tenant: str | None = None, **extra: Any) -> ledger.EnqueueResult:
    return ledger.enqueue(
        event_id=key,
        event_type="test.noop",
        partition_key=f"chat-{key}",
        payload={},
        tenant=tenant,
        **extra,
    )


# --- uniqueness --------------------------------------------------------------------------------


def test_a_dedupe_key_is_unique_per_tenant() -> None:
    a, b = enqueue(tenant="acme"), enqueue(tenant="globex")
    assert a.created and b.created and a.job_id != b.job_id
    again = enqueue(tenant="acme")
    assert (again.created, again.job_id) == (False, a.job_id)  # the tenant's own duplicate
    assert EventJob.objects.of_tenant("acme").get().pk == a.job_id


def test_without_tenants_a_dedupe_key_is_unique_as_before() -> None:
    first = enqueue()
    again = enqueue(tenant="")
    assert (again.created, again.job_id) == (False, first.job_id)
    assert EventJob.objects.get().tenant == ""


def test_the_same_event_delivered_twice_to_a_tenant_is_one_job() -> None:
    for _ in range(2):
        enqueue("ev-1", tenant="acme", dedupe_key="message:om_1")
    enqueue("ev-2", tenant="acme", dedupe_key="message:om_1")  # another event id, same message
    assert EventJob.objects.count() == 1


# --- declaring, and requiring, a tenant ------------------------------------------------------


def test_a_tenant_block_declares_the_tenant_of_what_is_enqueued_inside_it() -> None:
    with feishu_inbox.tenant("acme"):
        enqueue("k1")
        enqueue("k2", tenant="globex")  # its own wins
        result = t.noop.enqueue()  # a django.tasks task
    enqueue("k3")
    tenants = dict(EventJob.objects.values_list("event_id", "tenant"))
    assert tenants == {"k1": "acme", "k2": "globex", result.id: "acme", "k3": ""}


@override_settings(FEISHU_INBOX={"TENANT_REQUIRED": True})
def test_a_site_that_requires_a_tenant_refuses_a_job_without_one() -> None:
    with pytest.raises(TenantRequired) as refused:
        enqueue("k1")
    assert refused.value.code == "job_tenant_required"
    assert "TENANT_REQUIRED" in refused.value.message and "tenant=" in refused.value.fix
    assert refused.value.code in CATALOGUE
    with pytest.raises(TenantRequired):
        t.noop.enqueue()
    with pytest.raises(TenantRequired):
        webhooks.publish("order.paid", {"id": 1})
    assert not EventJob.objects.exists()
    enqueue("k2", tenant="")  # explicitly none
    enqueue("k3", tenant="acme")
    with feishu_inbox.tenant(""):
        t.noop.enqueue()
    Occurrence("schedule:s:1", "schedule.s", "schedule:s", {}).enqueue()  # site-wide: none
    assert EventJob.objects.count() == 4


@override_settings(FEISHU_INBOX={"TENANT_REQUIRED": True})
def test_a_chain_or_batch_without_a_tenant_is_refused_when_made_never_when_it_fires() -> None:
    """A chain's later links and a batch's callbacks are enqueued by a worker, outside the
    maker's block: their tenant is decided when they are made, so a site that requires one
    refuses the chain then, in the maker's transaction (nothing stored), instead of a link
    that can never be stored later."""
    with pytest.raises(TenantRequired):
        feishu_inbox.chain(job("test.noop"), job("test.noop"))
    with pytest.raises(TenantRequired):
        feishu_inbox.batch([job("test.noop", tenant="acme")], on_success=job("test.noop"))
    assert not EventJob.objects.exists()
    with feishu_inbox.tenant("acme"):
        handle = feishu_inbox.chain(job("test.noop"), job("test.noop"))
    assert EventJob.objects.get(pk=handle.job_ids[0]).tenant == "acme"
    feishu_inbox.chain(job("test.noop", tenant=""), job("test.noop", tenant=""))  # site-wide


def test_a_tenant_longer_than_its_column_is_refused() -> None:
    with pytest.raises(ledger.LedgerError, match="at most 64"):
        enqueue("k1", tenant="x" * 65)
    with pytest.raises(WorkflowRefused):
        job("test.noop", tenant="x" * 65)
    assert not EventJob.objects.exists()


def test_schedules_webhooks_and_workflow_specs_carry_their_tenant() -> None:
    Occurrence("schedule:s:1", "schedule.s", "schedule:s", {}, tenant="acme").enqueue()
    webhooks.add_endpoint("https://hooks.example.com/in")
    webhooks.publish("order.paid", {"id": 1}, tenant="globex")
    assert job("test.noop", tenant="initech").as_dict()["tenant"] == "initech"
    with feishu_inbox.tenant("acme"):
        assert job("test.noop").as_dict()["tenant"] == "acme"  # its maker's
    assert job("test.noop").as_dict()["tenant"] == ""  # none, decided by its maker
    tenants = dict(EventJob.objects.values_list("app", "tenant"))
    assert tenants == {"default": "acme", "webhooks": "globex"}


# --- filters -----------------------------------------------------------------------------------


def test_inbox_list_filters_by_tenant(capsys: pytest.CaptureFixture[str]) -> None:
    enqueue("k1", tenant="acme")
    enqueue("k2", tenant="globex")
    enqueue("k3")
    call_command("inbox", "list", "--tenant", "acme", "--json")
    rows = json.loads(capsys.readouterr().out)
    assert [(r["event_id"], r["tenant"]) for r in rows] == [("k1", "acme")]
    call_command("inbox", "list", "--tenant", "", "--json")
    assert [r["event_id"] for r in json.loads(capsys.readouterr().out)] == ["k3"]


def test_the_admin_filters_by_tenant_and_offers_the_busiest() -> None:
    for n in range(3):
        enqueue(f"a{n}", tenant="acme")
    enqueue("g0", tenant="globex")
    enqueue("none0")
    user = User.objects.create_superuser("op", password="pw")
    client = Client()
    client.force_login(user)
    url = "/admin/feishu_inbox/eventjob/"
    shown = client.get(url, {"tenant": "globex"}).context["cl"].result_list
    assert [j.event_id for j in shown] == ["g0"]
    shown = client.get(url, {"tenant": "-"}).context["cl"].result_list
    assert [j.event_id for j in shown] == ["none0"]
    choices = client.get(url).content.decode()
    assert choices.index("?tenant=acme") < choices.index("?tenant=globex")  # busiest first


# --- metrics -----------------------------------------------------------------------------------


def test_tenant_gauges_name_the_busiest_and_sum_the_rest() -> None:
    for tenant, n in (("big", 5), ("mid", 3), ("small", 1), ("tiny", 1)):
        for k in range(n):
            enqueue(f"{tenant}{k}", tenant=tenant)
    enqueue("plain")
    loads = {x.tenant: x.backlog for x in stats.tenant_load(2)}
    assert loads == {"big": 5, "mid": 3, "other": 3}  # small, tiny and no tenant's
    with override_settings(FEISHU_INBOX={"TENANT_METRICS_TOP": 1}):
        text = exposition()[0].decode()
    lines = [line for line in text.splitlines() if line.startswith("feishu_inbox_ledger_tenant")]
    assert 'feishu_inbox_ledger_tenant_jobs{state="backlog",tenant="big"} 5.0' in lines
    assert 'feishu_inbox_ledger_tenant_jobs{state="backlog",tenant="other"} 6.0' in lines
    assert len(lines) == 4  # two tenants (one and the rest) x two states: bounded


# --- the tenant at ingress, and in a job's limits ---------------------------------------------


def test_both_ingress_paths_take_a_store_apps_tenant_key_and_a_self_built_apps_is_none() -> None:
    from feishu_inbox.feishu import inbound, protocol

    apps = {"default": {"APP_ID": "cli_self"}, "shop": {"APP_ID": "cli_isv", "APP_TYPE": "store"}}
    with override_settings(FEISHU_INBOX={"APPS": apps}):
        for app in ("shop", "default"):
            v2 = {
                "schema": "2.0",
                "header": {"event_id": f"{app}2", "event_type": "x", "tenant_key": "t2"},
            }
            v1 = {
                "uuid": f"{app}1",
                "type": "event_callback",
                "event": {"type": "x", "tenant_key": "t1"},
            }
            for body, transport in ((v2, "webhook"), (v1, "long_connection")):
                envelope = protocol.parse_envelope(body, json.dumps(body))
                inbound.store(app, envelope, transport=transport)
    # a self-built app's one organisation is no tenant: its events dedupe as before tenants
    assert dict(EventJob.objects.values_list("event_id", "tenant")) == {
        "shop2": "t2",
        "shop1": "t1",
        "default2": "",
        "default1": "",
    }


def test_a_limit_may_be_keyed_by_any_jobs_tenant() -> None:
    from feishu_inbox.runtime.context import Event
    from feishu_inbox.runtime.limits import job_values

    event = Event(1, "e", "report.build", "django.tasks", {}, "p", 1, False, tenant="acme")
    assert job_values(event)["tenant"] == "acme"
    bucket = feishu_inbox.RateLimit("reports:{tenant}", 2).bucket(job_values(event))
    assert bucket.key == "reports:acme"


def test_a_replay_is_refused_by_its_own_tenants_live_duplicate_only() -> None:
    from feishu_inbox.ledger import operators

    done = [enqueue(key, tenant="acme").job_id for key in ("k1", "k2")]
    for claimed in ledger.claim("w1", limit=2):
        ledger.finish(claimed.lease)
    enqueue("k1", tenant="globex")  # another tenant's live job of the same event: no bar
    enqueue("k2", tenant="acme", dedupe_key="k2-again")  # the tenant's own: a bar
    outcome = operators.replay(done)
    assert outcome.done == [done[0]]
    assert outcome.refused[done[1]].code == "duplicate"


def test_settings_name_a_wrong_app_type_and_tenant_gauge_size() -> None:
    from feishu_inbox.conf import InboxSettings

    problems = InboxSettings(APPS={"shop": {"APP_TYPE": "isv"}}, TENANT_METRICS_TOP=1000).validate()
    assert any("APP_TYPE" in p and "store" in p for p in problems)
    assert any("TENANT_METRICS_TOP" in p for p in problems)


def test_the_job_tables_triggers_survive_the_tenants_migration_on_sqlite() -> None:
    """SQLite rebuilds a table to change its constraints, which drops its triggers: 0037
    makes the workflows' member trigger again (it counts a batch's ended members)."""
    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL changes the constraint in place")
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        assert ("feishu_inbox_member_moved",) in cursor.fetchall()
