"""Conversation turns (SPEC §9g, issue 50): turns per second at 1 x 4 with bursts of 1, 3 and
8 messages, and the latency forming a turn adds (the quiet window aside). Each figure and ratio
from one run; real ``runworker`` processes (bench/turn_handlers.py), no Feishu API call.

1. Throughput, 1 process x 4 slots (``runworker --burst``). ``--messages`` (2,000) Feishu-shaped
   ``im.message.receive_v1`` events (as tests/support/feishu_client.message_event builds them;
   partition ``default:chat:<chat_id>``, dedupe ``message:<message_id>``, as the webhook stores
   them) in ``messages / burst`` chats of ``burst`` messages each (1, 3, 8), enqueued through
   ``feishu_inbox.ledger.enqueue`` before the worker starts (round-robin over the chats, as
   bursts interleave; so every quiet window has passed). Two cases per burst size, the same
   messages: **turns**, a coalescing no-op handler (``Coalesce(quiet=0.0, max_wait=0.0,
   max_messages=8)``: one turn per chat, the ledger takes the rest of the burst in), and
   **plain**, a no-op handler of its own event type (``bench.turn_plain``), one job per
   message. Measured from the first claim to the last finish, as the ledger recorded them
   (``claimed_at``, ``finished_at``): turns/s (= handler runs/s) and messages/s, the worker's
   CPU per message (start-up included) and, on PostgreSQL, the database's commits per message
   (every session's). Each run is checked: every message completed on its first attempt, a
   turns case with one turn per chat holding its whole burst (its ``turn`` step). Ratios
   turns / plain: messages/s (what coalescing a burst gains) and, for bursts of 1, handler
   runs/s (what forming a turn of one message costs).
2. Added latency: one idle ``runworker`` of 4 slots (woken by NOTIFY on PostgreSQL; on SQLite
   by its poll, every 10 ms here), one message every ``--gap`` s (a fixed schedule), each to a chat of its
   own, alternating the coalescing handler (quiet 0: no window to wait) and the plain one,
   ``--samples`` (200) of each; enqueue -> handler start (``time.time()`` before the enqueue,
   and at the handler's first line), p50 and p99 of each, and their differences: what forming
   a turn (reading what waits behind the message, the database's clock, and the fenced
   transaction that records the turn) adds to a message's wait.

Rounds alternate the order of the cases (``--rounds``, 3); medians of the rounds are printed.
``--sqlite`` measures SQLite too. The machine's speed swings: compare figures of one run only.

    nice -n 10 .venv/bin/python bench/turns.py [--messages 2000] [--samples 200] [--gap 0.05]
        [--rounds 3] [--sqlite]

A short trial: ``--messages 400 --samples 40 --rounds 1``. PostgreSQL database
``fi_benchturns_run`` (plus ``$BENCH_DB_SUFFIX``) on ``$BENCH_PG``; SQLite's in ``.bench/``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _setup import (
    ROOT,
    analyze,
    django_setup,
    empty_ledger,
    fresh_postgres,
    fresh_sqlite,
    median,
    percentile,
    reproduce,
    wait_for_exit,
)

BURSTS = (1, 3, 8)
MESSAGE_EVENT = "im.message.receive_v1"
PLAIN = "bench.turn_plain"  # bench/turn_handlers.py
APP = "default"
#: A burst's texts, as people type them.
TEXTS = ("hi", "can you", "summarise the doc I sent yesterday", "in English", "thanks", "and", "?")
HANDLERS = "bench.turn_handlers"


def worker_env(url: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": url,
        "FEISHU_INBOX_HANDLERS": HANDLERS,
        "LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(ROOT),
        **extra,
    }


# --- the ledger ------------------------------------------------------------------------------


def commits() -> int | None:
    """The database's committed transactions so far (PostgreSQL; None on SQLite). Sessions
    flush their counts when they end: the burst worker has ended when this is read."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
        cur.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        return int(cur.fetchone()[0])


