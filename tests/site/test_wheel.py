"""The built wheel holds what the manual says ships (docs/install.md's list) and every file of
the package that a clean clone has: the metadata check (``twine check``) reads none of that."""

from __future__ import annotations

import re
import zipfile
from fnmatch import fnmatch
from pathlib import Path

import pytest

from tests.support.processes import ROOT
from tests.support.wheel import clean_clone_files

pytestmark = pytest.mark.any_database


def documented_contents() -> list[str]:
    page = (ROOT / "docs" / "install.md").read_text()
    block = re.search(r"<!-- wheel-contents -->\n(.*?)<!-- /wheel-contents -->", page, re.S)
    assert block, "docs/install.md lost its <!-- wheel-contents --> list"
    patterns = re.findall(r"`(feishu_inbox/[^`]+)`", block.group(1))
    assert patterns
    return patterns


def test_the_wheel_holds_what_the_manual_says_ships(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    missing = [p for p in documented_contents() if not any(fnmatch(n, p) for n in names)]
    assert not missing, f"the wheel lacks what docs/install.md says ships: {missing}"
    for shipped in ("monitoring/prometheus/alerts.yml", "monitoring/grafana/feishu_inbox.json"):
        assert f"feishu_inbox/{shipped}" in names


def test_the_wheel_holds_every_file_of_the_package(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    package = [name for name in clean_clone_files() if name.startswith("feishu_inbox/")]
    assert package
    missing = [name for name in package if name not in names]
    assert not missing, f"the wheel lacks files of the package (package-data?): {missing}"
