"""Outbound webhooks (SPEC §9h): deliveries per second, and what the ledger costs per delivery.

1. ``--messages`` messages published (no key: each may go in parallel) to one endpoint, a local
   receiver process (``tests/support/webhook_receiver.py``: it verifies every request with the
   ``standardwebhooks`` package and logs it), delivered by one ``runworker --burst`` of 4 slots:
   deliveries per second, from the worker's start to its exit.
2. The same number of signed POSTs to the same receiver from 4 threads with ``urllib`` alone
   (no ledger): requests per second.
3. The ledger's cost per delivery: the difference of the two, per slot (the claim, the effect's
   begin and end, the attempt row, the finish), in milliseconds.

    .venv/bin/python bench/webhooks.py [--messages 2000] [--sqlite]

The machine may be shared: the figures are indicative, run it a few times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _setup import ROOT, each_backend, fresh_postgres, fresh_sqlite, reproduce, wait_for_exit

SLOTS = 4
SETTINGS = {"WEBHOOK_ALLOW_PRIVATE": True, "WEBHOOK_TIMEOUT_SECONDS": 10.0}


def start_receiver(port: int, secret: str, log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "tests.support.webhook_receiver", "--port", str(port)),
            *("--secret", secret, "--log", str(log)),
        ],
        cwd=ROOT,
    )
    import socket

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.05)  # polling for the port, at start-up only
    raise RuntimeError("the receiver did not listen")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(backend: str, messages: int) -> dict[str, float]:
    url = fresh_postgres("fi_bench_webhooks") if backend == "postgres" else fresh_sqlite("wh")
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.support.settings_json"
    os.environ["FEISHU_INBOX_JSON"] = json.dumps(SETTINGS)
    os.environ["LOG_LEVEL"] = "ERROR"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from feishu_inbox import webhooks
    from feishu_inbox.models import EventJob
    from feishu_inbox.webhooks import signing

    port = free_port()
    tmp = Path(tempfile.mkdtemp())
    new = webhooks.add_endpoint(f"http://127.0.0.1:{port}/hooks")
    receiver = start_receiver(port, new.secret, tmp / "receiver.jsonl")
    try:
        for n in range(messages):
            webhooks.publish("bench.event", {"n": n, "text": "x" * 200})
        env = {**os.environ, "FEISHU_INBOX_HANDLERS": "", "LOG_LEVEL": "WARNING"}
        started = time.perf_counter()
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "runworker", "--concurrency", str(SLOTS), "--burst"],
            cwd=ROOT,
            env=env,
        )
        worker_cpu = wait_for_exit([worker])
        ledger_seconds = time.perf_counter() - started
        done = EventJob.objects.filter(app="webhooks", status="completed").count()
        assert done == messages, done

        body = json.dumps({"type": "bench.event", "data": {"text": "x" * 200}}).encode()

        def post(n: int) -> int:
            headers = signing.headers(f"msg_bare{n}", int(time.time()), body, [new.secret])
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/hooks",
                data=body,
                headers={**headers, "content-type": "application/json"},
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=10) as answer:
                answer.read(1024)
                return int(answer.status)

        started = time.perf_counter()
        with ThreadPoolExecutor(SLOTS) as pool:
            statuses = list(pool.map(post, range(messages)))
        bare_seconds = time.perf_counter() - started
        assert set(statuses) == {200}, set(statuses)
    finally:
        receiver.kill()
        receiver.wait()
    ledger_rate, bare_rate = messages / ledger_seconds, messages / bare_seconds
    return {
        "deliveries_per_second": round(ledger_rate, 1),
        "bare_posts_per_second": round(bare_rate, 1),
        "ledger_ms_per_delivery_per_slot": round(
            (SLOTS / ledger_rate - SLOTS / bare_rate) * 1000, 2
        ),
        "worker_seconds_incl_start": round(ledger_seconds, 2),
        "worker_cpu_ms_per_delivery_incl_start": round(worker_cpu / messages * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--sqlite", action="store_true")
    parser.add_argument("--backend", choices=["postgres", "sqlite"])
    args = parser.parse_args()
    if args.backend:
        print(json.dumps(measure(args.backend, args.messages)))
        return
    print(f"# {reproduce()}  ({SLOTS} slots, 1 worker, a local verifying receiver)")
    for backend, figures in each_backend(__file__, args.sqlite):
        print(f"{backend}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
