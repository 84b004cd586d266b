"""Store (ISV) apps (issue 53): the fake's store endpoints proven against the official SDK,
and the client's tickets and per-tenant tokens shared through the ledger."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import lark_oapi
import pytest
from django.db import connection
from django.test import Client, override_settings
from django.utils import timezone
from lark_oapi.api.auth.v3 import ResendAppTicketRequest, ResendAppTicketRequestBody
from lark_oapi.api.im.v1 import CreateMessageRequest, CreateMessageRequestBody
from lark_oapi.core.exception import ObtainAccessTokenException
from lark_oapi.core.model import RequestOption
from lark_oapi.core.token import TokenManager

from feishu_inbox.errors import ConfigurationError, Deferred
from feishu_inbox.feishu import openapi, tenancy
from feishu_inbox.ledger import credentials
from feishu_inbox.ledger import tenants as ledger_tenants
from feishu_inbox.models import EventJob
from feishu_inbox.tables.tenants import AppCredential
from tests.support.fake_feishu import FakeFeishu

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def store() -> Iterator[tuple[FakeFeishu, str]]:
    """A fake with a store app, and settings whose app "shop" is that store app."""
    app_id = f"cli_store_{secrets.token_hex(6)}"
    with FakeFeishu(apps={}, store_apps={app_id: "s3cret"}) as fake:
        apps = {
            "shop": {
                "APP_ID": app_id,
                "APP_SECRET": "s3cret",
                "DOMAIN": fake.url,
                "APP_TYPE": "store",
            }
        }
        with override_settings(FEISHU_INBOX={"APPS": apps, "STORE_TOKEN_MARGIN_SECONDS": 60}):
            credentials.forget_cached()
            try:
                yield fake, app_id
            finally:
                openapi.forget_clients()
                credentials.forget_cached()


def sdk_config(fake: FakeFeishu, app_id: str) -> Any:
    return (
        lark_oapi.Client.builder()
        .app_id(app_id)
        .app_secret("s3cret")
        .app_type(lark_oapi.AppType.ISV)
        .domain(fake.url)
        .build()
    )


def deliver_ticket(fake: FakeFeishu, app_id: str, app: str = "shop") -> None:
    """What Feishu does: POST the app_ticket event to the site's webhook."""
    response = Client().post(
        f"/feishu/{app}/events/", fake.store.push_ticket(app_id), content_type="application/json"
    )
    assert response.status_code == 200, response.content
    connection.close()


def send(tenant: str, n: int = 0) -> str:
    with ledger_tenants.tenant(tenant):
        return openapi.send_message("shop", "oc_chat", f"hi {n}", uuid=f"{tenant}-{n}")


# --- the fake, against the official SDK ---------------------------------------------------------


def test_the_sdk_gets_a_tenant_token_from_a_ticket_and_sends_as_that_tenant(
    store: tuple[FakeFeishu, str],
) -> None:
    fake, app_id = store
    ticket = fake.store.push_ticket(app_id)["event"]["app_ticket"]
    client = sdk_config(fake, app_id)
    token = TokenManager.get_isv_tenant_token(client.config, "tenant-a", ticket)
    assert token.startswith("t-") and fake.store.tenant_of(token) == "tenant-a"
    option = RequestOption.builder().tenant_key("tenant-b").app_ticket(ticket).build()
    body = {"receive_id": "oc_1", "msg_type": "text", "content": '{"text":"hi"}', "uuid": "u1"}
    request = (
        CreateMessageRequest.builder()
        .receive_id_type("chat_id")
        .request_body(CreateMessageRequestBody(body))
        .build()
    )
    answer = client.im.v1.message.create(request, option)
    assert answer.success(), answer.msg
    assert [m.tenant_key for m in fake.messages] == ["tenant-b"]
    assert fake.store.app_token_requests[app_id] == 1  # the SDK cached the app token


