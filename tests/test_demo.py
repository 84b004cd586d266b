"""The README's main command: ``rundemo`` serves the webhook and runs a worker, on SQLite."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import urllib.request
from contextlib import closing
from pathlib import Path

from .feishu_client import ENCRYPT_KEY, TOKEN, delivery, message_event
from .processes import ROOT, free_port, port_open, subprocess_env, wait_for


def test_rundemo_receives_a_message_and_the_bot_replies(tmp_path: Path) -> None:
    port = free_port()
    env = subprocess_env(
        DATABASE_URL=f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        FEISHU_ENCRYPT_KEY=ENCRYPT_KEY,
        FEISHU_VERIFICATION_TOKEN=TOKEN,
    )
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=120,
    )
    demo = subprocess.Popen(
        [sys.executable, "manage.py", "rundemo", "--bind", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: port_open(port), 30, "the demo server")
        body, headers = delivery(message_event(chat_id="oc_demo", text="ping"))
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/feishu/events/", data=body, headers=headers, method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200

        def replies() -> list[str]:
            with closing(sqlite3.connect(tmp_path / "demo.sqlite3")) as db:
                return [r[0] for r in db.execute("SELECT text FROM demo_reply")]

        wait_for(lambda: replies() == ["You said: ping"], 60, "the bot's reply")
    finally:
        demo.send_signal(signal.SIGTERM)
        demo.wait(60)
    assert demo.returncode == 0
    assert not port_open(port)
