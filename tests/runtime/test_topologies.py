"""PostgreSQL behind PgBouncer in transaction mode (the distribution's pgbouncer, a pool
smaller than the workers' connections): the webhook and killed workers keep every promise,
an idle worker is woken in milliseconds through a direct LISTEN connection or within its
poll interval without one, and a LISTEN that hears nothing through the pooler is found out
(docs/production.md, "PostgreSQL topology").

``make test-postgres-topologies`` runs these, and the worker, steps, schedules, replies and
streams tests with every subprocess behind PgBouncer (``FEISHU_INBOX_TEST_TOPOLOGY``).
"""

from __future__ import annotations

import itertools
import os
import signal
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from feishu_inbox.models import EventJob
from tests.feishu.test_http_server import http_post
from tests.support.feishu_client import ENCRYPT_KEY, TOKEN, delivery, message_event
from tests.support.pgbouncer import PgBouncer, pooled_env
from tests.support.processes import (
    free_port,
    start_server,
    stop,
    subprocess_database_url,
    wait_for,
)
from tests.support.topology_handlers import EVENT_TYPE
from tests.support.worker_helpers import Workers, enqueue, wait_all_completed

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.topology,
    pytest.mark.usefixtures("postgres_only"),
]

HANDLERS = "tests.support.worker_handlers,tests.support.topology_handlers"


@pytest.fixture
def bouncer() -> Iterator[PgBouncer]:
    from django.db import connection

    found = PgBouncer(
        connection.settings_dict.get("HOST") or "127.0.0.1",
        int(connection.settings_dict.get("PORT") or 5432),
    ).start()
    try:
        yield found
    finally:
        found.stop()


def deliver(url: str, chats: int, per_chat: int) -> dict[str, list[str]]:
    """Post ``per_chat`` message events to each chat (each chat's one after another, the chats
    side by side); returns each chat's event ids answered 200, in their order."""

    def one_chat(chat: str) -> list[str]:
        answered = []
        for _ in range(per_chat):
            envelope = message_event(chat_id=chat)
            envelope["header"]["event_type"] = EVENT_TYPE
            body, headers = delivery(envelope)
            # Eight posters, two workers of four slots and the webhook share PgBouncer's pool
            # of 3 server connections: on a machine whose every core the other suites take,
            # one delivery waited past 10 s twice this stop (its answer, not its storing, is
            # what this test does not time: each event once, in order, is).
            status, _ = http_post(url, body, headers, timeout=60)
            if status == 200:
                answered.append(envelope["header"]["event_id"])
        return answered

    names = [f"oc_{n}" for n in range(chats)]
    with ThreadPoolExecutor(chats) as pool:
        return dict(zip(names, pool.map(one_chat, names), strict=True))


def assert_in_chat_order(workers: Workers, order: dict[str, list[str]]) -> None:
    """Every event's run ended, each chat's in their receipt order and never two of one chat
    at once. (A run may end twice without an effect: a worker killed between its handler's
    return and its finish's commit leaves the job to run again (docs/guarantees.md); the
    ledger completes it once.)"""
    ended = {line[1]: int(line[3]) for line in workers.lines("end")}  # the last run's
    starts: dict[str, int] = {}
    for line in workers.lines("start"):
        starts[line[1]] = int(line[3])  # the last start: the run that ended
    for chat, expected in order.items():
        assert set(expected) <= set(ended), (chat, set(expected) - set(ended))
        for earlier, later in itertools.pairwise(expected):
            assert ended[earlier] < starts[later], f"{chat}: {earlier} and {later} overlapped"


@pytest.mark.parametrize("listen", [True, False], ids=["listen_url", "poll_only"])
def test_webhook_and_killed_workers_through_pgbouncer_run_each_event_once_in_order(
    workers: Workers, bouncer: PgBouncer, listen: bool
) -> None:
    env = pooled_env(subprocess_database_url(), bouncer, listen=listen)
    port = free_port()
    server = start_server(
        port,
        FEISHU_ENCRYPT_KEY=ENCRYPT_KEY,
        FEISHU_VERIFICATION_TOKEN=TOKEN,
        LOG_LEVEL="WARNING",
        **env,
    )
    worker_env = {
        **env,
        "FEISHU_INBOX_HANDLERS": HANDLERS,
        "FEISHU_INBOX_LEASE_SECONDS": "3",
        "FEISHU_INBOX_POLL_INTERVAL": "0.2",
        "TOPOLOGY_WORK": "0.02",
    }
    try:
        procs = [workers.start("--concurrency", "4", **worker_env) for _ in range(2)]
        peak_clients = peak_servers = 0
        with ThreadPoolExecutor(1) as poster:
            posted = poster.submit(deliver, f"http://127.0.0.1:{port}/feishu/events/", 8, 30)
            for kill in range(4):  # each worker killed twice while deliveries and jobs run
                victim = procs[kill % 2]
                wait_for(
                    lambda kill=kill: len(workers.lines("end")) >= 20 * (kill + 1) or posted.done(),
                    120,
                    "jobs to run before the next kill",
                )
                clients, servers = connections_of(bouncer)
                peak_clients, peak_servers = max(peak_clients, clients), max(peak_servers, servers)
                os.kill(victim.pid, signal.SIGKILL)
                victim.wait(30)
                procs[kill % 2] = workers.start("--concurrency", "4", **worker_env)
            order = posted.result(300)
    finally:
        stop(server)
    total = sum(len(ids) for ids in order.values())
    assert total == 240, "every delivery was answered 200"
    wait_all_completed(total, 240, lambda: workers.stderr(procs[0]))
    assert_in_chat_order(workers, order)
    # Under load, more clients than the pool has server connections: the workers' slots and
    # side threads and the webhook's processes took turns on at most its size.
    assert peak_clients > bouncer.pool_size >= peak_servers, (peak_clients, peak_servers)


