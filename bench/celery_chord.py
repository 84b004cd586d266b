"""Celery's chord for bench/workflows.py: ``chord(group(noop.s(i) for i in range(N)))(collect.s())``
with a Redis broker and a Redis result backend, ``celery worker -P prefork -c C`` (P processes).

Runs with the peers' Celery interpreter (bench/workflows.py makes it, as bench/worker.py does:
/tmp/feishu-inbox-peers/.venv-celery), not the project's: nothing of Celery's enters the project.

    /tmp/feishu-inbox-peers/.venv-celery/bin/python bench/celery_chord.py --n 10000 --procs 1 -c 4

Starts the workers, waits until each is ready, then times from the chord's apply to the moment
its callback ran (the callback writes its time and how many results it got to a file); stops
the workers; prints one JSON object. ``CHORD_REDIS`` (default redis://127.0.0.1:6379/11: the
bench's own Redis database, flushed before each run) holds the broker and the results.
``--config reliable`` (default): acks_late and prefetch 1, as the peers' Celery harness runs it;
``default``: Celery's own defaults.
"""

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from celery import Celery, chord, group, signals

REDIS = os.environ.get("CHORD_REDIS", "redis://127.0.0.1:6379/11")
CONFIG = os.environ.get("CHORD_CONFIG", "reliable")
DONE_FILE = os.environ.get("CHORD_DONE_FILE")
READY_DIR = os.environ.get("CHORD_READY_DIR")

app = Celery("chordbench", broker=REDIS, backend=REDIS)
app.conf.update(broker_connection_retry_on_startup=True, result_expires=3600)
if CONFIG == "reliable":
    app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1)
elif CONFIG != "default":
    raise SystemExit(f"CHORD_CONFIG={CONFIG!r}: reliable or default")


@app.task(name="chord.noop")
def noop(i):
    return i


@app.task(name="chord.collect")
def collect(results):
    t = time.time()
    with open(DONE_FILE, "a") as f:
        f.write(f"{t!r} {len(results)} {int(sorted(results) == list(range(len(results))))}\n")


@signals.worker_ready.connect
def _ready(**_):
    if READY_DIR:
        with open(os.path.join(READY_DIR, f"ready-{os.getpid()}"), "w") as f:
            f.write(repr(time.time()))


def _read(path):
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        return f.read()


def _start(celery, here, k, env, work):
    with open(os.path.join(work, f"worker{k}.log"), "wb") as log:
        return subprocess.Popen(
            [
                celery,
                "--workdir",
                here,
                "-A",
                "celery_chord",
                "worker",
                "-P",
                "prefork",
                "-c",
                str(env["CHORD_CONCURRENCY"]),
                "-n",
                f"chord{k}@%h",
                "-l",
                "WARNING",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )


def run(n, procs, concurrency, timeout):
    import redis

    redis.Redis.from_url(REDIS).flushdb()  # the bench's own database number only
    work = tempfile.mkdtemp(prefix="chord-")
    done_file = os.path.join(work, "done.txt")
    env = {
        **os.environ,
        "CHORD_DONE_FILE": done_file,
        "CHORD_READY_DIR": work,
        "CHORD_REDIS": REDIS,
        "CHORD_CONFIG": CONFIG,
        "CHORD_CONCURRENCY": str(concurrency),
    }
    celery = os.path.join(os.path.dirname(sys.executable), "celery")
    here = os.path.dirname(os.path.abspath(__file__))
    workers = [_start(celery, here, k, env, work) for k in range(procs)]
    try:
        deadline = time.monotonic() + 120
        while len(glob.glob(os.path.join(work, "ready-*"))) < procs:
            if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
                raise SystemExit(f"the Celery workers did not start (logs in {work})")
            time.sleep(0.05)
        t0 = time.time()
        chord(group(noop.s(i) for i in range(n)))(collect.s())
        applied = time.time()
        deadline = time.monotonic() + timeout
        while not _read(done_file).strip():
            if time.monotonic() > deadline:
                raise SystemExit(f"the chord's callback did not run in {timeout} s ({work})")
            time.sleep(0.02)
        time.sleep(0.5)  # a second callback (a chord firing twice) would show here
        lines = [ln for ln in _read(done_file).split("\n") if ln]
        t1, got, ordered = lines[0].split()
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)  # warm shutdown
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
    seconds = float(t1) - t0
    return {
        "n": n,
        "procs": procs,
        "concurrency": concurrency,
        "seconds": seconds,
        "apply_seconds": applied - t0,
        "children_per_s": n / seconds,
        "results": int(got),
        "in_order": bool(int(ordered)),
        "callbacks": len(lines),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("-c", "--concurrency", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    print(json.dumps(run(args.n, args.procs, args.concurrency, args.timeout)))


if __name__ == "__main__":
    main()
