"""Headless Chromium for the browser tests: Playwright driving Debian's Chromium.

Without Chromium the browser tests fail, never skip: the README promises a suite that runs
every test, and a skipped browser test once hid an unstyled admin.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
INSTALL = "apt-get install chromium (Debian/Ubuntu), or set CHROMIUM=/path/to/chromium"


@contextmanager
def chromium_context() -> Iterator[Any]:
    """A fresh Playwright browser context (1400 x 900), closed with its browser afterwards."""
    if not shutil.which(CHROMIUM):
        pytest.fail(f"no Chromium at {CHROMIUM}: the browser tests need it. {INSTALL}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        try:
            yield context
        finally:
            context.close()
            browser.close()
