"""Another session holds a snapshot open (an analytics query, a forgotten transaction) while
jobs flow: vacuum can remove none of the row versions the hot path leaves. The metrics show
the dead tuples piling up and the snapshot's age (docs/production.md, "PostgreSQL topology";
the alert FeishuInboxVacuumHeldBack), and enqueue -> start does not collapse.

The issue's goal is a 10-minute hold at 300 jobs/s with the last minute's p99 within 2x the
p99 before: bench/held_snapshot.py measures it, and it is missed today (6.1x, docs/
benchmarks.md: each claim walks the dead entries of its partial index). Here a 45-second
hold at 150 jobs/s, held to a bound that catches a collapse (4x, or 250 ms on a loaded
machine), not to the goal.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from feishu_inbox import ledger
from tests.runtime.test_failover import HANDLERS, sample
from tests.support.processes import free_port, subprocess_database_url, wait_for
from tests.support.topology_handlers import NOOP_TYPE
from tests.support.worker_helpers import Workers

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.topology,
    pytest.mark.usefixtures("postgres_only"),
]

RATE = 150  # jobs a second
BASELINE, HOLD = 15.0, 45.0  # seconds


def flow(tag: str, seconds: float, rate: float = RATE) -> list[str]:
    """Enqueue ``rate`` no-op jobs a second for ``seconds`` on a fixed schedule, across 50
    chats; returns their event ids."""
    ids = []
    began = time.monotonic()
    for n in range(int(seconds * rate)):
        due = began + n / rate
        time.sleep(max(0.0, due - time.monotonic()))  # the arrivals' pace, not a synchronisation
        event_id = f"{tag}-{n}"
        ledger.enqueue(
            event_id=event_id,
            event_type=NOOP_TYPE,
            partition_key=f"chat-{n % 50}",
            payload={"t0": time.monotonic_ns()},
        )
        ids.append(event_id)
    return ids


def latencies(workers: Workers, ids: list[str]) -> list[float]:
    wanted = set(ids)
    found = {line[1]: (int(line[3]) - int(line[2])) / 1e9 for line in workers.lines("noop")}
    return [found[i] for i in ids if i in wanted and i in found]


def p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * 0.99))]


@pytest.fixture
def snapshot_holder() -> Iterator[psycopg.Connection]:
    with psycopg.connect(subprocess_database_url()) as holder:
        yield holder


def scrape(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        return response.read().decode()


def test_a_held_snapshot_shows_in_the_metrics_and_the_hot_path_does_not_collapse(
    workers: Workers, snapshot_holder: psycopg.Connection
) -> None:
    port = free_port()
    env = {"FEISHU_INBOX_HANDLERS": HANDLERS}
    workers.start("--concurrency", "4", "--metrics-port", str(port), **env)
    workers.start("--concurrency", "4", **env)
    warm = flow("warm", 2)  # both workers up and their connections open
    wait_for(lambda: len(latencies(workers, warm)) == len(warm), 120, "the warm-up's jobs")
    before = flow("before", BASELINE)
    wait_for(lambda: len(latencies(workers, before)) == len(before), 120, "the baseline's jobs")
    baseline = p99(latencies(workers, before))
    # The snapshot: REPEATABLE READ keeps the first query's for the whole transaction.
    snapshot_holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    snapshot_holder.execute("SELECT count(*) FROM feishu_inbox_eventjob").fetchone()
    wait_for(lambda: "feishu_inbox_database_dead_tuples" in scrape(port), 60, "the metrics")
    dead_before = sample(scrape(port), "feishu_inbox_database_dead_tuples")
    held = flow("held", HOLD)
    wait_for(lambda: len(latencies(workers, held)) == len(held), 120, "the held flow's jobs")
    last = latencies(workers, held[-int(len(held) / 3) :])  # the last third of the hold
    end = p99(last)

    def grown() -> object:
        text = scrape(port)
        return (
            sample(text, "feishu_inbox_database_dead_tuples") > dead_before + len(held)
            and sample(text, "feishu_inbox_database_oldest_snapshot_seconds") >= HOLD
        )

    wait_for(grown, 60, "the metrics to show the dead tuples and the snapshot's age")
    snapshot_holder.execute("ROLLBACK")
    print(
        f"\nenqueue -> start p99: {baseline * 1000:.1f} ms before the snapshot, "
        f"{end * 1000:.1f} ms in the last {HOLD / 3:.0f} s of a {HOLD:.0f} s hold at {RATE} jobs/s"
    )
    # Not the goal (2x, bench/held_snapshot.py): a collapse guard, with room for a loaded machine
    # (a stress round, both cores taken, made 0.41 s of a 0.067 s baseline; a collapse is
    # seconds).
    assert end <= max(4 * baseline, 1.0), (baseline, end)
