"""``manage.py inbox send-test-event``: a text message event built, encrypted and signed as
Feishu does, sent to a real webhook server (gunicorn), stored once; a refusal or an absent
server is a clear error."""

from __future__ import annotations

import time
from collections.abc import Iterator
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings

from feishu_inbox.feishu import deliveries, protocol
from feishu_inbox.models import EventJob
from tests.support.feishu_client import ENCRYPT_KEY, TOKEN
from tests.support.processes import free_port, start_server

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = free_port()
    proc = start_server(
        port, FEISHU_ENCRYPT_KEY=ENCRYPT_KEY, FEISHU_VERIFICATION_TOKEN=TOKEN, LOG_LEVEL="ERROR"
    )
    try:
        yield f"http://127.0.0.1:{port}/feishu/events/"
    finally:
        proc.terminate()
        proc.wait(30)


def with_secrets(key: str = ENCRYPT_KEY, token: str = TOKEN) -> override_settings:
    apps = {"default": {"ENCRYPT_KEY": key, "VERIFICATION_TOKEN": token}}
    return override_settings(FEISHU_INBOX={**settings.FEISHU_INBOX, "APPS": apps})


def test_a_test_event_reaches_the_webhook_and_is_stored(server: str) -> None:
    out = StringIO()
    with with_secrets():
        call_command(
            "inbox", "send-test-event", "--url", server, "--text", "ping", "--private", stdout=out
        )
    assert "200" in out.getvalue() and '"duplicate": false' in out.getvalue()
    [job] = EventJob.objects.filter(event_type="im.message.receive_v1")
    # The job it made, as docs/operating.md says.
    assert f"event {job.event_id} stored as job {job.pk} (queued)" in out.getvalue()
    assert f"manage.py inbox show {job.pk}" in out.getvalue()
    message = job.payload["event"]["message"]
    assert message["content"] == '{"text": "ping"}' and message["chat_type"] == "p2p"
    assert job.private_message and job.partition_key.startswith("default:")


def test_the_delivery_is_what_the_protocol_opens() -> None:
    with with_secrets():
        body, headers = deliveries.message(text="hi", chat_id="oc_x")
        delivery = protocol.open_delivery(
            app="default",
            secrets={"ENCRYPT_KEY": ENCRYPT_KEY, "VERIFICATION_TOKEN": TOKEN},
            body=body,
            headers={f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()},
            replay_window=300,
            now=time.time(),
        )
    assert delivery.envelope is not None and delivery.envelope.event_type.endswith("receive_v1")
    with with_secrets(key=""):  # an app without an Encrypt Key: plaintext with the token
        body, headers = deliveries.message(text="hi")
    assert b'"token": "' + TOKEN.encode() in body and "X-Lark-Signature" not in headers


def test_a_refusal_and_an_absent_server_are_clear_errors(server: str) -> None:
    with with_secrets(key="another-key"), pytest.raises(CommandError, match="answered 4"):
        call_command("inbox", "send-test-event", "--url", server)
    assert not EventJob.objects.exists()
    dead = f"http://127.0.0.1:{free_port()}/feishu/events/"
    with with_secrets(), pytest.raises(CommandError, match=r"Could not reach .*make demo") as no:
        call_command("inbox", "send-test-event", "--url", dead)
    assert "--url names another server's webhook" in str(no.value)
    with with_secrets(), pytest.raises(CommandError, match="http:// or https://"):
        call_command("inbox", "send-test-event", "--url", "file:///etc/passwd")
    with pytest.raises(CommandError, match="No Feishu app 'nope'"):
        call_command("inbox", "send-test-event", "--app", "nope")