def test_the_fake_refuses_a_stale_ticket_and_a_bad_secret_as_feishu_does(
    store: tuple[FakeFeishu, str],
) -> None:
    fake, app_id = store
    old = fake.store.push_ticket(app_id)["event"]["app_ticket"]
    fake.store.push_ticket(app_id)  # a newer one: the old one is refused
    with pytest.raises(ObtainAccessTokenException) as refused:
        TokenManager.get_isv_app_token(sdk_config(fake, app_id).config, old)
    assert refused.value.code == 10012
    wrong = lark_oapi.Client.builder().app_id(app_id).app_secret("nope").domain(fake.url).build()
    ticket = fake.store.tickets[app_id]
    with pytest.raises(ObtainAccessTokenException) as refused:
        TokenManager.get_isv_app_token(wrong.config, ticket)
    assert refused.value.code == 10014


def test_the_sdk_asks_for_a_ticket_again(store: tuple[FakeFeishu, str]) -> None:
    fake, app_id = store
    pushed = threading.Event()
    fake.store.on_resend = lambda _: pushed.set()
    body = ResendAppTicketRequestBody({"app_id": app_id, "app_secret": "s3cret"})
    answer = sdk_config(fake, app_id).auth.v3.app_ticket.resend(
        ResendAppTicketRequest.builder().request_body(body).build()
    )
    assert answer.success() and fake.store.resends == {app_id: 1}
    assert pushed.wait(5)


# --- the client: tickets and tokens through the ledger -----------------------------------------


def test_a_ticket_event_is_stored_newest_first_and_never_made_a_job(
    store: tuple[FakeFeishu, str],
) -> None:
    fake, app_id = store
    older = fake.store.push_ticket(app_id)
    newer = fake.store.push_ticket(app_id)
    for event in (newer, older, newer):  # the older one arrives late; the newer one again
        response = Client().post("/feishu/shop/events/", event, content_type="application/json")
        assert response.status_code == 200
    assert credentials.ticket("shop") == newer["event"]["app_ticket"]
    assert not EventJob.objects.exists()  # the ticket is a secret: no payload shows it


def test_each_tenant_is_answered_with_its_own_token_fetched_once(
    store: tuple[FakeFeishu, str],
) -> None:
    fake, app_id = store
    deliver_ticket(fake, app_id)
    errors: list[BaseException] = []

    def sender(tenant: str, n: int) -> None:
        try:
            send(tenant, n)
        except BaseException as exc:  # pragma: no cover - shown by the assert
            errors.append(exc)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=sender, args=(f"tenant-{t}", n)) for t in range(5) for n in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert sorted(m.tenant_key or "" for m in fake.messages) == sorted(
        f"tenant-{t}" for t in range(5) for _ in range(4)
    )
    assert fake.store.tenant_token_requests == {(app_id, f"tenant-{t}"): 1 for t in range(5)}
    assert fake.store.app_token_requests == {app_id: 1}
    fetched = credentials.fetches("shop")
    assert fetched[("tenant", "tenant-3")] == 1 and fetched[("app", "")] == 1


def test_a_missing_ticket_is_asked_for_once_and_defers_the_reply(
    store: tuple[FakeFeishu, str],
) -> None:
    fake, app_id = store
    with ledger_tenants.tenant("tenant-a"), pytest.raises(Deferred) as deferred:
        openapi.ready("shop")
    assert deferred.value.seconds == tenancy.TICKET_WAIT_SECONDS
    with pytest.raises(tenancy.TicketMissing):
        send("tenant-b")  # inside a call: a transient failure, nothing sent
    assert fake.store.resends == {app_id: 1}  # one request a minute, however many ask
    assert not fake.messages and not fake.store.app_token_requests
    deliver_ticket(fake, app_id)
    send("tenant-a")
    assert [m.tenant_key for m in fake.messages] == ["tenant-a"]


