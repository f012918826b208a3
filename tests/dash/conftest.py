"""The `deck` fixture: a controller on the simulator serving its API (tests/dash/deck.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from dash.deck import TOKEN, Deck, running


@pytest.fixture
def deck(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Deck]:
    monkeypatch.setenv("FG_DASH_TOKEN", TOKEN)
    with running(tmp_path / "state") as d:
        yield d
