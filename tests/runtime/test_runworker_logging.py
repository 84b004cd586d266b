"""``runworker`` logs to stderr by itself when the site configured no logging for it.

Real subprocesses: pytest's own log capture puts a handler on the root logger of this process.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from feishu_inbox import ledger
from feishu_inbox.management.commands.runworker import site_configured_logging
from feishu_inbox.models import EventJob
from tests.support.processes import ROOT, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)


def run_burst(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "manage.py", "runworker", "--burst", *args],
        cwd=ROOT,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done


def enqueue_message(event_id: str) -> int:
    return ledger.enqueue(
        event_id=event_id,
        event_type="im.message.receive_v1",
        partition_key="default:chat:oc_log",
        payload={"event": {"message": {"chat_id": "oc_log", "content": '{"text": "hi"}'}}},
    ).job_id


def test_a_site_without_logging_sees_the_start_line_and_one_line_per_job() -> None:
    job_id = enqueue_message("ev-log-1")
    done = run_burst(DJANGO_SETTINGS_MODULE="tests.support.settings_without_logging")
    lines = done.stderr.splitlines()
    start = [line for line in lines if "handler modules:" in line]
    assert len(start) == 1, done.stderr
    assert "INFO feishu_inbox.worker handler modules: project.demo.feishu_handlers;" in start[0]
    assert "event types: im.message.receive_v1 (project.demo.feishu_handlers.echo)" in start[0]
    jobs = [line for line in lines if f"job {job_id} event ev-log-1 " in line]
    assert len(jobs) == 1 and ": completed in " in jobs[0] and jobs[0].endswith(" ms")
    assert EventJob.objects.get(pk=job_id).error_type == ""


def test_verbosity_0_keeps_only_warnings() -> None:
    enqueue_message("ev-log-2")
    done = run_burst("-v", "0", DJANGO_SETTINGS_MODULE="tests.support.settings_without_logging")
    assert "feishu_inbox.worker" not in done.stderr  # no INFO line (system checks still warn)


def test_a_site_that_configured_logging_gets_each_line_once() -> None:
    job_id = enqueue_message("ev-log-3")
    # project.settings sends feishu_inbox to its own console handler: the command adds none.
    done = run_burst(DJANGO_SETTINGS_MODULE="project.settings")
    assert len([line for line in done.stderr.splitlines() if "handler modules:" in line]) == 1
    assert len([line for line in done.stderr.splitlines() if f"job {job_id} " in line]) == 1


def test_the_default_verbosity_keeps_the_level_the_sites_logging_set() -> None:
    """project.settings sets feishu_inbox's level from LOG_LEVEL: WARNING keeps the per-job
    INFO lines out (a benchmark's workers, a quiet site); -v 2 still asks for them."""
    job_id = enqueue_message("ev-log-4")
    quiet = run_burst(DJANGO_SETTINGS_MODULE="project.settings", LOG_LEVEL="WARNING")
    assert f"job {job_id} " not in quiet.stderr and "handler modules:" not in quiet.stderr
    enqueue_message("ev-log-5")
    loud = run_burst("-v", "2", DJANGO_SETTINGS_MODULE="project.settings", LOG_LEVEL="WARNING")
    assert "event ev-log-5 " in loud.stderr


def test_no_handler_registered_is_a_warning_that_says_where_handlers_go() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django, logging; django.setup();"
            "from feishu_inbox.runtime import registry;"
            "from feishu_inbox.management.commands.runworker import log_handlers;"
            "logging.basicConfig(format='%(levelname)s %(message)s');"
            "logging.getLogger('feishu_inbox').setLevel('INFO');"
            "log_handlers({})",
        ],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "event types: none" in done.stderr
    assert "WARNING no handler is registered: every event will complete as NoHandler" in done.stderr
    assert "feishu_handlers.py module of an app in INSTALLED_APPS" in done.stderr
    assert 'FEISHU_INBOX["HANDLER_MODULES"]' in done.stderr


def isolated_logger() -> tuple[logging.Logger, logging.Logger]:
    """A ``feishu_inbox`` logger and its root in a hierarchy of their own (not this process's)."""
    root = logging.RootLogger(logging.WARNING)
    return logging.Manager(root).getLogger("feishu_inbox"), root


def test_what_counts_as_configured_logging() -> None:
    logger, root = isolated_logger()
    assert not site_configured_logging(logger)  # only logging.lastResort: warnings, to stderr
    root.addHandler(logging.StreamHandler())
    assert site_configured_logging(logger)  # the site logs everything through the root
    logger, root = isolated_logger()
    logger.addHandler(logging.NullHandler())
    assert site_configured_logging(logger)  # a deliberate silence is respected
    logger, root = isolated_logger()
    root.addHandler(logging.StreamHandler())
    logger.propagate = False
    assert not site_configured_logging(logger)  # cut off from the root's handler
