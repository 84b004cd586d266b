"""Worker processes that know the test backfills (``backfill_jobs.py``), and their memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.worker_helpers import Workers


def rss(pid: int) -> int:
    """The process's resident memory in bytes (0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    kb = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(kb) * 1024


def start_worker(workers: Workers, lease: str = "2", **env: str) -> Any:
    """One ``runworker`` of one slot with the test backfills, its lease ``lease`` seconds."""
    return workers.start(
        "--concurrency",
        "1",
        "--lease-seconds",
        lease,
        FEISHU_INBOX_HANDLERS="tests.support.backfill_jobs",
        **env,
    )
