"""Workflows (SPEC §9f, issue 49): fan-out/fan-in beside Celery's chord, and what children
waiting behind their batches cost the claim. Each figure and ratio from one run.

1. Fan-out/fan-in of ``--children`` (10,000) no-op children, in children/s: ours = one
   ``bench.fanout`` parent (``spawn_many`` the children, ``wait_all`` for them) on real
   ``runworker`` processes, 1 x 4 and 2 x 4 slots, from the parent's enqueue to its finish
   (its ``received_at`` and ``finished_at`` in the ledger); Celery's = ``chord(group(noop.s(i)
   for i in range(N)))(collect.s())``, Redis broker and result backend, ``celery worker -P
   prefork -c 4``, 1 and 2 processes, from the apply to the callback having run
   (bench/celery_chord.py, run with the peers' Celery interpreter). Ratio ours / Celery per
   shape, per round (the median is printed). The workers start, idle, before the clock starts.
2. The claim with ``--backlog`` (100,000) children waiting behind their batches beside none:
   ``backlog / --per-parent`` parents in ``waiting``, each with a closed children batch of
   ``--per-parent`` (100) members queued but held (due in an hour, as a paused event type's
   are: their heads stay in the claimable-heads index), plus as many chains whose ``--links``
   - 1 later links wait in their batch rows (the first link held too), filled by bulk SQL.
   Measured: claim+finish of ``--jobs`` unrelated no-op jobs one at a time (µs/job), and a
   claim that finds nothing (its sweeps included: expiry, due waits, the batches' fold);
   goal ratio <= 1.1. A third case, the same rows with the members completed (no partition
   heads), tells the workflows' own rows (parents, waits, batches, chains) from the held heads.
3. A batch of ``--batch`` (10,000) no-op members with an ``on_complete`` callback on 1 x 4:
   ms from the last member's finish to the callback's start (0 skips it).

``--sqlite`` measures ours on SQLite too (no Celery column). The machine's speed swings: only
figures of one run compare.

    nice -n 10 .venv/bin/python bench/workflows.py [--children 10000] [--backlog 100000]
        [--per-parent 100] [--links 100] [--jobs 2000] [--batch 10000] [--rounds 3]
        [--sqlite] [--no-celery] [--celery-config reliable|default]

A short trial: ``--children 2000 --backlog 20000 --batch 2000 --rounds 1``. PostgreSQL
databases ``fi_benchwf_*`` on ``$BENCH_PG``; Celery's Redis database ``$CHORD_REDIS``
(redis://127.0.0.1:6379/11, flushed before each chord).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
    fresh_postgres,
    fresh_sqlite,
    median,
    reproduce,
    truncate_ledger,
)
from worker import start_workers, stop

PEERS_WORK = Path("/tmp/feishu-inbox-peers")
CELERY_VENV = ".venv-celery"
CELERY_PACKAGES = ["celery[redis]==5.7.0"]  # as bench/worker.py's QUEUE_PEERS
SHAPES = ((1, 4), (2, 4))
NOOP_SPEC = {
    "target": "bench.wf_noop",
    "task": False,
    "payload": {},
    "args": [],
    "key": None,
    "app": None,
}


# --- databases -------------------------------------------------------------------------------


def use_database(backend: str, name: str) -> str:
    """A fresh, migrated database ``fi_benchwf_<name>`` as Django's default; returns its URL."""
    from django.core.management import call_command
    from django.db import connections

    connections.close_all()
    url = (
        fresh_postgres(f"fi_benchwf_{name}")
        if backend == "postgres"
        else fresh_sqlite(f"wf_{name}")
    )
    connections["default"].settings_dict["NAME"] = (
        url.split("/")[-1] if backend == "postgres" else url.split("///", 1)[1]
    )
    call_command("migrate", verbosity=0)
    return url


