"""Sphinx configuration of feishu_inbox's manual (``make docs``; CI builds it with warnings as
errors, so a broken link between pages, a missing page or a bad directive fails the build)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The package's version, as pyproject.toml states it (tomllib is not in Python 3.10).
_version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)

project = "feishu_inbox"
author = "the feishu_inbox authors"
copyright = "the feishu_inbox authors, MIT licence"
release = version = _version.group(1) if _version else "unknown"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
# Anchors for headings down to ####, as GitHub makes them: pages link to each other's sections
# with page.md#section, and a link to a section that does not exist is a warning.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

html_theme = "furo"
html_title = f"feishu_inbox {release}"
html_show_sourcelink = False
