"""Outbound webhooks delivered by real ``runworker`` processes to real receiver processes that
verify every request with the ``standardwebhooks`` package (SPEC §9h, invariant 11).

The workers run a retry schedule of 0.2 s, 0.5 s and 1 s (``webhook_helpers.WORKER_SETTINGS``;
production's is 5 s to 10 h): the receiver that goes down in the chaos test for a minute is
sent each of its pending deliveries again about once a second, under the same ``webhook-id``,
until it is back.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter, defaultdict
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from feishu_inbox import webhooks
from feishu_inbox.ledger import pauses
from feishu_inbox.models import EventJob
from feishu_inbox.tables.webhooks import WebhookAttempt, WebhookEndpoint
from tests.support.processes import wait_for
from tests.support.webhook_helpers import worker_env
from tests.support.worker_helpers import Workers

pytestmark = pytest.mark.django_db(transaction=True)

#: How long the chaos test's receiver is down (the issue's minute).
OUTAGE_SECONDS = 60.0
MESSAGES, ENDPOINTS, KEYS = 500, 5, 20


def jobs() -> Counter[str]:
    connection.close()
    return Counter(EventJob.objects.filter(app="webhooks").values_list("status", flat=True))


def settled(total: int) -> Any:
    """A condition: every delivery job completed, or one ended unknown or failed."""

    def check() -> bool:
        found = jobs()
        return found["completed"] == total or found["unknown"] + found["failed"] > 0

    return check


def endpoint(uid: str) -> WebhookEndpoint:
    connection.close()
    return WebhookEndpoint.objects.get(uid=uid)


def add(receiver: Any, **options: Any) -> tuple[str, str]:
    from django.test import override_settings

    with override_settings(FEISHU_INBOX={"WEBHOOK_ALLOW_PRIVATE": True}):
        new = webhooks.add_endpoint(receiver.url, **options)
    return new.uid, new.secret


def in_order(receiver: Any) -> dict[str, list[int]]:
    """Each key's sequence numbers, in the order the receiver first accepted them."""
    order: dict[str, list[int]] = defaultdict(list)
    for line in receiver.accepted():
        order[line["key"]].append(line["seq"])
    return order


def test_chaos_every_message_accepted_once_in_order_never_unknown(
    workers: Workers, receivers: Any
) -> None:
    """500 messages over 5 endpoints and 20 keys, 2 workers (one SIGKILLed mid-run), 20% of
    answers dropped after the receiver processed the request, one receiver down for a while
    and back: every message accepted once by webhook-id, in order per endpoint and key, no
    job unknown, every signature verified."""
    made = []
    for n in range(ENDPOINTS):
        receiver = receivers(f"r{n}", mode="drop", drop=0.2, seed=n)
        uid, secret = add(receiver, event_types=[f"t{n}"])
        receiver.options["secrets"] = [secret]
        made.append((uid, receiver.start()))
    expected: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    ids: dict[int, set[str]] = defaultdict(set)
    for i in range(MESSAGES):
        n, key = i % ENDPOINTS, f"k{(i // ENDPOINTS) % KEYS}"
        done = webhooks.publish(f"t{n}", {"key": key, "seq": i}, key=key)
        expected[n][key].append(i)
        ids[n].add(done.message_id)
    env = worker_env()
    first = workers.start("--concurrency", "4", "--lease-seconds", "5", **env)
    workers.start("--concurrency", "4", "--lease-seconds", "5", **env)

    def accepted() -> int:
        return sum(len(r.accepted()) for _, r in made)

    wait_for(lambda: accepted() >= 100, 120, "100 messages accepted before the kill")
    os.kill(first.pid, signal.SIGKILL)
    down = made[0][1]
    wait_for(lambda: len(down.accepted()) >= 30, 120, "the first receiver to accept some")
    down.kill()
    connection.close()
    wait_for(
        lambda: (
            WebhookAttempt.objects.filter(
                endpoint__uid=made[0][0], error__contains="ConnectionRefused"
            ).count()
            >= 3
        ),
        120,
        "deliveries refused while the receiver is down",
    )
    time.sleep(OUTAGE_SECONDS)  # the outage itself: the stimulus, not a synchronisation
    down.start()
    wait_for(settled(MESSAGES), 300, "every delivery to complete", seen=jobs)

    assert jobs() == {"completed": MESSAGES}, jobs()
    assert first.wait(30) == -signal.SIGKILL
    assert not EventJob.objects.filter(app="webhooks").exclude(error_type="").exists()
    resent = 0
    for n, (_, receiver) in enumerate(made):
        requests = receiver.requests()
        assert all(r["verified"] for r in requests), [r for r in requests if not r["verified"]]
        once = Counter(r["id"] for r in receiver.accepted())
        assert set(once) == ids[n] and set(once.values()) == {1}, n
        assert in_order(receiver) == expected[n], n
        resent += sum(1 for r in requests if not r["new"])
    assert resent > 0  # dropped answers, the kill and the outage were resent, same ids
    assert any(r["dropped"] for _, r in made for r in r.requests())


