"""Signed, encrypted deliveries through a real server (gunicorn), beside a do-nothing view.

For PostgreSQL and SQLite: the most deliveries per second 8 clients get through, the same for a
view that only reads the body (the ratio is what verification + the durable write cost), and
p50/p99 latency at a steady 200 deliveries/s. Goals: p99 < 50 ms at 200/s; ingest >= 50% of
the do-nothing rate.

    .venv/bin/python bench/ingest.py [--seconds 8] [--rate 200] [--clients 8] [--workers 4]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from _setup import ROOT, fresh_postgres, fresh_sqlite, percentile, reproduce

sys.path.insert(0, str(ROOT))
from tests.support.feishu_client import ENCRYPT_KEY, TOKEN, delivery, message_event


def start(url: str, port: int, workers: int, threads: int = 1) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "FEISHU_ENCRYPT_KEY": ENCRYPT_KEY,
        "FEISHU_VERIFICATION_TOKEN": TOKEN,
        "LOG_LEVEL": "ERROR",
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "project.wsgi",
            "-b",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
            "--log-level",
            "error",
        ],
        cwd=ROOT,
        env=env,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).connect()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("gunicorn did not start")


def bodies(n: int) -> list[tuple[bytes, dict[str, str]]]:
    return [delivery(message_event(chat_id=f"oc_{i % 200}")) for i in range(n)]


def post(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, float]:
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", path, body, headers)
    status = conn.getresponse().status
    conn.close()
    return status, time.perf_counter() - start


def max_rate(
    port: int, path: str, work: list[tuple[bytes, dict[str, str]]], clients: int, seconds: float
) -> float:
    """Closed loop: ``clients`` threads post back to back for ``seconds``."""
    lock = threading.Lock()
    index = [0]
    done = [0]
    deadline = time.monotonic() + seconds

    def client() -> None:
        while time.monotonic() < deadline:
            with lock:
                i = index[0]
                index[0] += 1
            body, headers = work[i % len(work)]
            status, _ = post(port, path, body, headers)
            assert status == 200, status
            with lock:
                done[0] += 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0] / (time.monotonic() - started)


def steady(
    port: int, path: str, work: list[tuple[bytes, dict[str, str]]], rate: float, seconds: float
) -> list[float]:
    """Open loop: one request every 1/rate s (from a pool of senders); returns latencies."""
    latencies: list[float] = []
    lock = threading.Lock()
    total = int(rate * seconds)
    start = time.perf_counter() + 0.2
    cursor = [0]

    def sender() -> None:
        while True:
            with lock:
                i = cursor[0]
                cursor[0] += 1
            if i >= total:
                return
            wait = start + i / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)  # pacing the load, not synchronisation
            body, headers = work[i % len(work)]
            status, took = post(port, path, body, headers)
            assert status == 200, status
            with lock:
                latencies.append(took)

    threads = [threading.Thread(target=sender) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    results = {}
    for backend in ("postgres", "sqlite"):
        url = fresh_postgres("fi_bench_ingest") if backend == "postgres" else fresh_sqlite("ingest")
        # SQLite has one writer: one process with threads, whose writers queue on an in-process
        # lock, answers far steadier than several processes meeting SQLite's busy handler.
        if backend == "postgres":
            proc = start(url, args.port, args.workers)
        else:
            proc = start(url, args.port, 1, threads=args.workers * 2)
        try:
            need = int(max(args.rate * args.seconds, 1) + 6000)
            work = bodies(need)
            noop = max_rate(args.port, "/bench/noop/", work, args.clients, args.seconds)
            ingest = max_rate(
                args.port, "/feishu/events/", work[: need // 2], args.clients, args.seconds
            )
            lat = steady(args.port, "/feishu/events/", work[need // 2 :], args.rate, args.seconds)
        finally:
            proc.terminate()
            proc.wait(15)
        p50, p99 = percentile(lat, 50) * 1000, percentile(lat, 99) * 1000
        results[backend] = {
            "ingest_per_s": round(ingest),
            "noop_per_s": round(noop),
            "ratio": round(ingest / noop, 2),
            f"p50_ms_at_{args.rate:.0f}": round(p50, 1),
            f"p99_ms_at_{args.rate:.0f}": round(p99, 1),
        }
        print(
            f"{backend}: ingest {ingest:.0f}/s vs do-nothing view {noop:.0f}/s "
            f"(ratio {ingest / noop:.2f}, goal >= 0.5); at {args.rate:.0f}/s p50 {p50:.1f} ms, "
            f"p99 {p99:.1f} ms (goal p99 < 50 ms)"
        )
    print(json.dumps(results, indent=2))
    print(
        f"gunicorn: PostgreSQL --workers {args.workers}, SQLite --workers 1 --threads "
        f"{args.workers * 2}; reproduce: {reproduce()}"
    )


if __name__ == "__main__":
    Path(ROOT / ".bench").mkdir(exist_ok=True)
    main()
