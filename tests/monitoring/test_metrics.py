"""Prometheus metrics (issue 28): a real ``runworker --metrics-port`` scraped by a real
Prometheus server (Debian's package) while known jobs run. What Prometheus stores equals what
the ledger did, the ledger's gauges equal ``inbox stats``, ``promtool`` accepts the exposition,
and the alerting rules fire as their tests say (``promtool test rules``)."""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from tests.support.processes import free_port, wait_for
from tests.support.prometheus import Prometheus, missing, promtool
from tests.support.worker_helpers import Workers, enqueue

pytestmark = pytest.mark.django_db(transaction=True)

HERE = Path(__file__).resolve().parent
DASHBOARD = HERE.parents[1] / "feishu_inbox" / "monitoring" / "grafana" / "feishu_inbox.json"
COMPLETED, UNKNOWN = 17, 3


@pytest.fixture(autouse=True)
def _prometheus_installed() -> None:
    why = missing()
    assert not why, why  # never skipped: make test installs it (make setup)


def stats() -> dict[str, object]:
    out = io.StringIO()
    call_command("inbox", "stats", "--json", stdout=out)
    connection.close()
    return dict(json.loads(out.getvalue()))


def fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:  # not listening (yet)
        return 0, b""


def test_prometheus_stores_what_the_worker_did_and_the_ledger_says(workers: Workers) -> None:
    for n in range(COMPLETED):
        enqueue(f"ok{n}", ["step:think"], partition=f"chat-ok-{n}")
    for n in range(UNKNOWN):  # an effect, then the handler fails: unknown, the chat blocked
        enqueue(f"bad{n}", ["effect", "fail:after the effect"], partition=f"chat-bad-{n}")
    port = free_port()
    workers.start("--concurrency", "4", "--metrics-port", str(port))
    wait_for(lambda: fetch(f"http://127.0.0.1:{port}/healthz")[0] == 200, 60, "the worker")
    with Prometheus([f"127.0.0.1:{port}"]) as prom:

        def scraped(expression: str, expected: float) -> bool:
            return prom.value(expression) == expected

        wait_for(
            lambda: (
                scraped('sum(feishu_inbox_jobs_finished_total{outcome="completed"})', COMPLETED)
                and scraped('sum(feishu_inbox_jobs_finished_total{outcome="unknown"})', UNKNOWN)
            ),
            60,
            "Prometheus to store 17 completed and 3 unknown",
        )
        assert prom.value("sum(feishu_inbox_handler_duration_seconds_count)") == 20
        assert prom.value("sum(feishu_inbox_job_wait_seconds_count)") == 20
        assert prom.value('sum(feishu_inbox_steps_total{result="recorded"})') == COMPLETED
        assert prom.value('sum(feishu_inbox_effects_total{result="started"})') == UNKNOWN
        assert prom.value("sum(feishu_inbox_claimed_jobs_total)") == 20

        # The ledger's gauges, as inbox stats reads the ledger.
        ledger = stats()
        counts = ledger["counts"]
        assert isinstance(counts, dict) and counts["unknown"] == UNKNOWN
        wait_for(
            lambda: (
                scraped('feishu_inbox_ledger_jobs{state="unknown"}', counts["unknown"])
                and scraped("feishu_inbox_ledger_blocked_partitions", ledger["blocked_partitions"])
                and scraped("feishu_inbox_ledger_due_jobs", ledger["due"])
            ),
            30,
            "the ledger gauges to match inbox stats",
        )
        assert prom.value('feishu_inbox_ledger_jobs{state="queued"}') == counts["queued"] == 0
        assert prom.value("feishu_inbox_ledger_up") == 1
        assert prom.value('feishu_inbox_workers{state="live"}') == 1  # its heartbeat row
        assert (prom.value("feishu_inbox_ledger_oldest_blocked_seconds") or 0) >= 0

        # Every query of the shipped Grafana dashboard is valid PromQL over these series,
        # and those of the ledger's state find them.
        dashboard = json.loads(DASHBOARD.read_text())
        empty = []
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                expression = target["expr"].replace("$__rate_interval", "1m")
                if not prom.query(expression) and "rate(" not in expression:
                    empty.append(expression)  # a rate needs two scrapes of a change
        assert empty == [], empty

    status, body = fetch(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    checked = promtool("check", "metrics", stdin=body)
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()
    text = body.decode()
    assert "chat-ok" not in text and "ok1" not in text  # no partition or event id as a label
    assert fetch(f"http://127.0.0.1:{port}/nothing")[0] == 404


def test_the_alerting_rules_fire_as_their_tests_say() -> None:
    rules = HERE.parents[1] / "feishu_inbox" / "monitoring" / "prometheus" / "alerts.yml"
    checked = promtool("check", "rules", str(rules))
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()
    tested = promtool("test", "rules", str(HERE / "alerts_test.yml"))
    assert tested.returncode == 0, tested.stdout.decode() + tested.stderr.decode()