def envelope(chat_id: str, text: str, **extra: Any) -> dict[str, Any]:
    """A Feishu ``im.message.receive_v1`` delivery, as the tests' client builds it."""
    from tests.support.feishu_client import message_event

    found = message_event(chat_id=chat_id, text=text)
    found.update(extra)
    return found


def store(found: dict[str, Any], event_type: str) -> int:
    """Enqueue ``found`` as the webhook stores a delivery (its keys, the app's partition)."""
    from feishu_inbox import ledger

    message = found["event"]["message"]
    return ledger.enqueue(
        app=APP,
        event_id=found["header"]["event_id"],
        event_type=event_type,
        dedupe_key=f"message:{message['message_id']}",
        partition_key=f"{APP}:chat:{message['chat_id']}",
        payload=found,
    ).job_id


def fill(chats: int, burst: int, event_type: str) -> None:
    """``chats`` chats of ``burst`` messages each, round-robin over the chats, in one
    transaction (set-up only); then the statistics, as autovacuum would give them."""
    from django.db import transaction

    stamp = f"{time.time():.6f}"
    with transaction.atomic():
        for k in range(burst):
            for c in range(chats):
                store(envelope(f"oc_{stamp}_{c}", TEXTS[k % len(TEXTS)]), event_type)
    analyze()


# --- 1. throughput ---------------------------------------------------------------------------


def throughput(messages: int, burst: int, coalesce: bool, url: str) -> dict[str, float]:
    """One case: ``messages`` in chats of ``burst`` on 1 x 4 (``runworker --burst``)."""
    from django.db import connection
    from django.db.models import Max, Min

    from feishu_inbox.models import EventJob, Step

    chats = max(1, round(messages / burst))
    n = chats * burst
    empty_ledger()
    fill(chats, burst, MESSAGE_EVENT if coalesce else PLAIN)
    before = commits()
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "runworker", "--burst", "--concurrency", "4", "-v", "0"],
        cwd=ROOT,
        env=worker_env(url),
    )
    cpu = wait_for_exit([worker])
    after = commits()
    connection.close()  # a fresh snapshot of what the worker committed
    jobs = EventJob.objects.all()
    assert jobs.count() == n, (jobs.count(), n)
    assert jobs.filter(status="completed").count() == n, list(
        jobs.exclude(status="completed").values("status", "error_type", "error_message")[:3]
    )
    ran = jobs.exclude(error_type="Coalesced")
    assert not ran.exclude(error_type="").exists(), list(
        ran.exclude(error_type="").values("error_type", "error_message")[:3]
    )
    assert not ran.exclude(attempt=1).exists(), list(ran.exclude(attempt=1).values("attempt")[:3])
    runs = ran.count()
    if coalesce:
        assert runs == chats, (runs, chats)  # one turn per chat…
        sizes = []
        for result in Step.objects.filter(name="turn").values_list("result", flat=True):
            value = json.loads(result) if isinstance(result, str) else result
            sizes.append(len(value["messages"]))
        assert sizes == [burst] * chats, sorted(set(sizes))  # …holding its whole burst
        assert jobs.filter(error_type="Coalesced").count() == n - chats
    else:
        assert runs == n, (runs, n)
    window = jobs.aggregate(first=Min("claimed_at"), last=Max("finished_at"))
    seconds = (window["last"] - window["first"]).total_seconds()
    result = {
        "messages": n,
        "runs": runs,
        "seconds": seconds,
        "runs_per_s": runs / seconds,
        "messages_per_s": n / seconds,
        "cpu_us_per_message": 1e6 * cpu / n,
    }
    if before is not None and after is not None:
        result["commits_per_message"] = (after - before) / n
    return result


# --- 2. added latency ------------------------------------------------------------------------


