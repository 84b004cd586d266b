from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import Subprocesses
from tests.support.webhook_helpers import Receiver


@pytest.fixture
def receivers(tmp_path: Path) -> Iterator[Callable[..., Receiver]]:
    """Makes receivers (``receivers("a", secrets=[...], mode="ok")``, then ``.start()``);
    kills every one at the end."""
    procs = Subprocesses()

    def make(name: str, **options: Any) -> Receiver:
        return Receiver(procs, tmp_path, name, **options)

    try:
        yield make
    finally:
        procs.stop_all()
