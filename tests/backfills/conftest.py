from __future__ import annotations

import pytest

from tests.support import backfill_jobs


@pytest.fixture
def table(transactional_db: None) -> type[backfill_jobs.Row]:
    """The test table, created in the test database if it is not there yet (empty)."""
    backfill_jobs.make_table()
    return backfill_jobs.Row