def start_idle_worker(url: str, out: Path) -> subprocess.Popen[bytes]:
    """One idle ``runworker`` of 4 slots, past its start-up."""
    log = out.parent / "worker.log"
    # SQLite has no NOTIFY: the idle worker polls, every 10 ms here (1 s by default)
    poll = {} if url.startswith("postgres") else {"FEISHU_INBOX_POLL_INTERVAL": "0.01"}
    with open(log, "wb") as err:  # a file, not a pipe: nobody has to keep reading it
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "runworker", "--concurrency", "4", "-v", "1"],
            cwd=ROOT,
            env=worker_env(url, LOG_LEVEL="INFO", BENCH_LATENCY_FILE=str(out), **poll),
            stderr=err,
        )
    deadline = time.monotonic() + 60
    while b"started" not in log.read_bytes():  # its start-up line
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise SystemExit(f"the worker did not start: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    return proc


def latency(url: str, samples: int, gap: float, turn_first: bool) -> dict[str, float]:
    """Enqueue -> handler start, ms, for ``samples`` messages to each handler, alternating."""
    empty_ledger()
    out = Path(tempfile.mkdtemp(prefix="benchturns-")) / "latency.txt"
    proc = start_idle_worker(url, out)
    kinds = (MESSAGE_EVENT, PLAIN) if turn_first else (PLAIN, MESSAGE_EVENT)
    total = 2 * samples
    try:
        time.sleep(1.0)  # into its idle sleep (what is measured)
        stamp = f"{time.time():.6f}"
        start = time.monotonic()
        for i in range(total):
            t0 = time.time()
            store(envelope(f"oc_lat_{stamp}_{i}", "hi", bench_t0=t0), kinds[i % 2])
            # the arrivals' schedule: message i+1 is due at start + (i+1) gaps
            time.sleep(max(0.0, start + (i + 1) * gap - time.monotonic()))
        deadline = time.monotonic() + 60
        while not out.exists() or len(out.read_text().splitlines()) < total:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"not every message's handler started: {out}")
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(30)
    ms: dict[str, list[float]] = {"turn": [], "plain": []}
    for line in out.read_text().splitlines():
        kind, t0, started, size = line.split()
        assert int(size) == 1, line  # a turn of its one message
        ms[kind].append((float(started) - float(t0)) * 1000)
    assert len(ms["turn"]) == len(ms["plain"]) == samples, {k: len(v) for k, v in ms.items()}
    found = {}
    for kind, values in ms.items():
        found[f"{kind}_p50_ms"] = percentile(values, 50)
        found[f"{kind}_p99_ms"] = percentile(values, 99)
    found["added_p50_ms"] = found["turn_p50_ms"] - found["plain_p50_ms"]
    found["added_p99_ms"] = found["turn_p99_ms"] - found["plain_p99_ms"]
    return found


# --- one backend -----------------------------------------------------------------------------