def test_410_disables_the_endpoint_and_holds_its_deliveries_until_enabled(
    workers: Workers, receivers: Any
) -> None:
    receiver = receivers("gone", mode="gone")
    uid, secret = add(receiver)
    receiver.options["secrets"] = [secret]
    receiver.start()
    sent = [webhooks.publish("order.paid", {"key": "k", "seq": n}, key="k") for n in range(3)]
    workers.start("--concurrency", "2", **worker_env())
    wait_for(lambda: not endpoint(uid).enabled, 60, "the endpoint to be disabled")
    row = endpoint(uid)
    assert "410" in row.disabled_reason and row.disabled_at is not None
    assert len(receiver.requests()) == 1  # the held ones were not sent
    wait_for(
        lambda: (
            EventJob.objects.filter(
                app="webhooks", status="queued", available_at__gte=pauses.HELD_FROM
            ).count()
            == 3
        ),
        60,
        "all three deliveries held",
        seen=jobs,
    )
    assert jobs() == {"queued": 3}  # held, not failed, not unknown, not dropped
    receiver.set_mode("ok")
    assert webhooks.enable(uid) == 3
    wait_for(settled(3), 60, "the held deliveries to be sent", seen=jobs)
    assert jobs() == {"completed": 3}
    assert in_order(receiver) == {"k": [0, 1, 2]}
    first_id = sent[0].message_id
    assert [r["id"] for r in receiver.requests()][:2] == [first_id, first_id]  # same id again


def test_a_failing_endpoint_is_disabled_after_its_span_and_enabling_sends_what_it_held(
    workers: Workers, receivers: Any
) -> None:
    """The span (WEBHOOK_DISABLE_AFTER, 5 days) is simulated: once attempts have failed, the
    endpoint's failing_since is moved back six days, as if they had failed since then."""
    receiver = receivers("failing", mode="error")
    uid, secret = add(receiver)
    receiver.options["secrets"] = [secret]
    receiver.start()
    sent = [webhooks.publish("order.paid", {"key": "k", "seq": n}, key="k") for n in range(3)]
    workers.start(**worker_env())
    wait_for(lambda: endpoint(uid).failure_streak >= 2, 60, "two failed attempts")
    assert endpoint(uid).enabled
    WebhookEndpoint.objects.filter(uid=uid).update(failing_since=timezone.now() - timedelta(days=6))
    wait_for(lambda: not endpoint(uid).enabled, 60, "the endpoint to be disabled")
    assert "every attempt failed since" in endpoint(uid).disabled_reason
    wait_for(
        lambda: (
            EventJob.objects.filter(app="webhooks", available_at__gte=pauses.HELD_FROM).count() == 3
        ),
        60,
        "its deliveries held",
        seen=jobs,
    )
    assert jobs() == {"queued": 2, "retry_wait": 1} or jobs() == {"queued": 3}, jobs()
    assert {r["id"] for r in receiver.requests()} == {sent[0].message_id}
    receiver.set_mode("ok")
    webhooks.enable(uid)
    wait_for(settled(3), 60, "the held deliveries to be sent", seen=jobs)
    assert jobs() == {"completed": 3}
    assert in_order(receiver) == {"k": [0, 1, 2]}
    assert endpoint(uid).failure_streak == 0 and endpoint(uid).last_success_at is not None


def test_a_rejected_delivery_ends_and_its_keys_next_message_goes_on(
    workers: Workers, receivers: Any
) -> None:
    receiver = receivers("rejects", mode="reject")
    uid, secret = add(receiver)
    receiver.options["secrets"] = [secret]
    receiver.start()
    for n in range(3):
        webhooks.publish("order.paid", {"key": "k", "seq": n}, key="k")
    workers.start(**worker_env())
    wait_for(settled(3), 60, "every delivery to end", seen=jobs)
    rows = EventJob.objects.filter(app="webhooks").order_by("id")
    assert [(j.status, j.error_type) for j in rows] == [
        ("completed", "WebhookDeliveryRejected")
    ] * 3
    assert [r["seq"] for r in receiver.requests()] == [0, 1, 2]  # each once, in order
    attempt = WebhookAttempt.objects.filter(endpoint__uid=uid).first()
    assert attempt is not None and attempt.status_code == 400
    assert len(attempt.response) == 1024 and attempt.response.startswith("bad payload")
    assert set(attempt.request_headers) == {"webhook-id", "webhook-timestamp", "webhook-signature"}
    assert secret not in str(attempt.request_headers)


