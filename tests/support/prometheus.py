"""A real Prometheus server for the tests (Debian's ``prometheus`` package): started on a free
port with a scrape configuration of the test's targets, queried through its HTTP API, and
``promtool`` to check expositions and rules."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.support import processes
from tests.support.processes import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def missing() -> str:
    """Why the tests cannot run here, or ''."""
    for tool in (PROMETHEUS, PROMTOOL):
        if not Path(tool).exists():
            return f"{tool} is missing: apt-get install prometheus (make test does, as root)"
    return ""


class Prometheus:
    """``with Prometheus(["127.0.0.1:9100"]) as prom: prom.value("up")``."""

    def __init__(self, targets: list[str], *, interval: str = "500ms") -> None:
        self.targets = targets
        self.interval = interval
        self.dir = Path(tempfile.mkdtemp(prefix="feishu-prometheus-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        config = {
            "global": {"scrape_interval": self.interval, "scrape_timeout": self.interval},
            "scrape_configs": [
                {"job_name": "feishu_inbox", "static_configs": [{"targets": self.targets}]}
            ],
        }
        (self.dir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        with open(self.dir / "prometheus.log", "wb") as log:
            self.proc = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={self.dir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        processes.started(
            f"prometheus :{self.port}", processes.log_file(self.dir / "prometheus.log"), self.proc
        )
        deadline = time.monotonic() + 60
        while True:  # its readiness endpoint: a condition, polled
            try:
                with urllib.request.urlopen(self.url("/-/ready"), timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not start: {self.log()}")
            time.sleep(0.1)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def log(self) -> str:
        return (self.dir / "prometheus.log").read_text(errors="replace")[-3000:]

    def query(self, expression: str) -> list[dict[str, Any]]:
        """The instant vector of a PromQL expression: [{"metric": {...}, "value": [t, "v"]}]."""
        url = self.url("/api/v1/query?" + urllib.parse.urlencode({"query": expression}))
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = json.loads(answer.read())
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def value(self, expression: str) -> float | None:
        """The single value of an expression, or None when it has no sample."""
        found = self.query(expression)
        if not found:
            return None
        assert len(found) == 1, found
        return float(found[0]["value"][1])

    def targets_up(self) -> bool:
        with urllib.request.urlopen(self.url("/api/v1/targets"), timeout=10) as answer:
            active = json.loads(answer.read())["data"]["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)


def promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [PROMTOOL, *args], input=stdin, capture_output=True, timeout=60, check=False
    )
