"""The manual's "Install into an existing site", done in a fresh ``startproject`` site.

The steps are the manual's own snippets (each fenced block after a ``<!-- site-test: NAME -->``
comment, in any page of ``docs/``): a page that loses a step, or whose snippet no longer works,
fails here. The package is installed as the manual says: a wheel built from the checkout.

Cost: the site's virtual environment sees this environment's packages through a ``.pth`` file
(Django, psycopg, pip, setuptools: nothing is downloaded, ``--no-index`` makes sure) and
installs feishu-inbox from a wheel built from a copy of the checkout, dependencies resolved.
The checkout's own editable install is hidden from it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import site
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.feishu_client import delivery, message_event
from tests.support.processes import ROOT, wait_for
from tests.support.sites import Site, manual_snippets, site_env, start_project

# No test database here (a SQLite file of its own at most): the SQLite suite runs it once.
pytestmark = pytest.mark.any_database

#: What the manual's install lines name for "the checkout".
CHECKOUT_PLACEHOLDER = "path/to/feishu_inbox"
#: Not part of the package: left out of the copy that is installed.
NOT_SHIPPED = shutil.ignore_patterns(
    ".git", ".venv*", "build", "dist", "*.egg-info", "artifacts", "staticfiles", "__pycache__",
    ".*_cache", ".hypothesis", ".bench", "*.sqlite3*",
)  # fmt: skip


def make_venv(tmp: Path) -> Path:
    """A venv without pip that sees this environment's packages, but not feishu_inbox."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (purelib,) = (venv / "lib").glob("python3.*/site-packages")
    shared = tmp / "shared-packages"
    shared.mkdir()
    for packages in map(Path, site.getsitepackages()):
        for entry in packages.iterdir():
            name = entry.name.lower()
            if name.startswith(("feishu_inbox", "__editable__", "_feishu")) or name.endswith(
                ".pth"
            ):
                continue
            link = shared / entry.name
            if not link.exists():
                link.symlink_to(entry)
    # A path line appends to sys.path after the venv's own site-packages; the .pth files of
    # that directory (the checkout's editable install) are not processed.
    (purelib / "shared-packages.pth").write_text(f"{shared}\n")
    return venv


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("install")
    snippets = manual_snippets()
    venv = make_venv(tmp)

    # 1. The wheel, built and installed as the manual says, from a copy of the checkout.
    checkout = tmp / "feishu_inbox"
    shutil.copytree(ROOT, checkout, ignore=NOT_SHIPPED, symlinks=True)
    build, install = [ln for ln in snippets["pip"].splitlines() if ln.strip()]
    build_args = shlex.split(build.replace(CHECKOUT_PLACEHOLDER, str(checkout)), comments=True)
    assert build_args[:4] == ["python", "-m", "build", "--wheel"], build
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # this environment's build backend (setuptools), no download: --no-isolation
    subprocess.run(
        [sys.executable, *build_args[1:], "--no-isolation"],
        check=True,
        timeout=300,
        env=clean,
        capture_output=True,
    )
    assert len(list((checkout / "dist").glob("feishu_inbox-*.whl"))) == 1
    install_args = shlex.split(install.replace(CHECKOUT_PLACEHOLDER, str(checkout)), comments=True)
    assert install_args[:2] == ["pip", "install"] and "--find-links" in install_args, install
    subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-index", *install_args[2:]],
        check=True,
        timeout=300,
        env=clean,
    )

    env = site_env(venv)
    yield start_project(venv, tmp, env)