def test_a_rotated_secret_verifies_with_either_key_during_its_grace(
    workers: Workers, receivers: Any
) -> None:
    receiver = receivers("rotating")
    uid, old = add(receiver)
    new = webhooks.rotate_secret(uid, grace=timedelta(hours=1)).secret
    receiver.options["secrets"] = [old, new]
    receiver.start()
    for n in range(5):
        webhooks.publish("order.paid", {"key": "k", "seq": n}, key="k")
    workers.start(**worker_env())
    wait_for(settled(5), 60, "every delivery", seen=jobs)
    requests = receiver.requests()
    assert len(requests) >= 5 and all(r["signatures"] == 2 for r in requests)
    assert all(sorted(r["verified"]) == sorted([old[-6:], new[-6:]]) for r in requests)


def test_a_slow_receiver_never_stalls_a_worker_past_its_timeout(
    workers: Workers, receivers: Any
) -> None:
    """One slot; one endpoint sleeps 60 s on every request, another answers: the slow one's
    attempts end at the 1 s timeout (3 s allowed for a busy machine) and go back to retry, and
    the other endpoint's messages are delivered meanwhile."""
    slow = receivers("slow", mode="sleep", sleep=60)
    slow_uid, secret = add(slow)
    slow.options["secrets"] = [secret]
    fast = receivers("fast")
    _, fast_secret = add(fast)
    fast.options["secrets"] = [fast_secret]
    slow.start(), fast.start()
    for n in range(5):
        webhooks.publish("order.paid", {"key": "k", "seq": n}, key="k")
    workers.start("--concurrency", "1", **worker_env(WEBHOOK_TIMEOUT_SECONDS=1.0))
    wait_for(lambda: len(fast.accepted()) == 5, 90, "the fast endpoint's five messages")
    wait_for(
        lambda: WebhookAttempt.objects.filter(endpoint__uid=slow_uid).count() >= 2,
        60,
        "the slow endpoint's attempts",
    )
    latencies = list(
        WebhookAttempt.objects.filter(endpoint__uid=slow_uid).values_list("latency_ms", flat=True)
    )
    assert all(900 <= ms < 3000 for ms in latencies), latencies
    outcomes = set(
        WebhookAttempt.objects.filter(endpoint__uid=slow_uid).values_list("outcome", flat=True)
    )
    assert outcomes == {"timed_out"}
    assert not EventJob.objects.filter(status__in=["unknown", "failed"]).exists()


def test_an_endpoints_rate_limit_is_kept_across_workers(workers: Workers, receivers: Any) -> None:
    """20 messages without a key (free to go in parallel) to an endpoint limited to 5 a
    second (a burst of 5), on two workers of 4 slots: they take at least 3 s."""
    receiver = receivers("limited")
    _, secret = add(receiver, rate_limit=5)
    receiver.options["secrets"] = [secret]
    receiver.start()
    for n in range(20):
        webhooks.publish("order.paid", {"key": None, "seq": n})
    for _ in range(2):
        workers.start("--concurrency", "4", **worker_env())
    wait_for(settled(20), 90, "every delivery", seen=jobs)
    times = sorted(r["at"] for r in receiver.accepted())
    assert len(times) == 20
    assert times[-1] - times[0] >= 2.8, times[-1] - times[0]


def test_a_deleted_endpoints_pending_deliveries_end_and_free_their_keys(
    workers: Workers, receivers: Any
) -> None:
    receiver = receivers("deleted")
    uid, secret = add(receiver)
    receiver.options["secrets"] = [secret]
    receiver.start()
    webhooks.disable(uid)
    for n in range(2):
        webhooks.publish("order.paid", {"key": "k", "seq": n}, key="k")
    webhooks.delete(uid)
    workers.start(**worker_env())
    wait_for(settled(2), 60, "the deliveries to end", seen=jobs)
    rows = EventJob.objects.filter(app="webhooks")
    assert {(j.status, j.error_type) for j in rows} == {("completed", "WebhookEndpointDeleted")}
    assert receiver.requests() == [] and not pauses.listed()
