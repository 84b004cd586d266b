from __future__ import annotations

import pytest

from tests.support import backfill_jobs


@pytest.fixture
def table(transactional_db: None) -> type[backfill_jobs.Row]:
    """The test table, created in the test database if it is not there yet (empty)."""
    backfill_jobs.make_table()
    return backfill_jobs.Row


@pytest.fixture(autouse=True)
def _media_in_tmp(settings: pytest.FixtureRequest, tmp_path: object) -> None:
    """The default storage writes under the test's own folder, never the checkout's."""
    settings.MEDIA_ROOT = str(tmp_path)  # type: ignore[attr-defined]
