"""The wheel of this checkout, built as the manual says (``python -m build --wheel``), from a
copy of what a clean clone holds (git's tracked files, and new files not yet added, that
.gitignore does not name): never from the checkout itself, whose ``build/`` may hold modules
that no longer exist.

Built once per test session (per pytest-xdist process) with this environment's build backend
(``--no-isolation``: no download of setuptools per run).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.processes import ROOT


def clean_clone_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted({name for name in listed.split("\0") if name and (ROOT / name).exists()})


def copy_clean_clone(target: Path) -> Path:
    for name in clean_clone_files():
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, destination, follow_symlinks=False)
    return target


def build_wheel(tmp: Path) -> Path:
    """The wheel file, built from a clean copy of the checkout under ``tmp``."""
    checkout = copy_clean_clone(tmp / "feishu_inbox")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", "dist", "."],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"the wheel did not build:\n{done.stdout}\n{done.stderr}"
    (wheel,) = (checkout / "dist").glob("feishu_inbox-*.whl")
    return wheel
