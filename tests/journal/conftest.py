from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from braid_actors.journal import Journal

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture
def key() -> bytes:
    return os.urandom(32)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def journal(home: Path, key: bytes) -> Iterator[Journal]:
    j = Journal.open(home, key)
    yield j
    j.close()