def test_the_installed_package_is_the_built_one_with_its_data(site_dir: Site) -> None:
    where = site_dir.run(
        "-c",
        "import pathlib, feishu_inbox; p = pathlib.Path(feishu_inbox.__file__).parent; "
        "print(p); assert (p / 'templates/feishu_inbox/dashboard.html').is_file(); "
        "assert (p / 'migrations/0001_ledger.py').is_file(); assert (p / 'py.typed').is_file()",
    ).stdout.strip()
    assert Path(where).is_relative_to(site_dir.venv), where  # not the checkout
    version = site_dir.run(
        "-c", "import importlib.metadata as m; print(m.version('feishu-inbox'))"
    ).stdout.strip()
    assert f'version = "{version}"' in (ROOT / "pyproject.toml").read_text()
    installer = site_dir.run(
        "-c",
        "import importlib.metadata as m; d = m.distribution('feishu-inbox'); "
        "print(d.read_text('WHEEL'))",
    ).stdout
    assert "Root-Is-Purelib: true" in installer  # installed from the wheel
    pip_check = site_dir.run("-m", "pip", "check")  # the [postgres] extra's requirements too
    assert "No broken requirements" in pip_check.stdout


def test_readme_steps_in_a_fresh_startproject_site(site_dir: Site) -> None:
    snippets = manual_snippets()
    settings, urls = site_dir.settings, site_dir.urls
    project_settings, project_urls = settings.read_text(), urls.read_text()

    def configure(*parts: str) -> None:
        settings.write_text(project_settings + "".join("\n" + snippets[p] for p in parts))

    configure("settings", "logging")
    urls.write_text(project_urls + "\n" + snippets["urls"])
    site_dir.shell(snippets["migrate"])
    check = site_dir.run("manage.py", "check")
    # No W002 (SQLite options), no W003 (secrets); W004: no handler is registered yet.
    assert re.findall(r"feishu_inbox\.[EW]\d+", check.stderr) == ["feishu_inbox.W004"], check.stderr

    with site_dir.serving() as port:

        def deliver(text: str) -> str:
            envelope = message_event(chat_id="oc_site", text=text)
            body, headers = delivery(envelope)
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/feishu/events/", data=body, headers=headers
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                assert json.loads(response.read()) == {"ok": True, "duplicate": False}
            return str(envelope["header"]["event_id"])

        # The handler module beside settings.py: not an app, so never imported, and the worker
        # says so.
        (site_dir.root / "mysite" / "feishu_handlers.py").write_text(snippets["handler"])
        first = deliver("one")
        # The web process logs the stored event through the manual's LOGGING.
        stored = f"INFO feishu_inbox.inbound stored event {first} (type im.message.receive_v1, "
        wait_for(lambda: stored in site_dir.log("runserver"), 10, "the stored event's log line")
        assert "as job 1" in site_dir.log("runserver").split(stored, 1)[1].splitlines()[0]
        worker = site_dir.run("manage.py", "runworker", "--burst")
        assert "handler modules: none; event types: none" in worker.stderr, worker.stderr
        assert "no handler is registered" in worker.stderr
        assert f"job 1 event {first} " in worker.stderr
        assert (site_dir.job(1)["status"], site_dir.job(1)["error_type"]) == (
            "completed",
            "NoHandler",
        )

        # Listed in HANDLER_MODULES, the same module is imported.
        configure("settings", "logging", "handler-modules")
        second = deliver("two")
        worker = site_dir.run("manage.py", "runworker", "--burst")
        assert (
            "handler modules: mysite.feishu_handlers; event types: "
            "im.message.receive_v1 (mysite.feishu_handlers.on_message)"
        ) in worker.stderr, worker.stderr
        assert f"{second}: two" in worker.stdout
        assert (site_dir.job(2)["status"], site_dir.job(2)["error_type"]) == ("completed", "")

        # The first place the manual names: feishu_handlers.py in an installed app.
        site_dir.shell(snippets["startapp"])
        configure("settings", "logging", "app-settings")
        (site_dir.root / "bot" / "feishu_handlers.py").write_text(snippets["handler"])
        third = deliver("three")
        worker = site_dir.run("manage.py", "runworker", "--burst")
        assert "handler modules: bot.feishu_handlers; event types:" in worker.stderr
        assert f"{third}: three" in worker.stdout
        assert (site_dir.job(3)["status"], site_dir.job(3)["error_type"]) == ("completed", "")
