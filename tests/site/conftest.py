from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.wheel import build_wheel


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's wheel, built once per session (per pytest-xdist process)."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))
