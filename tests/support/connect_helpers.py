"""Real ``manage.py feishu_connect`` subprocesses against the fake long-connection endpoint."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.support import preforked
from tests.support.fake_feishu_ws import FakeLongConnection
from tests.support.processes import Subprocesses, subprocess_env, wait_for

#: Short intervals so that a lost or silent connection is noticed within a few seconds.
TEST_SETTINGS = {
    "PING_SECONDS": 0.5,
    "PONG_TIMEOUT_SECONDS": 1.0,
    "RECONNECT_MIN_SECONDS": 0.2,
    "RECONNECT_MAX_SECONDS": 2.0,
    "CONNECT_TIMEOUT_SECONDS": 3.0,
}


def apps_for(fake: FakeLongConnection, **names: str) -> dict[str, dict[str, str]]:
    """APPS entries for ``name=app_id`` pairs, with the fake's secret and URL."""
    return {
        name: {"APP_ID": app_id, "APP_SECRET": fake.apps[app_id], "DOMAIN": fake.url}
        for name, app_id in names.items()
    }


class Connectors(Subprocesses):
    """Starts feishu_connect subprocesses; kills what is left at the end."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.dir = directory

    def start(
        self,
        apps: dict[str, dict[str, str]],
        *args: str,
        settings: dict[str, Any] | None = None,
        **env: str,
    ) -> subprocess.Popen[bytes] | preforked.Forked:
        n = len(self.procs)
        overrides = {**TEST_SETTINGS, "APPS": apps, **(settings or {})}
        env = subprocess_env(
            DJANGO_SETTINGS_MODULE="tests.support.settings_json",
            DEMO_APP="0",
            FEISHU_INBOX_JSON=json.dumps(overrides),
            FEISHU_INBOX_HANDLERS="tests.support.connect_handlers",
            CONNECT_TEST_DIR=str(self.dir),
            **env,
        )
        argv = ["feishu_connect", "-v", "2", *args]
        proc = preforked.start(argv, env, self.dir / f"connect-{n}.err")
        self.add(proc, f"connector-{n} (feishu_connect {' '.join(args)})", dumps=True)
        return proc

    def all_stderr(self) -> str:
        return "".join(self.stderr(p) for p in self.procs)


def connected(fake: FakeLongConnection, count: int, *, after: int = 0) -> None:
    """Wait until ``count`` connections opened after the first ``after`` are open."""
    wait_for(
        lambda: len([c for c in fake.open_connections() if c.id >= after]) >= count,
        60,  # a guard, generous for a machine whose every core is busy
        f"{count} long connection(s) to open",
        seen=lambda: [(c.id, c.app_id, c.closed_at) for c in fake.conns],
    )
