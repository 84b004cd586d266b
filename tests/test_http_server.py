"""The demo under a production WSGI server (gunicorn), driven by a real HTTP client."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from feishu_inbox.models import EventJob

from .feishu_client import ENCRYPT_KEY, TOKEN, delivery, message_event
from .processes import free_port, start_server, stop

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server() -> Iterator[str]:
    port = free_port()
    proc = start_server(
        port, FEISHU_ENCRYPT_KEY=ENCRYPT_KEY, FEISHU_VERIFICATION_TOKEN=TOKEN, LOG_LEVEL="ERROR"
    )
    try:
        yield f"http://127.0.0.1:{port}/feishu/events/"
    finally:
        stop(proc)


def http_post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_real_server_stores_a_signed_encrypted_delivery_once(server: str) -> None:
    envelope = message_event(chat_id="oc_http")
    body, headers = delivery(envelope)
    assert http_post(server, body, headers) == (200, {"ok": True, "duplicate": False})
    assert http_post(server, body, headers) == (200, {"ok": True, "duplicate": True})
    job = EventJob.objects.get()
    assert job.payload == envelope and job.partition_key == "default:chat:oc_http"


def test_real_server_refuses_a_bad_signature_and_stores_nothing(server: str) -> None:
    body, headers = delivery(message_event())
    headers["X-Lark-Signature"] = "f" * 64
    status, answer = http_post(server, body, headers)
    assert (status, answer["error"]) == (401, "bad_signature")
    assert not EventJob.objects.exists()


def test_real_server_answers_url_verification(server: str) -> None:
    challenge = {"challenge": "c-1", "token": TOKEN, "type": "url_verification"}
    body, headers = delivery(challenge, signed=False)
    assert http_post(server, body, headers) == (200, {"challenge": "c-1"})