def empty_ledger() -> None:
    from django.db import connection

    from feishu_inbox.store.schema import BATCH_TABLE, JOB_TABLE, PARTITION_TABLE, WAIT_TABLE

    if connection.vendor == "postgresql":
        truncate_ledger()
        with connection.cursor() as cur:
            cur.execute(f"TRUNCATE {BATCH_TABLE}, feishu_inbox_batchevent")
        return
    with connection.cursor() as cur:  # SQLite: no TRUNCATE; waits before their jobs
        for table in (
            WAIT_TABLE,
            "feishu_inbox_attempt",
            "feishu_inbox_step",
            "feishu_inbox_cardstream",
            JOB_TABLE,
            PARTITION_TABLE,
            BATCH_TABLE,
            "feishu_inbox_batchevent",
        ):
            cur.execute(f"DELETE FROM {table}")


# --- 1. fan-out/fan-in -----------------------------------------------------------------------


def fanout(url: str, n: int, procs: int, concurrency: int, timeout: float) -> dict[str, float]:
    """One ``bench.fanout`` parent of ``n`` children on ``procs`` x ``concurrency`` workers:
    children/s from its enqueue to its finish, as the ledger recorded them."""
    from django.db.models import Max, Min

    from feishu_inbox import ledger
    from feishu_inbox.models import EventJob

    empty_ledger()
    out = Path(tempfile.mkdtemp(prefix="benchwf-")) / "fanout.txt"
    workers = start_workers(url, procs, concurrency, 0.5, BENCH_FANOUT_FILE=str(out))
    try:
        job_id = ledger.enqueue(
            event_id=f"fanout-{time.time()}",
            event_type="bench.fanout",
            partition_key="fanout",
            payload={"n": n},
        ).job_id
        deadline = time.monotonic() + timeout
        while True:
            row = EventJob.objects.filter(id=job_id).values("status", "attempt").first()
            if row and row["status"] in ("completed", "failed", "unknown"):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the parent did not finish in {timeout} s: {row}")
            if any(w.poll() is not None for w in workers):
                raise SystemExit("a worker exited")
            time.sleep(0.05)
    finally:
        stop(workers)
    parent = EventJob.objects.get(id=job_id)
    assert parent.status == "completed", (parent.status, parent.error_type, parent.error_message)
    assert out.read_text().split() == [str(n), str(n)], out.read_text()  # resumed once, all ok
    runs = EventJob.objects.filter(parent_id=job_id, status="completed", attempt=1).count()
    assert runs == n, (runs, n)  # every child ran once
    seconds = (parent.finished_at - parent.received_at).total_seconds()
    kids = EventJob.objects.filter(parent_id=job_id).aggregate(
        first=Min("claimed_at"), last=Max("finished_at")
    )
    return {
        "seconds": seconds,
        "children_per_s": n / seconds,
        "parent_attempts": parent.attempt,
        # Where the time went: until the first child ran (the parent's claim and its
        # spawn_many's commit), the children, and from the last one's end to the parent's.
        "to_first_child_s": (kids["first"] - parent.received_at).total_seconds(),
        "children_s": (kids["last"] - kids["first"]).total_seconds(),
        "fan_in_s": (parent.finished_at - kids["last"]).total_seconds(),
    }


def celery_python() -> Path:
    """The peers' Celery interpreter, made as bench/worker.py makes it if it is missing."""
    py = PEERS_WORK / CELERY_VENV / "bin" / "python"
    if not py.exists():
        PEERS_WORK.mkdir(parents=True, exist_ok=True)
        subprocess.run([shutil.which("python3") or "python3", "-m", "venv", str(py.parent.parent)])
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", *CELERY_PACKAGES],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return py