def measure(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    found: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        found.setdefault(key, []).append(value)

    url = fresh_postgres("fi_benchturns_run") if backend == "postgres" else fresh_sqlite("turns")
    # The demo's settings without the demo app (its echo handler is im.message.receive_v1's),
    # here and in the workers (they inherit it).
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.support.settings_json"
    os.environ["DEMO_APP"] = "0"
    django_setup(url)
    cases = [(burst, coalesce) for burst in BURSTS for coalesce in (True, False)]
    for r in range(args.rounds):
        ran: dict[tuple[int, bool], dict[str, float]] = {}
        for burst, coalesce in cases if r % 2 == 0 else cases[::-1]:  # the order alternates
            ran[burst, coalesce] = got = throughput(args.messages, burst, coalesce, url)
            label = f"{'turns' if coalesce else 'plain'}_{burst}"
            for key, value in got.items():
                add(f"{label}_{key}", value)
            print(f"round {r + 1}: {label}: {got}", file=sys.stderr)
        for burst in BURSTS:
            turns, plain = ran[burst, True], ran[burst, False]
            add(f"ratio_messages_{burst}", turns["messages_per_s"] / plain["messages_per_s"])
            add(f"ratio_runs_{burst}", turns["runs_per_s"] / plain["runs_per_s"])
        if args.samples:
            lat = latency(url, args.samples, args.gap, turn_first=r % 2 == 0)
            for key, value in lat.items():
                add(key, value)
            print(f"round {r + 1}: latency: {lat}", file=sys.stderr)
    from django.db import connections

    connections.close_all()
    return {k: median(v) for k, v in found.items()} | {
        f"{k}_rounds": v for k, v in found.items() if k.startswith(("ratio_", "added_"))
    }


# --- the table -------------------------------------------------------------------------------


def table(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    backends = list(results)
    names = {"postgres": "PostgreSQL", "sqlite": "SQLite"}
    head = "| figure | " + " | ".join(names[b] for b in backends) + " |"
    rows = [head, "| --- |" + " ---: |" * len(backends)]

    def row(label: str, key: str, fmt: str) -> None:
        cells = []
        for b in backends:
            value = results[b].get(key)
            cells.append("-" if value is None else format(value, fmt))
        rows.append(f"| {label} | " + " | ".join(cells) + " |")

    for burst in BURSTS:
        what = f"bursts of {burst}"
        row(f"{what}: turns/s (coalescing)", f"turns_{burst}_runs_per_s", ",.0f")
        row(f"{what}: messages/s, turns", f"turns_{burst}_messages_per_s", ",.0f")
        row(f"{what}: messages/s, plain (a job each)", f"plain_{burst}_messages_per_s", ",.0f")
        row(f"{what}: messages/s, turns / plain", f"ratio_messages_{burst}", ".2f")
        if burst == 1:
            row(f"{what}: handler runs/s, turns / plain", "ratio_runs_1", ".2f")
        row(f"{what}: worker CPU µs/message, turns", f"turns_{burst}_cpu_us_per_message", ",.0f")
        row(f"{what}: worker CPU µs/message, plain", f"plain_{burst}_cpu_us_per_message", ",.0f")
        row(f"{what}: commits/message, turns", f"turns_{burst}_commits_per_message", ".2f")
        row(f"{what}: commits/message, plain", f"plain_{burst}_commits_per_message", ".2f")
    if args.samples:
        for kind, label in (("turn", "a turn (quiet 0)"), ("plain", "plain")):
            row(f"enqueue → handler start p50, {label}: ms", f"{kind}_p50_ms", ".1f")
            row(f"enqueue → handler start p99, {label}: ms", f"{kind}_p99_ms", ".1f")
        row("added by forming a turn, p50: ms", "added_p50_ms", ".1f")
        row("added by forming a turn, p99: ms", "added_p99_ms", ".1f")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000, help="messages per case (2,000)")
    parser.add_argument("--samples", type=int, default=200, help="latency samples each (0: skip)")
    parser.add_argument("--gap", type=float, default=0.05, help="s between latency messages")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sqlite", action="store_true", help="SQLite too")
    parser.add_argument("--backend", help=argparse.SUPPRESS)  # one backend per process
    args = parser.parse_args()
    if args.backend is not None:
        print(json.dumps(measure(args.backend, args)))
        return
    argv = [a for a in sys.argv[1:] if a != "--sqlite"]
    results: dict[str, dict[str, Any]] = {}
    for backend in ["postgres"] + (["sqlite"] if args.sqlite else []):
        out = subprocess.run(
            [sys.executable, __file__, *argv, "--backend", backend],
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        ).stdout  # its progress on stderr, as it goes
        results[backend] = json.loads(out.strip().splitlines()[-1])
    print(table(results, args))
    for backend, r in results.items():
        per_round = ", ".join(
            f"{key.removesuffix('_rounds')} {' / '.join(format(v, '.2f') for v in values)}"
            for key, values in r.items()
            if key.endswith("_rounds")
        )
        print(f"{backend}, per round: {per_round}")
    print(json.dumps(results, indent=2))
    print(f"reproduce: {reproduce()}")


if __name__ == "__main__":
    main()
