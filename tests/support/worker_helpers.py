"""Real ``runworker`` subprocesses for tests, and the jobs they run (``worker_handlers.py``)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from django.utils import timezone

from feishu_inbox import ledger
from feishu_inbox.models import EventJob
from tests.support import preforked
from tests.support.processes import Subprocesses, subprocess_env


class Workers(Subprocesses):
    """Starts runworker subprocesses on the test database; kills what is left at the end."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.dir = directory

    def start(self, *args: str, **env: str) -> subprocess.Popen[bytes] | preforked.Forked:
        n = len(self.procs)
        argv = ["runworker", "-v", "2", *args]
        environ = subprocess_env(
            **{
                "FEISHU_INBOX_HANDLERS": "tests.support.worker_handlers",
                "WORKER_TEST_DIR": str(self.dir),
                "LOG_LEVEL": "DEBUG",
                **env,
            }
        )
        proc = preforked.start(argv, environ, self.dir / f"worker-{n}.err")
        self.add(proc, f"worker-{n} (runworker {' '.join(args)})", dumps=True)
        return proc

    def log(self) -> list[list[str]]:
        path = self.dir / "events.log"
        if not path.exists():
            return []
        return [line.split() for line in path.read_text().splitlines() if line.strip()]

    def lines(self, kind: str, event_id: str | None = None) -> list[list[str]]:
        return [
            line
            for line in self.log()
            if line[0] == kind and (event_id is None or line[1] == event_id)
        ]

    def open_gate(self, name: str) -> None:
        (self.dir / f"gate-{name}").touch()


def enqueue(
    event_id: str,
    steps: list[str],
    *,
    partition: str = "chat-1",
    event_type: str = "test.steps",
    private: bool = False,
) -> int:
    return ledger.enqueue(
        event_id=event_id,
        event_type=event_type,
        partition_key=partition,
        payload={"steps": steps},
        private_message=private,
    ).job_id


def job(job_id: int) -> EventJob:
    return EventJob.objects.get(pk=job_id)


def lease_expired(job_id: int) -> bool:
    row = job(job_id)
    return row.lease_until is not None and row.lease_until < timezone.now()


def wait_all_completed(total: int, timeout: float, stderr: Callable[[], str]) -> None:
    """Wait until ``total`` jobs are completed, or one ends failed or unknown (then stop
    waiting), and assert that every job completed (``stderr``: a worker's, read at the end)."""
    from collections import Counter

    from tests.support.processes import wait_for

    def settled() -> bool:
        return EventJob.objects.filter(status="completed").count() == total or (
            EventJob.objects.filter(status__in=["unknown", "failed"]).exists()
        )

    wait_for(settled, timeout, "every job to complete")
    statuses = Counter(EventJob.objects.values_list("status", flat=True))
    assert statuses == {"completed": total}, (statuses, stderr())
