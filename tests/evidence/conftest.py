"""Fixtures of the evidence tests: a store in a temporary home."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from braid_actors.evidence import EvidenceStore

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "braid-home"


@pytest.fixture
def store(home: Path) -> Iterator[EvidenceStore]:
    with EvidenceStore.open(home) as opened:
        yield opened
