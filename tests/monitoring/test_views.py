"""The web process's ``metrics/`` view: only for staff, the bearer token or an allowed
network; and under gunicorn's several processes (multiprocess mode), every process's
counters in one scrape."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings

from feishu_inbox.conf import metrics_allow_problems
from tests.support.feishu_client import ENCRYPT_KEY, TOKEN, delivery, message_event
from tests.support.processes import free_port, start_server
from tests.support.prometheus import missing, promtool

URL = "/feishu/metrics/"
SECRET_TOKEN = "a-metrics-token-of-some-length"


def settings_with(**keys: object) -> override_settings:
    from django.conf import settings

    return override_settings(FEISHU_INBOX={**settings.FEISHU_INBOX, **keys})


@pytest.mark.django_db
def test_only_staff_the_token_or_an_allowed_network_read_the_metrics(client: Client) -> None:
    with settings_with(METRICS_TOKEN=SECRET_TOKEN, METRICS_ALLOW=["10.1.0.0/16"]):
        refused = client.get(URL)
        assert refused.status_code == 401 and "METRICS_TOKEN" in refused.content.decode()
        assert refused["WWW-Authenticate"].startswith("Bearer")
        assert client.get(URL, HTTP_AUTHORIZATION="Bearer wrong-token").status_code == 401
        assert client.get(URL, REMOTE_ADDR="10.2.0.1").status_code == 401
        assert client.post(URL, HTTP_AUTHORIZATION=f"Bearer {SECRET_TOKEN}").status_code == 405
        ok = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {SECRET_TOKEN}")
        assert ok.status_code == 200 and ok["Content-Type"].startswith("text/plain")
        assert "feishu_inbox_ledger_up 1.0" in ok.content.decode()
        assert client.get(URL, REMOTE_ADDR="10.1.3.4").status_code == 200
    with settings_with():  # no token, no network: staff only
        assert client.get(URL, HTTP_AUTHORIZATION="Bearer ").status_code == 401
        user = User.objects.create_user("ops", password="x", is_staff=False)
        client.force_login(user)
        assert client.get(URL).status_code == 401
        user.is_staff = True
        user.save()
        assert client.get(URL).status_code == 200


def test_bad_metrics_settings_are_named() -> None:
    assert metrics_allow_problems(["10.0.0.0/8", "127.0.0.1"]) == []
    assert "not a network" in metrics_allow_problems(["10.0.0.0/33"])[0]
    assert "must be a list" in metrics_allow_problems("10.0.0.0/8")[0]
    from feishu_inbox.conf import InboxSettings

    assert any("at least 16" in p for p in InboxSettings(METRICS_TOKEN="short").validate())


@pytest.fixture
def multiprocess_server(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = start_server(
        port,
        FEISHU_ENCRYPT_KEY=ENCRYPT_KEY,
        FEISHU_VERIFICATION_TOKEN=TOKEN,
        FEISHU_INBOX_METRICS_TOKEN=SECRET_TOKEN,
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path),
        LOG_LEVEL="ERROR",
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def scrape(base: str) -> str:
    request = urllib.request.Request(
        base + URL, headers={"Authorization": f"Bearer {SECRET_TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return str(answer.read().decode())


def sample(text: str, name: str, **labels: str) -> float:
    """The value of the sample of ``name`` with these labels in the exposition (0: none)."""
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
        if not labels and line.startswith(f"{name} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.django_db(transaction=True)
def test_gunicorns_processes_are_counted_together(multiprocess_server: str) -> None:
    assert not missing(), missing()
    events = f"{multiprocess_server}/feishu/events/"
    for n in range(8):  # over several connections: gunicorn's two processes share them
        event = message_event(chat_id=f"oc_mp_{n}", event_id=f"ev-mp-{n}", message_id=f"om_{n}")
        body, headers = delivery(event)
        assert post(events, body, headers) == 200
    body, headers = delivery(
        message_event(chat_id="oc_mp_0", event_id="ev-mp-0", message_id="om_0")
    )
    assert post(events, body, headers) == 200  # a redelivery: a duplicate
    body, headers = delivery(message_event(chat_id="oc_bad"), key="not-the-key")
    assert post(events, body, headers) in (400, 401)

    text = scrape(multiprocess_server)  # the answers above were sent: the counts are in
    assert sample(text, "feishu_inbox_deliveries_total", answer="stored") == 8, text
    assert sample(text, "feishu_inbox_deliveries_total", answer="duplicate") == 1, text
    assert sample(text, "feishu_inbox_ledger_jobs", state="queued") == 8
    refused = [
        line
        for line in text.splitlines()
        if line.startswith("feishu_inbox_deliveries_total{")
        and 'answer="stored"' not in line
        and 'answer="duplicate"' not in line
    ]
    assert len(refused) == 1 and float(refused[0].rsplit(" ", 1)[1]) == 1, refused
    checked = promtool("check", "metrics", stdin=text.encode())
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()
