"""Events through one long connection, beside the webhook's ingest, in one run.

For PostgreSQL and SQLite: a real ``feishu_connect`` process on the fake endpoint
(``tests/support/fake_feishu_ws.py``, in this process) receives a burst of events pushed back to
back — events/s from the first push to the last code-200 ACK (each ACK follows its commit) —
and then a steady stream, whose ACK latency (frame sent → ACK received) gives p50/p99. The
webhook's figures of ``bench/ingest.py`` (gunicorn, signed and encrypted deliveries) are
measured in the same run on the same database for comparison.

    .venv/bin/python bench/long_connection.py [--events 3000] [--rate 200] [--seconds 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _setup import ROOT, fresh_postgres, fresh_sqlite, percentile, reproduce
from ingest import bodies, max_rate, start, steady

sys.path.insert(0, str(ROOT))
from tests.support.fake_feishu_ws import FakeLongConnection, event


def connect(url: str, fake: FakeLongConnection) -> subprocess.Popen[bytes]:
    settings = {"APPS": {"main": {"APP_ID": "cli_bench", "APP_SECRET": "s", "DOMAIN": fake.url}}}
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "tests.support.settings_json",
        "DEMO_APP": "0",
        "FEISHU_INBOX_JSON": json.dumps(settings),
        "LOG_LEVEL": "ERROR",
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "feishu_connect", "-v", "0"], cwd=ROOT, env=env
    )
    deadline = time.monotonic() + 30
    while not fake.open_connections():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise SystemExit("feishu_connect did not connect")
        time.sleep(0.05)  # polling for the connection, not synchronisation
    return proc


def wait_acked(fake: FakeLongConnection, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not fake.all_acked():
        if time.monotonic() > deadline:
            raise SystemExit("not every event was ACKed")
        time.sleep(0.005)


def burst(fake: FakeLongConnection, n: int, tag: str) -> float:
    started = time.perf_counter()
    for i in range(n):
        fake.push("cli_bench", event(f"{tag}{i}", chat_id=f"oc_{i % 200}", app_id="cli_bench"))
    wait_acked(fake, 120)
    return n / (time.perf_counter() - started)


def stream(fake: FakeLongConnection, rate: float, seconds: float, tag: str) -> list[float]:
    first = len(fake.acks)
    start_at = time.perf_counter()
    for i in range(int(rate * seconds)):
        wait = start_at + i / rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)  # pacing the load, not synchronisation
        fake.push("cli_bench", event(f"{tag}{i}", chat_id=f"oc_{i % 200}", app_id="cli_bench"))
    wait_acked(fake, 60)
    return [a.latency for a in fake.acks[first:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--port", type=int, default=8766)
    args = parser.parse_args()
    results = {}
    for backend in ("postgres", "sqlite"):
        url = fresh_postgres("fi_bench_longconn") if backend == "postgres" else fresh_sqlite("lc")
        # ack_timeout: no redelivery while the burst queues (it would measure the fake)
        with FakeLongConnection({"cli_bench": "s"}, ack_timeout=120) as fake:
            proc = connect(url, fake)
            try:
                burst(fake, 200, "warm")
                per_s = burst(fake, args.events, "burst")
                lat = stream(fake, args.rate, args.seconds, "steady")
                duplicates = len(fake.acks) - len(fake.pending)
            finally:
                proc.terminate()
                proc.wait(15)
        url = fresh_postgres("fi_bench_ingest") if backend == "postgres" else fresh_sqlite("ingest")
        hook = start(url, args.port, 4) if backend == "postgres" else start(url, args.port, 1, 8)
        try:
            work = bodies(args.events + int(args.rate * args.seconds))
            hook_per_s = max_rate(args.port, "/feishu/events/", work[: args.events], 8, 5)
            hook_lat = steady(args.port, "/feishu/events/", work[args.events :], args.rate, 5)
        finally:
            hook.terminate()
            hook.wait(15)
        results[backend] = {
            "long_connection_per_s": round(per_s),
            f"ack_p50_ms_at_{args.rate:.0f}": round(percentile(lat, 50) * 1000, 1),
            f"ack_p99_ms_at_{args.rate:.0f}": round(percentile(lat, 99) * 1000, 1),
            "redelivered": duplicates,
            "webhook_per_s": round(hook_per_s),
            f"webhook_p50_ms_at_{args.rate:.0f}": round(percentile(hook_lat, 50) * 1000, 1),
            f"webhook_p99_ms_at_{args.rate:.0f}": round(percentile(hook_lat, 99) * 1000, 1),
        }
        r = results[backend]
        print(
            f"{backend}: one long connection {per_s:.0f} events/s (push to commit+ACK); ACK "
            f"p50 {r[f'ack_p50_ms_at_{args.rate:.0f}']} ms, p99 "
            f"{r[f'ack_p99_ms_at_{args.rate:.0f}']} ms at {args.rate:.0f}/s (Feishu's budget: "
            f"3,000 ms) | webhook {hook_per_s:.0f}/s with 8 clients, p99 "
            f"{r[f'webhook_p99_ms_at_{args.rate:.0f}']} ms"
        )
    print(json.dumps(results, indent=2))
    print(f"reproduce: {reproduce()}")


if __name__ == "__main__":
    (ROOT / ".bench").mkdir(exist_ok=True)
    main()
