"""Every contract suite here runs on both journal backends: a SQLite file in the test's own
directory, and a PostgreSQL schema of the test's own, dropped afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import BACKENDS, journal_on

from controller.store.journal import Journal


@pytest.fixture(params=BACKENDS)
def j(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Journal]:
    with journal_on(request.param, tmp_path) as journal:
        yield journal
