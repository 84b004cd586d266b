"""A store (ISV) app on real ``runworker`` processes (issue 53): the events of 50 tenants,
each answered with its own tenant's token against the fake Open API; one token fetch per
tenant across 3 workers; a token that expires mid-run renewed once; and a missing ticket (the
first hour after install) asked for again, its jobs deferred, not failed."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import Client, override_settings

from feishu_inbox.ledger import credentials
from feishu_inbox.models import Attempt, EventJob
from tests.support.fake_feishu import FakeFeishu
from tests.support.processes import wait_for
from tests.support.worker_helpers import Workers, wait_all_completed

pytestmark = pytest.mark.django_db(transaction=True)

TENANTS, WORKERS = 50, 3
#: The first tenant's tokens live this long (the others' two hours); a token is fetched anew
#: when less than MARGIN seconds of it are left: it expires mid-run.
SHORT_LIFE, MARGIN = 12, 2
SECRET = "s3cret"


@pytest.fixture
def fake() -> Iterator[tuple[FakeFeishu, str]]:
    app_id = f"cli_isv_{secrets.token_hex(4)}"
    with FakeFeishu(apps={}, store_apps={app_id: SECRET}) as fake:
        fake.store.tenant_expire["tenant-00"] = SHORT_LIFE
        apps = {"default": {"APP_ID": app_id, "APP_SECRET": SECRET, "APP_TYPE": "store"}}
        with override_settings(FEISHU_INBOX={"APPS": apps}):  # the webhook's, in this process
            yield fake, app_id
    credentials.forget_cached()


def post(body: dict[str, Any]) -> None:
    """Deliver to the site's webhook, as Feishu does (its answer must be 200)."""
    response = Client().post("/feishu/events/", body, content_type="application/json")
    assert response.status_code == 200, response.content
    connection.close()


def message(fake: FakeFeishu, n: int, tenant: str, chat: str) -> dict[str, Any]:
    message_id = f"om_{tenant}_{n}"
    fake.add_inbound(message_id, chat)
    return {
        "schema": "2.0",
        "header": {
            "event_id": f"ev-{tenant}-{n}",
            "event_type": "test.reply",
            "tenant_key": tenant,
            "create_time": str(int(time.time() * 1000)),
            "token": "",
        },
        "event": {"message": {"message_id": message_id, "chat_id": chat}},
        "text": f"for {tenant} #{n}",
    }


def test_a_store_app_answers_each_tenant_with_its_own_token_fetched_once(
    workers: Workers, fake: tuple[FakeFeishu, str]
) -> None:
    feishu, app_id = fake
    # Feishu pushes the ticket when asked (the app was just installed: none came yet).
    feishu.store.on_resend = lambda _: post(feishu.store.push_ticket(app_id))
    env = {
        "FEISHU_APP_ID": app_id,
        "FEISHU_APP_SECRET": SECRET,
        "FEISHU_DOMAIN": feishu.url,
        "FEISHU_APP_TYPE": "store",
        "FEISHU_INBOX_STORE_TOKEN_MARGIN": str(MARGIN),
        "FEISHU_INBOX_MAX_ATTEMPTS": "5",
        "FEISHU_INBOX_BACKOFF_BASE": "0.1",
        "FEISHU_INBOX_POLL_INTERVAL": "0.2",
    }
    procs = [workers.start("--concurrency", "4", **env) for _ in range(WORKERS)]

    # 50 tenants: two chats each (the first tenant one message, so its short-lived token is
    # fetched once in this first part), posted from two threads at once.
    sent: list[dict[str, Any]] = []
    for t in range(TENANTS):
        tenant = f"tenant-{t:02d}"
        for n in range(1 if t == 0 else 2):
            sent.append(message(feishu, n, tenant, f"oc_{tenant}_{n}"))
    halves = [sent[0::2], sent[1::2]]
    posters = [threading.Thread(target=lambda h=h: [post(b) for b in h]) for h in halves]
    for poster in posters:
        poster.start()
    for poster in posters:
        poster.join()
    wait_all_completed(len(sent), 180, lambda: workers.stderr(procs[0]))

    # Each reply went out once, with the token of the event's tenant.
    replied = {m.parent_id: m.tenant_key for m in feishu.messages}
    assert len(feishu.messages) == len(sent)
    assert replied == {b["event"]["message"]["message_id"]: b["header"]["tenant_key"] for b in sent}
    # One fetch per tenant across the three workers, one app token, one resend.
    assert feishu.store.tenant_token_requests == {
        (app_id, f"tenant-{t:02d}"): 1 for t in range(TENANTS)
    }
    assert feishu.store.app_token_requests == {app_id: 1}
    assert feishu.store.resends == {app_id: 1}
    # The missing ticket deferred jobs, spending no attempt, failing none.
    waited = Attempt.objects.filter(error_message__contains="no app_ticket").count()
    assert waited >= 1
    assert set(EventJob.objects.values_list("attempt", flat=True)) == {1}
    assert set(EventJob.objects.values_list("tenant", flat=True)) == {
        f"tenant-{t:02d}" for t in range(TENANTS)
    }

    # The first tenant's token nears its expiry: its next events fetch a new one, once.
    def first_token_stale() -> bool:
        with feishu._lock:
            ends = [e for _, t, e in feishu.store.tenant_tokens.values() if t == "tenant-00"]
        return bool(ends) and max(ends) - MARGIN < time.time()

    wait_for(first_token_stale, SHORT_LIFE + 10, "tenant-00's token to near its expiry")
    later = [message(feishu, n, "tenant-00", "oc_tenant-00_0") for n in (10, 11)]
    later.append(message(feishu, 10, "tenant-01", "oc_tenant-01_0"))
    for body in later:
        post(body)
    wait_all_completed(len(sent) + len(later), 120, lambda: workers.stderr(procs[0]))
    by_tenant = Counter(m.tenant_key for m in feishu.messages[len(sent) :])
    assert by_tenant == {"tenant-00": 2, "tenant-01": 1}
    assert feishu.store.tenant_token_requests[(app_id, "tenant-00")] == 2  # renewed once
    assert feishu.store.tenant_token_requests[(app_id, "tenant-01")] == 1
    assert feishu.store.app_token_requests == {app_id: 1}
    texts = {json.loads(m.content)["text"] for m in feishu.messages}
    assert "for tenant-00 #11" in texts
    # No secret reached a worker's log.
    logs = "".join(workers.stderr(p) for p in procs)
    ticket = feishu.store.tickets[app_id]
    assert ticket not in logs and SECRET not in logs
    assert not any(token in logs for token in feishu.store.tenant_tokens)