def celery_chord(n: int, procs: int, concurrency: int, config: str, timeout: float) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "FEISHU_INBOX_HANDLERS")
    }
    env["CHORD_CONFIG"] = config
    done = subprocess.run(
        [
            str(celery_python()),
            str(ROOT / "bench" / "celery_chord.py"),
            "--n",
            str(n),
            "--procs",
            str(procs),
            "-c",
            str(concurrency),
            "--timeout",
            str(timeout),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"the Celery chord failed: {done.stderr.strip()[-800:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["results"] == n and result["callbacks"] == 1, result
    return result


# --- 2. the claim with children waiting behind their batches ---------------------------------


def fill_backlog(children: int, per_parent: int, links: int, held: bool = True) -> dict[str, int]:
    """``children // per_parent`` waiting parents, each with a closed children batch of
    ``per_parent`` held members, and as many chains of ``links`` links (the first held, the
    rest in the chain's row). Bulk SQL; the rows as the ledger writes them. ``held=False``:
    the members completed instead (no partition heads): what the workflows' own rows (the
    waiting parents, their waits, the batches, the chains' links) cost, without the heads."""
    from django.db import connection

    from feishu_inbox.ledger.workflows import CHILDREN_KEY_PREFIX
    from feishu_inbox.store.schema import BATCH_TABLE, JOB_TABLE, PARTITION_TABLE, WAIT_TABLE
    from feishu_inbox.store.waits import PARKED_PREFIX
    from feishu_inbox.tables.batches import BatchEvent

    parents = children // per_parent
    pg = connection.vendor == "postgresql"

    def series(n: int, alias: str) -> str:
        if pg:
            return f"generate_series(1, {int(n)}) AS {alias}(i)"
        return (
            f"(WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < {int(n)})"
            f" SELECT i FROM g) AS {alias}"
        )

    now, hour = (
        ("now()", "now() + interval '1 hour'")
        if pg
        else ("datetime('now')", "datetime('now', '+1 hour')")
    )
    false = "FALSE" if pg else "0"
    js = "::jsonb" if pg else ""
    columns = (
        "app, event_id, event_type, dedupe_key, partition_key, private_message, payload, "
        "status, attempt, received_at, available_at, worker_id, lease_token, "
        "effects_in_flight, side_effect_started, effect_uncertain, error_type, error_message, "
        "resolution"
    )
    batch_columns = (
        'kind, state, mode, total, pending, parent_id, wait_id, callbacks, links, "position", '
        '"length", description, created_at, closed_at, fired_at, fired_jobs, error'
    )
    later = json.dumps([NOOP_SPEC] * (links - 1))
    # status, attempt, received_at, available_at (and finished_at, last in the column list)
    member = f"'queued', 0, {now}, {hour}" if held else f"'completed', 1, {now}, {now}"
    ended = "NULL" if held else now
    with connection.cursor() as cur:
        # The parents: waiting for their children, their chats given back (a parked key).
        cur.execute(
            f"INSERT INTO {JOB_TABLE} ({columns}) SELECT 'default', 'wfp' || s.i, "
            f"'bench.fanout', 'wfp' || s.i, '{PARKED_PREFIX}wfp' || s.i, {false}, "
            f"'{{}}'{js}, 'waiting', 1, {now}, {now}, '', '', 0, {false}, {false}, "
            f"'Waiting', '', '' FROM {series(parents, 's')}"
        )
        key = f"'{CHILDREN_KEY_PREFIX}all:{per_parent}:' || id"
        cur.execute(
            f"INSERT INTO {WAIT_TABLE} (job_id, name, key, until, state, hold_chat, payload, "
            f"created_at, resolved_at, partition_key) SELECT id, {key}, {key}, NULL, 'open', "
            f"{false}, NULL, {now}, NULL, 'wfp' || id FROM {JOB_TABLE} "
            "WHERE event_type = 'bench.fanout'"
        )
        cur.execute(
            f"INSERT INTO {BATCH_TABLE} ({batch_columns}) SELECT 'children', 'closed', 'all', "
            f"{per_parent}, {per_parent}, w.job_id, w.id, '{{}}'{js}, '[]'{js}, 0, 0, "
            f"'children of job ' || w.job_id, {now}, {now}, NULL, '[]'{js}, '' "
            f"FROM {WAIT_TABLE} w ORDER BY w.job_id"
        )
        # Their children: queued, held an hour (each the head of a partition of its own).
        cur.execute(
            f"INSERT INTO {JOB_TABLE} ({columns}, parent_id, batch_id, finished_at) SELECT 'default', "
            "'wf:' || b.parent_id || '.0:1:' || c.i, 'bench.wf_noop', "
            "'wf:' || b.parent_id || '.0:1:' || c.i, 'wf:~' || b.parent_id || '.0:1:' || c.i, "
            f"{false}, '{{}}'{js}, {member}, '', '', 0, {false}, {false}, "
            f"'', '', '', b.parent_id, b.id, {ended} FROM {BATCH_TABLE} b CROSS JOIN "
            f"{series(per_parent, 'c')} WHERE b.kind = 'children'"
        )
        # The chains: each its first link held, the other links in the chain's row.
        cur.execute(
            f"INSERT INTO {BATCH_TABLE} ({batch_columns}) SELECT 'chain', 'closed', 'all', 1, 1, "
            f"NULL, NULL, '{{}}'{js}, %s{js}, 0, {links}, 'chain ' || s.i, {now}, {now}, NULL, "
            f"'[]'{js}, '' FROM {series(parents, 's')}",
            [later],
        )
        cur.execute(
            f"INSERT INTO {JOB_TABLE} ({columns}, batch_id, finished_at) SELECT 'default', "
            "'wf:chain' || b.id, 'bench.wf_noop', 'wf:chain' || b.id, 'wf:~chain' || b.id, "
            f"{false}, '{{}}'{js}, {member}, '', '', 0, {false}, {false}, "
            f"'', '', '', b.id, {ended} FROM {BATCH_TABLE} b WHERE b.kind = 'chain'"
        )
        cur.execute(
            f"INSERT INTO {PARTITION_TABLE} (key, head_id, head_state, head_due_at, head_priority) "
            f"SELECT partition_key, id, 'queued', available_at, 0 FROM {JOB_TABLE} "
            f"WHERE event_type = 'bench.wf_noop' AND status = 'queued'"
        )
        cur.execute(f"SELECT count(*) FROM {JOB_TABLE} WHERE batch_id IS NOT NULL")
        members = cur.fetchone()[0]
    assert not BatchEvent.objects.exists()  # nothing ended: nothing to fold
    return {"parents": parents, "members": members, "chains": parents}


def claim_costs(jobs: int) -> tuple[float, float]:
    """Seconds per job to claim and finish ``jobs`` runnable jobs one at a time (300 chats),
    and seconds per claim that finds nothing (its sweeps included): bench/waits.py's measure,
    so the two benches' figures compare."""
    from waits import costs

    return costs(jobs)


# --- 3. a batch's callback -------------------------------------------------------------------


def batch_callback(url: str, n: int, timeout: float) -> dict[str, float]:
    """A batch of ``n`` no-op members, ``on_complete`` a callback, on 1 x 4: ms from the last
    member's finish to the callback's start, and members/s from the batch's commit."""
    from django.db.models import Max

    import feishu_inbox
    from feishu_inbox.models import EventJob

    empty_ledger()
    out = Path(tempfile.mkdtemp(prefix="benchwf-")) / "callback.txt"
    workers = start_workers(url, 1, 4, 0.5, BENCH_LATENCY_FILE=str(out))
    try:
        feishu_inbox.batch(
            [feishu_inbox.job("bench.wf_noop", {"i": i}) for i in range(n)],
            on_complete=feishu_inbox.job("bench.wf_callback", {}),
        )
        committed = time.time()  # autocommit: the batch and its members commit in the call
        deadline = time.monotonic() + timeout
        while not out.exists() or not out.read_text().strip():
            if time.monotonic() > deadline:
                raise SystemExit(f"the batch's callback did not run in {timeout} s")
            time.sleep(0.02)
        time.sleep(0.5)  # a second callback would show here
    finally:
        stop(workers)
    lines = out.read_text().split()
    assert len(lines) == 2 and int(lines[1]) == n, lines  # once, told every member
    last = EventJob.objects.filter(event_type="bench.wf_noop").aggregate(m=Max("finished_at"))
    started = float(lines[0])
    return {
        "callback_ms": (started - last["m"].timestamp()) * 1000,
        "members_per_s": n / (started - committed),
    }


# --- one backend -----------------------------------------------------------------------------


def measure(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    found: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        found.setdefault(key, []).append(value)

    url = fresh_postgres("fi_benchwf_fanout") if backend == "postgres" else fresh_sqlite("wf")
    django_setup(url)
    fill: dict[str, int] = {}
    for r in range(args.rounds):
        for procs, conc in SHAPES:
            shape = f"{procs}x{conc}"
            ours = fanout(url, args.children, procs, conc, args.timeout)
            add(f"ours_{shape}", ours["children_per_s"])
            for part in ("to_first_child_s", "children_s", "fan_in_s"):
                add(f"{part}_{shape}", ours[part])
            print(f"round {r + 1}: ours {shape}: {ours}", file=sys.stderr)
            if backend == "postgres" and not args.no_celery:
                theirs = celery_chord(args.children, procs, conc, args.celery_config, args.timeout)
                add(f"celery_{shape}", theirs["children_per_s"])
                add(f"celery_apply_{shape}", theirs["apply_seconds"])
                add(f"ratio_{shape}", ours["children_per_s"] / theirs["children_per_s"])
                print(f"round {r + 1}: celery {shape}: {theirs}", file=sys.stderr)
        if args.batch:
            cb = batch_callback(url, args.batch, args.timeout)
            add("callback_ms", cb["callback_ms"])
            add("batch_members_per_s", cb["members_per_s"])
            print(f"round {r + 1}: batch callback: {cb}", file=sys.stderr)
        costs = {}
        cases = [("none", 0), ("backlog", args.backlog), ("rows", args.backlog)]
        for label, n in cases if r % 2 == 0 else cases[::-1]:  # the order alternates
            use_database(backend, f"claims_{label}")
            if n:
                fill = fill_backlog(n, args.per_parent, args.links, held=label == "backlog")
            analyze()  # both planned from statistics, as autovacuum would give them
            costs[label] = claim_costs(args.jobs)
            add(f"claim_{label}", costs[label][0])
            add(f"empty_{label}", costs[label][1])
        for label in ("backlog", "rows"):
            add(f"claim_ratio_{label}", costs[label][0] / costs["none"][0])
            add(f"empty_ratio_{label}", costs[label][1] / costs["none"][1])
        print(f"round {r + 1}: claim costs (s): {costs} backlog {fill}", file=sys.stderr)
    from django.db import connections

    connections.close_all()
    return {"fill": fill, **{k: median(v) for k, v in found.items()}}


# --- the table -------------------------------------------------------------------------------


def table(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    pg, lite = results.get("postgres", {}), results.get("sqlite")
    fill = pg.get("fill", {})

    def f(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    head = "| figure | PostgreSQL (ours) | Celery chord | ours / Celery |"
    rule = "| --- | ---: | ---: | ---: |"
    if lite is not None:
        head += " SQLite (ours) |"
        rule += " ---: |"
    rows = [head, rule]

    def row(label: str, key: str, fmt: str, celery: str | None = None, scale: float = 1) -> None:
        def get(r: dict[str, Any] | None, k: str | None) -> float | None:
            if r is None or k is None or k not in r:
                return None
            return r[k] * scale

        cells = [
            label,
            f(get(pg, key), fmt),
            f(get(pg, celery and f"celery_{celery}"), fmt),
            f(get(pg, celery and f"ratio_{celery}"), ".2f"),
        ]
        if lite is not None:
            cells.append(f(get(lite, key), fmt))
        rows.append("| " + " | ".join(cells) + " |")

    n = args.children
    for procs, conc in SHAPES:
        shape = f"{procs}x{conc}"
        row(
            f"fan-out/fan-in of {n:,} no-op children, {procs} x {conc}: children/s",
            f"ours_{shape}",
            ",.0f",
            celery=shape,
        )
    for procs, conc in SHAPES:
        shape = f"{procs}x{conc}"
        cells = [
            f"{procs} x {conc}: s until the first child ran (ours: claim + spawn_many's commit; "
            "Celery: the chord's apply)",
            f(pg.get(f"to_first_child_s_{shape}"), ".2f"),
            f(pg.get(f"celery_apply_{shape}"), ".2f"),
            "-",
        ]
        if lite is not None:
            cells.append(f(lite.get(f"to_first_child_s_{shape}"), ".2f"))
        rows.append("| " + " | ".join(cells) + " |")
        row(
            f"{procs} x {conc}: s of the children, first start to last end",
            f"children_s_{shape}",
            ".2f",
        )
        row(
            f"{procs} x {conc}: s from the last child's end to the parent's",
            f"fan_in_s_{shape}",
            ".2f",
        )
    if args.batch:
        row(
            f"batch of {args.batch:,}, 1 x 4: members/s to the callback",
            "batch_members_per_s",
            ",.0f",
        )
        row("batch: last member's finish -> callback start, ms", "callback_ms", ",.1f")
    chains = fill.get("chains", args.backlog // args.per_parent)
    waiting = f"{args.backlog:,} children + {chains:,} chains waiting"
    rows_only = "the same, its members completed (no heads)"
    row("claim+finish, no backlog: us/job", "claim_none", ",.0f", scale=1e6)
    row(f"claim+finish, {waiting} (members held): us/job", "claim_backlog", ",.0f", scale=1e6)
    row("claim+finish ratio, members held (goal <= 1.1)", "claim_ratio_backlog", ".2f")
    row(f"claim+finish, {rows_only}: us/job", "claim_rows", ",.0f", scale=1e6)
    row("claim+finish ratio, members completed", "claim_ratio_rows", ".2f")
    row("empty claim (sweeps included), no backlog: us", "empty_none", ",.0f", scale=1e6)
    row(f"empty claim, {waiting} (members held): us", "empty_backlog", ",.0f", scale=1e6)
    row("empty claim ratio, members held (goal <= 1.1)", "empty_ratio_backlog", ".2f")
    row(f"empty claim, {rows_only}: us", "empty_rows", ",.0f", scale=1e6)
    row("empty claim ratio, members completed", "empty_ratio_rows", ".2f")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--children", type=int, default=10_000, help="fan-out width (10,000)")
    parser.add_argument(
        "--backlog", type=int, default=100_000, help="children waiting behind batches"
    )
    parser.add_argument("--per-parent", type=int, default=100, help="children per parent")
    parser.add_argument("--links", type=int, default=100, help="links per chain")
    parser.add_argument("--jobs", type=int, default=2000, help="jobs claimed per cost figure")
    parser.add_argument("--batch", type=int, default=10_000, help="batch members (0: skip)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900, help="s, per fan-out or batch")
    parser.add_argument("--sqlite", action="store_true", help="ours on SQLite too")
    parser.add_argument("--no-celery", action="store_true", help="ours alone")
    parser.add_argument("--celery-config", default="reliable", choices=["reliable", "default"])
    parser.add_argument("--backend", help=argparse.SUPPRESS)  # one backend per process
    args = parser.parse_args()
    if args.backend is not None:
        print(json.dumps(measure(args.backend, args)))
        return
    if not args.no_celery:
        celery_python()
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
    print(json.dumps(results, indent=2))
    print(f"reproduce: {reproduce()}")


if __name__ == "__main__":
    main()
