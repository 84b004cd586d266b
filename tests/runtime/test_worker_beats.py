"""Workers an operator can see (issue 28): each runworker keeps a heartbeat row; a killed one
reads lost, a stopped one stopped; `inbox workers` and the admin show them and what each
runs; a lost worker's row goes after WORKER_RETENTION."""

from __future__ import annotations

import io
import json
import os
import signal

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client, override_settings

from feishu_inbox.ledger import workers as worker_beats
from feishu_inbox.models import WorkerBeat
from tests.support.processes import wait_for
from tests.support.worker_helpers import Workers, enqueue

pytestmark = pytest.mark.django_db(transaction=True)

BEAT = 0.2
SETTINGS = {"WORKER_BEAT_SECONDS": BEAT, "WORKER_RETENTION": 2}


def env() -> dict[str, str]:
    return {
        "DJANGO_SETTINGS_MODULE": "tests.support.settings_json",
        "FEISHU_INBOX_JSON": json.dumps(SETTINGS),
    }


def state(pid: int) -> str | None:
    return next((w.state for w in worker_beats.workers() if w.pid == pid), None)


def test_workers_are_seen_live_lost_and_stopped_with_what_they_run(workers: Workers) -> None:
    from django.conf import settings

    with override_settings(FEISHU_INBOX={**settings.FEISHU_INBOX, **SETTINGS}):
        job_id = enqueue("held", ["gate:g1"], partition="chat-beat")
        first = workers.start("--concurrency", "2", "--queue", "default", **env())
        wait_for(lambda: state(first.pid) == "live", 30, "the worker's first beat")
        # a --queue worker runs only tasks: this one (all but one queue's tasks) runs the event
        second = workers.start("--concurrency", "3", "--exclude-queues", "emails", **env())

        def running() -> bool:
            found = {w.pid: w for w in worker_beats.workers()}
            w = found.get(second.pid)
            return w is not None and w.busy == 1 and w.running_jobs == [job_id]

        wait_for(running, 30, "the second worker's beat with its running job")
        out = io.StringIO()
        call_command("inbox", "workers", "--json", stdout=out)
        rows = {r["pid"]: r for r in json.loads(out.getvalue())}
        assert rows[first.pid]["state"] == "live" and rows[first.pid]["queues"] == ["default"]
        assert rows[second.pid]["concurrency"] == 3 and rows[second.pid]["running_jobs"] == [job_id]
        assert rows[second.pid]["host"] and rows[second.pid]["version"]
        assert rows[second.pid]["queues"] == [] and rows[second.pid]["excluded_queues"] == [
            "emails"
        ]
        text = io.StringIO()
        call_command("inbox", "workers", stdout=text)
        assert f"#{job_id}" in text.getvalue() and "1/3 busy" in text.getvalue()
        assert "every job but tasks of emails" in text.getvalue()

        # The admin's page, for whoever may view jobs.
        operator = User.objects.create_user("ops", password="x", is_staff=True)
        operator.user_permissions.add(Permission.objects.get(codename="view_eventjob"))
        client = Client()
        client.force_login(operator)
        page = client.get("/admin/feishu_inbox/workerbeat/")
        assert page.status_code == 200
        html = page.content.decode()
        assert rows[second.pid]["worker_id"] in html and f"/{job_id}/change/" in html
        assert ">live<" in html and "only tasks of default" in html

        os.kill(first.pid, signal.SIGKILL)  # killed: its beats stop
        first.wait(10)
        wait_for(lambda: state(first.pid) == "lost", 30, "the killed worker to read lost")
        assert ">lost<" in client.get("/admin/feishu_inbox/workerbeat/").content.decode()

        workers.open_gate("g1")
        second.send_signal(signal.SIGTERM)  # stopped cleanly: it says so
        second.wait(30)
        assert state(second.pid) == "stopped"

        third = workers.start("--concurrency", "1", **env())  # its beats clear the old rows
        wait_for(
            lambda: state(first.pid) is None and state(second.pid) is None,
            30,
            "rows past WORKER_RETENTION to go",
        )
        assert state(third.pid) == "live"
        assert WorkerBeat.objects.count() == 1
