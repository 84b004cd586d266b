"""A primary lost and its standby promoted under load: the webhook (gunicorn) and two workers
on a connection string naming both hosts with ``target_session_attrs=read-write``, the primary
SIGKILLed mid-stream and the standby promoted, as a failover manager does; nobody touches the
webhook, the workers or the ledger (docs/guarantees.md, "Failover").

- A synchronous standby: every event answered 200 is in the ledger after the switch and runs
  exactly once, its effect never twice, each chat in receipt order.
- An asynchronous one (its WAL receiver stopped for the last 20 answered events, as a lagging
  standby): the events acknowledged but not yet streamed are lost (Feishu does not send them
  again); the test reports how many, and the ingest metric shows that they were acknowledged
  without a synchronous standby. An effect whose start was streamed and whose end was not
  ends unknown (its lease expires; the ledger never guesses), holding its chat's later
  events, until the operator settles it (``inbox reconcile``); then every event completes.
  (CI caught this: the test waited for them to end by themselves.)
"""

from __future__ import annotations

import itertools
import secrets
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from feishu_inbox.models import EventJob
from tests.feishu.test_http_server import http_post
from tests.support.feishu_client import ENCRYPT_KEY, TOKEN, delivery, message_event
from tests.support.processes import ROOT, free_port, start_server, stop, subprocess_env, wait_for
from tests.support.standby import Replica
from tests.support.topology_handlers import EVENT_TYPE
from tests.support.worker_helpers import Workers

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.topology,
    pytest.mark.usefixtures("postgres_only"),
]

HANDLERS = "tests.support.worker_handlers,tests.support.topology_handlers"
JOBS = EventJob._meta.db_table
CHATS, PER_CHAT = 6, 50
#: Answered events before the primary is killed.
KILL_AFTER = 90
#: With an asynchronous standby: answered events it never receives (its WAL receiver stopped).
LAGGED = 20


@pytest.fixture(params=[True, False], ids=["sync_standby", "async_standby"])
def replica(request: pytest.FixtureRequest) -> Iterator[Replica]:
    found = Replica(synchronous=request.param).start()
    try:
        yield found
    finally:
        found.stop()