def test_a_fetch_held_by_another_worker_past_the_wait_defers_the_reply(
    store: tuple[FakeFeishu, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another worker holds the tenant token's fetch lease (its fetch is slow, or it died
    holding it) for the whole wait: the reply is deferred (no attempt spent), nothing sent,
    nothing fetched twice."""
    fake, app_id = store
    deliver_ticket(fake, app_id)
    monkeypatch.setattr(credentials, "WAIT_SECONDS", 0.2)
    credentials._ensure("shop", credentials.TENANT_TOKEN, "tenant-a")
    AppCredential.objects.filter(kind=credentials.TENANT_TOKEN, tenant="tenant-a").update(
        fetching_by="another", fetching_until=timezone.now() + timedelta(minutes=1)
    )
    with ledger_tenants.tenant("tenant-a"), pytest.raises(Deferred) as deferred:
        openapi.ready("shop")
    assert deferred.value.seconds == tenancy.TICKET_WAIT_SECONDS
    assert not fake.messages and not fake.store.tenant_token_requests


def test_a_refused_ticket_is_dropped_and_asked_for_again(store: tuple[FakeFeishu, str]) -> None:
    fake, app_id = store
    deliver_ticket(fake, app_id)
    fake.store.push_ticket(app_id)  # Feishu moved on; the site missed the event
    with pytest.raises(tenancy.TicketMissing):
        send("tenant-a")
    assert credentials.ticket("shop") == "" and fake.store.resends == {app_id: 1}


def test_a_revoked_tenant_token_is_fetched_anew_once(store: tuple[FakeFeishu, str]) -> None:
    fake, app_id = store
    deliver_ticket(fake, app_id)
    send("tenant-a", 1)
    with fake._lock:
        fake.store.tenant_tokens.clear()  # revoked: 99991663
    send("tenant-a", 2)
    assert fake.store.tenant_token_requests[(app_id, "tenant-a")] == 2
    assert [m.tenant_key for m in fake.messages] == ["tenant-a", "tenant-a"]


def test_a_store_app_call_without_a_tenant_is_a_configuration_error(
    store: tuple[FakeFeishu, str],
) -> None:
    with pytest.raises(ConfigurationError, match="store app"):
        openapi.send_message("shop", "oc_chat", "hi", uuid="u-none")


def test_a_tenant_key_reaches_the_job_from_the_webhook(store: tuple[FakeFeishu, str]) -> None:
    envelope = {
        "schema": "2.0",
        "header": {
            "event_id": "ev-tenant",
            "event_type": "test.noop",
            "tenant_key": "tenant-xyz",
            "app_id": store[1],
            "token": "",
        },
        "event": {"message": {"chat_id": "oc_1", "message_id": "om_1"}},
    }
    response = Client().post("/feishu/shop/events/", envelope, content_type="application/json")
    assert response.status_code == 200
    assert EventJob.objects.get(event_id="ev-tenant").tenant == "tenant-xyz"


def test_the_sdk_client_of_a_store_app_takes_the_shared_tenant_token(
    store: tuple[FakeFeishu, str],
) -> None:
    from feishu_inbox.feishu.replies import client, tenant_token

    fake, app_id = store
    deliver_ticket(fake, app_id)
    with ledger_tenants.tenant("tenant-a"):
        token = tenant_token("shop")
    assert fake.store.tenant_of(token) == "tenant-a"
    body = {"receive_id": "oc_1", "msg_type": "text", "content": '{"text":"hi"}', "uuid": "u9"}
    request = (
        CreateMessageRequest.builder()
        .receive_id_type("chat_id")
        .request_body(CreateMessageRequestBody(body))
        .build()
    )
    option = RequestOption.builder().tenant_access_token(token).build()
    assert client("shop").im.v1.message.create(request, option).success()
    assert [m.tenant_key for m in fake.messages] == ["tenant-a"]
    assert tenant_token("shop", "tenant-a") == token  # cached: no second fetch
    assert fake.store.tenant_token_requests == {(app_id, "tenant-a"): 1}