def connections_of(bouncer: PgBouncer) -> tuple[int, int]:
    """The test database's client and server connections at PgBouncer now."""
    database = subprocess_database_url().rsplit("/", 1)[1]
    clients = [c for c in bouncer.show("CLIENTS") if c["database"] == database]
    servers = [c for c in bouncer.show("SERVERS") if c["database"] == database]
    return len(clients), len(servers)


def start_latencies(workers: Workers, events: int, *, spacing: float) -> list[float]:
    """Enqueue ``events`` one at a time, each once the idle worker ran the one before,
    ``spacing`` seconds after it: seconds from each commit to its handler's start (one host,
    one monotonic clock)."""
    latencies = []
    for n in range(events):
        committed = time.monotonic_ns()
        enqueue(f"idle-{n}", [], partition=f"chat-{n}")
        committed = (committed + time.monotonic_ns()) // 2
        wait_for(lambda n=n: workers.lines("start", f"idle-{n}"), 60, f"idle-{n} to start")
        started = int(workers.lines("start", f"idle-{n}")[0][3])
        latencies.append(max(0, started - committed) / 1e9)
        time.sleep(spacing)  # the pace of the arrivals (the worker idles), not a synchronisation
    return latencies


def p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * 0.99))]


@pytest.mark.parametrize("listen", [True, False], ids=["listen_url", "poll_only"])
def test_an_idle_worker_behind_pgbouncer_starts_a_new_event_promptly(
    workers: Workers, bouncer: PgBouncer, listen: bool
) -> None:
    """The timing goals (bench/pgbouncer.py reports them): LISTEN on a direct connection,
    50 ms p50 / 250 ms p99; poll-only, within POLL_INTERVAL. Asserted here with room for a
    loaded machine: 3x and more."""
    poll = 0.5
    env = pooled_env(subprocess_database_url(), bouncer, listen=listen)
    enqueue("warm", [], partition="warm")  # found by the worker's first claim
    workers.start("--concurrency", "2", FEISHU_INBOX_POLL_INTERVAL=str(poll), **env)
    wait_for(lambda: workers.lines("start", "warm"), 60, "the worker to run a first job")
    latencies = start_latencies(workers, 30, spacing=0.1)
    p50 = statistics.median(latencies)
    print(
        f"enqueue -> start through pgbouncer ({'LISTEN_URL' if listen else 'poll'}): "
        f"p50 {p50 * 1000:.1f} ms, p99 {p99(latencies) * 1000:.1f} ms"
    )
    if listen:
        assert p50 < 0.5 and p99(latencies) < 1.5, latencies
    else:
        assert max(latencies) < 3 * poll + 0.5, latencies


def test_a_listen_through_the_pooler_is_found_deaf_and_the_worker_polls(
    workers: Workers, bouncer: PgBouncer
) -> None:
    """A site behind PgBouncer that did not say so (no TRANSACTION_POOLER, no LISTEN_URL):
    its LISTEN goes through the pool and hears nothing. The worker's probe finds it out and it
    polls, so a new event waits for its poll interval, not its 30 s sleep."""
    env = pooled_env(subprocess_database_url(), bouncer, listen=False)
    env = {"DATABASE_URL": env["DATABASE_URL"]}  # the pooler, undeclared
    proc = workers.start(
        "--concurrency",
        "2",
        FEISHU_INBOX_POLL_INTERVAL="0.5",
        FEISHU_INBOX_PREPARE_STATEMENTS="0",
        **env,
    )
    wait_for(
        lambda: "LISTEN hears nothing" in workers.stderr(proc), 120, "the probe to find it deaf"
    )
    enqueue("after", [], partition="chat-after")
    started = time.monotonic()
    wait_for(lambda: workers.lines("start", "after"), 30, "the new event to start")
    assert time.monotonic() - started < 5, "polled, not a 30 s sleep"
    wait_for(lambda: EventJob.objects.filter(status="completed").count() == 1, 30, "it to end")
