"""A fresh ``django-admin startproject`` site in a virtual environment of its own, set up with
the manual's snippets: what ``tests/site/test_install.py`` (a venv that sees this one's
packages) and ``tests/site/test_stacks.py`` (clean venvs, from PyPI) both drive.

The manual's snippets are the fenced blocks after a ``<!-- site-test: NAME -->`` comment, in
any page of ``docs/``: a page that loses one, or whose snippet no longer works, fails the tests
that read it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.feishu_client import ENCRYPT_KEY, TOKEN
from tests.support.processes import ROOT, free_port, log_file, port_open, started, stop, wait_for

#: The snippets the install steps need (docs/install.md, docs/handlers.md).
STEPS = (
    "pip",
    "settings",
    "urls",
    "migrate",
    "startapp",
    "app-settings",
    "handler",
    "handler-modules",
    "logging",
)
_SNIPPET = re.compile(
    r"^( *)<!-- site-test: ([\w-]+) -->\n\1```\w*\n(.*?)\n\1```", re.MULTILINE | re.DOTALL
)


def manual_snippets() -> dict[str, str]:
    """Every ``site-test`` snippet of the manual, by name; the install steps must be there."""
    found: dict[str, str] = {}
    for page in sorted((ROOT / "docs").glob("*.md")):
        for match in _SNIPPET.finditer(page.read_text()):
            _indent, name, body = match.groups()
            assert name not in found, f"the manual has two site-test snippets named {name!r}"
            found[name] = textwrap.dedent(body) + "\n"
    missing = [name for name in STEPS if name not in found]
    assert not missing, f"the manual lost these install steps: {missing}"
    return found


def site_env(venv: Path, **extra: str) -> dict[str, str]:
    """This process's environment without what points at the development one (its settings,
    database, virtual environment, pytest's variables), the site's ``bin`` first on PATH, and
    the secrets the tests' deliveries are signed with.

    Nor PYTHONDONTWRITEBYTECODE (CI's machine sets it): a fresh venv holds no bytecode (uv
    compiles none at install), so each command would compile every module it imports again,
    as a user's site never does: the Open API extra's lark_oapi alone is 10,000 modules, 10 s
    of CPU per command, and a worker's first claim waited minutes on a loaded machine."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PYTEST")
        and k
        not in (
            "DJANGO_SETTINGS_MODULE",
            "DATABASE_URL",
            "PYTHONPATH",
            "VIRTUAL_ENV",
            "PYTHONDONTWRITEBYTECODE",
        )
    }
    env.update(
        PATH=f"{venv / 'bin'}:{env.get('PATH', '')}",
        FEISHU_ENCRYPT_KEY=ENCRYPT_KEY,
        FEISHU_VERIFICATION_TOKEN=TOKEN,
    )
    env.update(extra)
    return env


@dataclass
class Site:
    """A startproject site in its own virtual environment."""

    venv: Path
    root: Path  # the directory with manage.py
    env: dict[str, str]

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    @property
    def settings(self) -> Path:
        return self.root / "mysite" / "settings.py"

    @property
    def urls(self) -> Path:
        return self.root / "mysite" / "urls.py"

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``python ARGS`` with the site's interpreter, in the site's directory; must succeed."""
        return self._call([self.python, *args], timeout)

    def attempt(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``python ARGS`` as ``run`` does, whatever its exit status."""
        return self._execute([self.python, *args], timeout)

    def shell(self, snippet: str) -> None:
        """A manual's shell snippet, run as written with the site's ``python`` first on PATH."""
        self._call(["bash", "-euo", "pipefail", "-c", snippet], 120)

    def _call(self, command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        done = self._execute(command, timeout)
        assert done.returncode == 0, f"{command[1:]} failed:\n{done.stdout}\n{done.stderr}"
        return done

    def _execute(self, command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command,
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def job(self, job_id: int) -> dict[str, object]:
        return json.loads(self.run("manage.py", "inbox", "show", str(job_id), "--json").stdout)

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        """``python ARGS`` left running, its output in ``<name>.log`` beside manage.py (a
        failing test shows its end); stop it with ``processes.stop``."""
        log = self.root / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [self.python, *args], cwd=self.root, env=self.env, stdout=out, stderr=out
            )
        started(name, log_file(log), proc)
        return proc

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    @contextmanager
    def serving(self) -> Iterator[int]:
        """The site under ``runserver`` (Django's own server: the base package has no other)
        on a free port, listening; stopped at the end."""
        port = free_port()
        server = self.start(
            "runserver", "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"
        )
        try:
            wait_for(lambda: port_open(port) or server.poll() is not None, 60, "runserver")
            assert server.poll() is None, f"runserver exited at start:\n{self.log('runserver')}"
            yield port
        finally:
            stop(server)


def start_project(venv: Path, where: Path, env: dict[str, str]) -> Site:
    """``django-admin startproject mysite`` under ``where``, with the venv's Django."""
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "django", "startproject", "mysite"],
        cwd=where,
        env=env,
        check=True,
        timeout=60,
        capture_output=True,
    )
    return Site(venv=venv, root=where / "mysite", env=env)
