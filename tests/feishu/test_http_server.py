"""The demo under a production WSGI server (gunicorn), driven by a real HTTP client."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from urllib.parse import urlsplit

import pytest

from feishu_inbox.models import EventJob
from tests.support.feishu_client import ENCRYPT_KEY, TOKEN, delivery, message_event
from tests.support.processes import free_port, start_server, stop

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


def http_post(
    url: str, body: bytes, headers: dict[str, str], *, timeout: float = 60.0
) -> tuple[int, dict[str, object]]:
    """(A minute: what these tests prove is the answer, not its latency, which a CPU hog
    stretches; the ACK budget has its own test.)"""
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
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


def chunked_post(
    url: str, chunks: Iterable[bytes], headers: dict[str, str]
) -> tuple[int, dict[str, object]]:
    """POST with ``Transfer-Encoding: chunked`` and no Content-Length."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("POST", parts.path, body=iter(chunks), headers=headers, encode_chunked=True)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_real_server_reads_a_chunked_body(server: str) -> None:
    envelope = message_event(chat_id="oc_chunked")
    body, headers = delivery(envelope)
    chunks = [body[i : i + 100] for i in range(0, len(body), 100)]
    assert len(chunks) > 1
    assert chunked_post(server, chunks, headers) == (200, {"ok": True, "duplicate": False})
    assert EventJob.objects.get().payload == envelope


def test_real_server_refuses_a_chunked_body_over_the_limit(server: str) -> None:
    limit = 1024 * 1024  # MAX_BODY_BYTES's default: the demo project does not change it
    body, headers = delivery(message_event(text="x" * limit))
    assert len(body) > limit
    chunks = [body[i : i + 64 * 1024] for i in range(0, len(body), 64 * 1024)]
    status, answer = chunked_post(server, chunks, headers)
    assert (status, answer["error"]) == (413, "too_large")
    assert not EventJob.objects.exists()
