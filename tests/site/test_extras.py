"""A piece used without its extra: the command that needs it stops at once and names the
extra, the system checks name it; never a traceback, never a retry loop.

Each test hides the extra's package from a real ``manage.py`` subprocess (``sys.modules[name]
= None``: ``import`` raises ImportError and ``find_spec`` answers None, as in an environment
without it). tests/site/test_stacks.py proves the same in clean environments from the wheel,
where none of those packages is installed (its bare sites: ``each_missing_extra_is_named``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.processes import ROOT, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)


def manage_without(hidden: list[str], *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys\n"
        f"for name in {hidden!r}: sys.modules[name] = None\n"
        "from django.core.management import execute_from_command_line\n"
        f"execute_from_command_line(['manage.py', *{list(args)!r}])\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=subprocess_env(FEISHU_INBOX_READ_DOTENV="0", **env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_feishu_connect_without_websockets_stops_at_once_with_the_pip_line() -> None:
    done = manage_without(
        ["websockets"], "feishu_connect", FEISHU_APP_ID="cli_x", FEISHU_APP_SECRET="s"
    )
    assert done.returncode == 1, done.stderr
    assert (
        "[configuration] The long connection (manage.py feishu_connect) needs websockets "
        "(the connect extra)" in done.stderr
    )
    assert 'pip install "feishu-inbox[connect]"' in done.stderr
    assert "Traceback" not in done.stderr and "connecting again" not in done.stderr


def test_metrics_port_without_prometheus_client_stops_with_the_pip_line() -> None:
    done = manage_without(["prometheus_client"], "runworker", "--metrics-port", "0")
    assert done.returncode == 1, done.stderr
    assert "needs prometheus-client (the metrics extra)" in done.stderr
    assert 'pip install "feishu-inbox[metrics]"' in done.stderr
    assert "Traceback" not in done.stderr


def test_the_checks_name_the_extra_of_feishus_sdk() -> None:
    # A warning: the long connection needs the credentials and not the SDK.
    done = manage_without(["lark_oapi"], "check", FEISHU_APP_ID="cli_x", FEISHU_APP_SECRET="s")
    assert done.returncode == 0, done.stderr
    assert "(feishu_inbox.W008)" in done.stderr
    assert 'pip install "feishu-inbox[openapi]"' in done.stderr
    assert "Traceback" not in done.stderr


def test_a_site_that_uses_no_tasks_needs_no_tasks_framework() -> None:
    # The admin (its queue filter) and the checks load feishu_inbox.tasks, which must not load
    # the framework. (The tasks framework's E008, for a site with TASKS and no framework: the
    # demo's handlers use tasks, so it is proven in a clean site, tests/site/test_stacks.py.)
    done = manage_without(
        ["django_tasks", "django.tasks"],
        "check",
        DJANGO_SETTINGS_MODULE="tests.support.settings_without_tasks",
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "E008" not in done.stderr