class Deliveries:
    """Feishu's side: each chat's events posted one after another, each posted again until
    it is answered 200 (as Feishu redelivers); what was answered, in order."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answered: dict[str, list[str]] = {f"oc_{n}": [] for n in range(CHATS)}
        self.refused = 0
        self._lock = threading.Lock()

    def count(self) -> int:
        with self._lock:
            return sum(len(ids) for ids in self.answered.values())

    def chat(self, chat: str) -> None:
        for _ in range(PER_CHAT):
            envelope = message_event(chat_id=chat)
            envelope["header"]["event_type"] = EVENT_TYPE
            body, headers = delivery(envelope)
            deadline = time.monotonic() + 180
            while True:
                try:
                    status, _ = http_post(self.url, body, headers)
                except OSError:  # a request cut by the outage: not answered
                    status = 0
                if status == 200:
                    break
                with self._lock:
                    self.refused += 1
                assert time.monotonic() < deadline, f"{chat}: not stored for 180 s"
                time.sleep(0.1)  # Feishu's redelivery backoff, shortened: not a synchronisation
            with self._lock:
                self.answered[chat].append(envelope["header"]["event_id"])

    def run(self) -> None:
        with ThreadPoolExecutor(CHATS) as pool:
            list(pool.map(self.chat, self.answered))


def ledger_rows(url: str) -> dict[str, tuple[str, int]]:
    with psycopg.connect(url, autocommit=True) as db:
        rows = db.execute(f"SELECT event_id, status, attempt FROM {JOBS}").fetchall()
    return {event_id: (status, attempt) for event_id, status, attempt in rows}


def job_ids(url: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as db:
        return dict(db.execute(f"SELECT event_id, id FROM {JOBS}").fetchall())


def unblocked(url: str) -> int:
    """Jobs not ended that no job of their chat before them, ended unknown, holds back."""
    with psycopg.connect(url, autocommit=True) as db:
        row = db.execute(
            f"SELECT count(*) FROM {JOBS} j WHERE j.status NOT IN ('completed', 'unknown')"
            f" AND NOT EXISTS (SELECT 1 FROM {JOBS} u WHERE u.partition_key = j.partition_key"
            "  AND u.id < j.id AND u.status = 'unknown')"
        ).fetchone()
    return int(row[0]) if row else 0


def scrape(port: int, token: str) -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/feishu/metrics/", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read().decode()


def sample(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


def test_a_primary_killed_under_load_and_its_standby_promoted_needs_no_operator(
    replica: Replica, workers: Workers, tmp_path: Path
) -> None:
    url = replica.url()
    env = {"DATABASE_URL": url}
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
        cwd=ROOT,
        env=subprocess_env(**env),
        check=True,
        timeout=300,
    )
    token = secrets.token_urlsafe(24)
    port = free_port()
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    server = start_server(
        port,
        FEISHU_ENCRYPT_KEY=ENCRYPT_KEY,
        FEISHU_VERIFICATION_TOKEN=TOKEN,
        FEISHU_INBOX_METRICS_TOKEN=token,
        PROMETHEUS_MULTIPROC_DIR=str(multiproc),
        LOG_LEVEL="WARNING",
        **env,
    )
    worker_env = {
        **env,
        "FEISHU_INBOX_HANDLERS": HANDLERS,
        "FEISHU_INBOX_LEASE_SECONDS": "20",
        "TOPOLOGY_EFFECTS": "1",
        "TOPOLOGY_WORK": "0.01",
        # An effect takes a while: the kill finds some in flight (with an asynchronous
        # standby, a start streamed and its end lost: unknown, for the operator).
        "TOPOLOGY_EFFECT_WORK": "0.05",
    }
    procs = [workers.start("--concurrency", "4", **worker_env) for _ in range(2)]
    feishu = Deliveries(f"http://127.0.0.1:{port}/feishu/events/")
    try:
        with ThreadPoolExecutor(1) as poster:
            posting = poster.submit(feishu.run)
            wait_for(lambda: feishu.count() >= KILL_AFTER or posting.done(), 120, "deliveries")
            if not replica.synchronous:  # it lags: what is answered from now is not streamed
                replica.hold_back_standby()
                wait_for(
                    lambda: feishu.count() >= KILL_AFTER + LAGGED or posting.done(),
                    120,
                    "deliveries the standby does not receive",
                )
            replica.kill_primary()
            replica.promote()  # the failover manager's one act; nothing else is touched
            posting.result(600)
        before_switch = scrape(port, token)
    finally:
        stop(server)
    acknowledged = [e for ids in feishu.answered.values() for e in ids]
    assert len(acknowledged) == CHATS * PER_CHAT
    new_primary = replica.direct(replica.standby_port)

    def settled() -> object:
        """Nothing left that a worker may run: every stored job ended, or waits in its chat
        behind one that ended unknown (an operator's to settle: the ledger never guesses);
        with a synchronous standby, every acknowledged one is stored too."""
        runnable = unblocked(new_primary)
        return not runnable and (
            not replica.synchronous or set(acknowledged) <= set(ledger_rows(new_primary))
        )

    def unresolved() -> str:
        """On a timeout, compact (the failure's message is what CI shows first): each worker's
        exit code and last warnings, and the rows not ended as the new primary holds them."""
        said = [
            f"worker-{n} exit {proc.poll()}: "
            + " | ".join(
                line[-200:]
                for line in workers.stderr(proc).splitlines()
                if " WARNING " in line or " ERROR " in line
            )[-1200:]
            for n, proc in enumerate(procs)
        ]
        with psycopg.connect(new_primary, autocommit=True) as db:
            stuck = db.execute(
                "SELECT id, right(partition_key, 4), status, attempt, worker_id,"
                " round(extract(epoch FROM lease_until - now())),"
                " round(extract(epoch FROM available_at - now())), effects_in_flight"
                f" FROM {JOBS} WHERE status NOT IN ('completed', 'unknown') ORDER BY id"
            ).fetchall()
        rows = " ".join(
            f"#{i}/{chat}/{status}/a{attempt}/{worker or '-'}/lease{lease}/due{due}/fx{fx}"
            for i, chat, status, attempt, worker, lease, due, fx in stuck[:12]
        )
        return f"{len(stuck)} rows not ended: {rows}; " + "; ".join(said)

    wait_for(settled, 240, "every stored event to complete on the new primary", seen=unresolved)
    rows = ledger_rows(new_primary)
    lost = [e for e in acknowledged if e not in rows]
    effects = Counter(line[1] for line in workers.lines("effect"))
    unknown = [e for e, (status, _) in rows.items() if status == "unknown"]
    print(
        f"\n{'sync' if replica.synchronous else 'async'} standby: {len(acknowledged)} events "
        f"answered 200 ({feishu.refused} deliveries refused during the switch), "
        f"{len(lost)} of them lost, {len(unknown)} ended unknown, "
        f"{sum(n > 1 for n in effects.values())} effects twice"
    )
    for proc in procs:  # each worker's listener subscribed again on the new primary, alone
        wait_for(
            lambda proc=proc: f"LISTEN on 127.0.0.1:{replica.standby_port}" in workers.stderr(proc),
            60,
            "the listener to subscribe on the new primary",
        )
    if replica.synchronous:
        assert lost == [], f"{len(lost)} acknowledged events lost with a synchronous standby"
        assert all(rows[e][0] == "completed" for e in acknowledged)
        assert [e for e in acknowledged if effects[e] != 1] == [], "an effect ran twice or never"
        ended = {line[1]: int(line[3]) for line in workers.lines("end")}
        starts = {line[1]: int(line[3]) for line in workers.lines("start")}  # the last run's
        for chat, expected in feishu.answered.items():
            for earlier, later in itertools.pairwise(expected):
                assert ended[earlier] < starts[later], f"{chat}: {earlier} ran after {later}"
        assert sample(before_switch, 'feishu_inbox_ingest_replication_total{replication="sync"}')
        assert not sample(
            before_switch, 'feishu_inbox_ingest_replication_total{replication="async"}'
        )
    else:
        # What an asynchronous standby costs: acknowledged, then lost (0 here when it had
        # streamed everything before the kill). Each shows as acknowledged without a
        # synchronous standby, with the lag it had.
        assert sample(before_switch, 'feishu_inbox_ingest_replication_total{replication="async"}')
        assert sample(before_switch, "feishu_inbox_ingest_replication_lag_bytes_count")
        # What the standby had settles without anyone: completed, or unknown where it had an
        # effect's start but not its end (the ledger never guesses whether it happened), its
        # chat's later events waiting behind it. The operator settles each unknown one as
        # the remote side says (here the effect log): then every stored event completes, an
        # effect that had not happened runs once.
        assert lost, "the standby held back had every event answered after: it was not held"
        assert {status for status, _ in rows.values()} <= {"completed", "unknown", "queued"}
        unknown_ids = {
            event: job_id for event, job_id in job_ids(new_primary).items() if event in unknown
        }
        for applied in (True, False):
            chosen = [str(unknown_ids[e]) for e in unknown if (effects[e] > 0) is applied]
            if chosen:
                subprocess.run(
                    [
                        sys.executable,
                        "manage.py",
                        "inbox",
                        "reconcile",
                        *chosen,
                        "--applied" if applied else "--not-applied",
                    ],
                    cwd=ROOT,
                    env=subprocess_env(**env),
                    check=True,
                    timeout=120,
                )
        wait_for(
            lambda: set(s for s, _ in ledger_rows(new_primary).values()) == {"completed"},
            120,
            "every stored event to complete once the operator settled the unknown ones",
            seen=lambda: Counter(s for s, _ in ledger_rows(new_primary).values()),
        )
        after = Counter(line[1] for line in workers.lines("effect"))
        assert [e for e in unknown if after[e] != 1] == [], "a settled effect twice or never"


def test_a_read_only_server_is_the_database_away_never_a_jobs_failure(workers: Workers) -> None:
    """What sessions meet on a server that stopped being the primary under them (a failover
    that kept them, a pooler still pointing there): every write refused with SQLSTATE 25006.
    Here the test database turns read-only under running handlers (its default, and every
    session ended so that each new one is read-only), then writable again: their effects'
    starts are tried again on new connections, and every job completes once, no attempt
    spent, no effect twice, nobody acting."""
    from django.db import connection

    from tests.support.worker_helpers import enqueue

    name = connection.settings_dict["NAME"]
    ids = [enqueue(f"ro-{n}", ["gate:go", "effect"], partition=f"chat-{n}") for n in range(8)]
    proc = workers.start("--concurrency", "4")
    wait_for(lambda: len(workers.lines("start")) == 4, 60, "four handlers at their gate")
    with connection.cursor() as cur:
        cur.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        cur.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    try:
        workers.open_gate("go")
        wait_for(
            lambda: "read-only transaction" in workers.stderr(proc),
            60,
            "the worker to meet the read-only server",
        )
    finally:
        with connection.cursor() as cur:
            cur.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
    wait_all_completed_ids(ids, 120, lambda: workers.stderr(proc))
    effects = Counter(line[1] for line in workers.lines("effect"))
    assert effects == {f"ro-{n}": 1 for n in range(8)}, effects
    assert set(EventJob.objects.values_list("attempt", flat=True)) == {1}
    assert "database_error" not in workers.stderr(proc)


def wait_all_completed_ids(ids: list[int], timeout: float, stderr: Callable[[], str]) -> None:
    from django.db import connection

    def settled() -> object:
        connection.close()
        found = Counter(EventJob.objects.filter(pk__in=ids).values_list("status", flat=True))
        return (
            found
            if found == {"completed": len(ids)} or {"failed", "unknown"} & set(found)
            else False
        )

    wait_for(settled, timeout, "every job to complete", seen=stderr)
    assert Counter(EventJob.objects.filter(pk__in=ids).values_list("status", flat=True)) == {
        "completed": len(ids)
    }, stderr()
