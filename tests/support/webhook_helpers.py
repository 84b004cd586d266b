"""Real webhook receiver processes for tests (``webhook_receiver.py``), and worker settings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.processes import ROOT, Subprocesses, free_port, port_open, wait_for

#: What the tests' workers run with: loopback receivers allowed, a short retry schedule (the
#: production one is minutes to hours), a short request timeout.
WORKER_SETTINGS: dict[str, Any] = {
    "WEBHOOK_ALLOW_PRIVATE": True,
    "WEBHOOK_RETRY_SCHEDULE": [0.2, 0.5, 1.0],
    "WEBHOOK_TIMEOUT_SECONDS": 5.0,
    "BACKOFF_BASE": 0.2,
    "BACKOFF_CAP": 1.0,
}


def worker_env(**settings: Any) -> dict[str, str]:
    return {
        "DJANGO_SETTINGS_MODULE": "tests.support.settings_json",
        "FEISHU_INBOX_JSON": json.dumps({**WORKER_SETTINGS, **settings}),
    }


class Receiver:
    """One receiver process on its own port; ``restart`` brings it back on the same port."""

    def __init__(self, procs: Subprocesses, directory: Path, name: str, **options: Any) -> None:
        self.procs, self.name, self.options = procs, name, options
        self.port = free_port()
        self.log = directory / f"receiver-{name}.jsonl"
        self.err = directory / f"receiver-{name}.err"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/{self.name}"

    def start(self) -> Receiver:
        argv = [sys.executable, "-m", "tests.support.webhook_receiver", "--port", str(self.port)]
        argv += ["--log", str(self.log)]
        for secret in self.options.get("secrets", ()):
            argv += ["--secret", secret]
        for name in ("mode", "drop", "sleep", "seed"):
            if name in self.options:
                argv += [f"--{name}", str(self.options[name])]
        self.starts += 1
        with self.err.open("ab") as err:
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        proc.stderr_path = str(self.err)  # type: ignore[attr-defined]
        self.procs.add(proc, f"receiver {self.name} (start {self.starts})")
        self.proc = proc
        wait_for(lambda: port_open(self.port) or proc.poll() is not None, 30, "a receiver")
        assert proc.poll() is None, self.err.read_text()
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)

    def set_mode(self, mode: str) -> None:
        Path(f"{self.log}.mode").write_text(mode)

    def lines(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(x) for x in self.log.read_text().splitlines() if x.strip()]

    def requests(self) -> list[dict[str, Any]]:
        return [x for x in self.lines() if "huge_written" not in x]

    def accepted(self) -> list[dict[str, Any]]:
        return [x for x in self.requests() if x["accepted"]]
