"""Exports on real ``runworker`` processes (SPEC §9i): 200,000 rows to the file-system storage
with the worker SIGKILLed inside parts end with a manifest and parts whose rows, read back,
equal the queryset exactly once each (a part retried is written again under a name of its
own, and the files no commit recorded are deleted); the worker's memory stays flat (RSS
measured) over 1,000,000 rows."""

from __future__ import annotations

import csv
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.files.storage import FileSystemStorage

import feishu_inbox
from feishu_inbox.tables.backfills import Export
from tests.support import backfill_jobs
from tests.support.backfill_helpers import rss, start_worker
from tests.support.backfill_jobs import Row
from tests.support.held_storage import HeldStorage
from tests.support.processes import wait_for
from tests.support.worker_helpers import Workers

pytestmark = pytest.mark.django_db(transaction=True)


def export_row(uid: str) -> Export:
    """The row as the worker committed it (the test's connection reads in autocommit)."""
    return Export.objects.get(uid=uid)


def read_back(root: Path, export: Export) -> list[tuple[int, str]]:
    rows: list[tuple[int, str]] = []
    for part in json.loads((root / export.manifest).read_text())["parts"]:
        with (root / part["name"]).open(newline="", encoding="utf-8") as f:
            found = list(csv.reader(f))
        assert found[0] == ["id", "label"] and len(found) - 1 == part["rows"]
        rows += [(int(i), label) for i, label in found[1:]]
    return rows


@pytest.mark.timeout(600)
def test_200000_rows_through_kills_mid_part_read_back_exactly_once(
    table: Any, workers: Workers, tmp_path: Path
) -> None:
    backfill_jobs.fill_table(200_000)
    root = tmp_path / "storage"
    hold, held = Path(f"{root}.hold"), Path(f"{root}.held")
    handle = feishu_inbox.export(
        "orders",
        Row.objects.all(),
        columns=["id", "label"],
        part_rows=10_000,
        chunk_size=1000,
        storage=HeldStorage(location=root),
    )
    worker = start_worker(workers)
    # Each kill lands where the storage holds the worker (held_storage.py): a part read and not
    # yet written, half written, and written but not recorded; the first is part 1's.
    cut: list[str] = []
    for point in ("before", "half", "after", "half"):
        mark = hold.with_suffix(".hold-new")
        mark.write_text(point)
        mark.replace(hold)
        wait_for(held.exists, 120, f"a part held {point} its write", lambda: export_row(handle.uid))
        name = held.read_text().split(" ", 1)[1]
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)
        n, recorded = int(name.rsplit("/", 1)[1][5:10]), export_row(handle.uid).part_count
        assert n == recorded + 1, (point, name, recorded)  # the cut part is not recorded
        assert (root / name).exists() == (point != "before"), (point, name)
        cut.append(name)
        hold.unlink()
        held.unlink()
        worker = start_worker(workers)
        wait_for(lambda n=n: export_row(handle.uid).part_count >= n, 120, f"part {n} again")
    wait_for(lambda: export_row(handle.uid).state != "running", 180, "the export to end")
    done = export_row(handle.uid)
    assert (done.state, done.rows_done, done.part_count) == ("completed", 200_000, 20)
    assert read_back(root, done) == list(Row.objects.order_by("id").values_list("id", "label"))
    # Each part once, under the name its commit recorded; the killed writes' files are gone.
    files = sorted(p.name for p in (root / handle.prefix).iterdir())
    assert files == sorted(["manifest.json", *(p["name"].rsplit("/", 1)[1] for p in done.parts)])
    assert not {p["name"] for p in done.parts} & set(cut), cut
    assert [p["name"].rsplit("/", 1)[1][:10] for p in done.parts] == [
        f"part-{n:05d}" for n in range(1, 21)
    ]


@pytest.mark.timeout(900)
def test_a_workers_memory_stays_flat_over_a_million_rows(
    table: Any, workers: Workers, tmp_path: Path
) -> None:
    backfill_jobs.fill_table(1_000_000)
    root = tmp_path / "storage"
    handle = feishu_inbox.export(
        "million",
        Row.objects.all(),
        columns=["id", "label", "value", "counter"],
        format="jsonl",
        part_rows=100_000,
        chunk_size=2000,
        storage=FileSystemStorage(location=root),
    )
    worker = start_worker(workers, lease="30")
    wait_for(lambda: export_row(handle.uid).part_count >= 1, 300, "the first part")
    samples = []
    while (now := export_row(handle.uid)).state == "running":
        assert worker.poll() is None, workers.stderr(worker)
        samples.append((now.rows_done, rss(worker.pid)))
        time.sleep(0.05)  # the interval of the memory samples, not synchronisation
    done = export_row(handle.uid)
    assert (done.state, done.rows_done, done.part_count) == ("completed", 1_000_000, 10)
    assert samples[-1][0] - samples[0][0] >= 700_000, samples[:3]  # sampled over 7+ parts
    baseline, peak = samples[0][1], max(m for _, m in samples)
    assert peak - baseline <= 8 * 1024 * 1024, (baseline, peak)
    assert sum(p["rows"] for p in done.parts) == 1_000_000
    last = (root / done.parts[-1]["name"]).read_text().splitlines()[-1]
    assert json.loads(last) == {
        "id": 1_000_000,
        "label": "row 1000000",
        "value": None,
        "counter": 0,
    }
