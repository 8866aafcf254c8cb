"""Fixtures shared by the worker tests."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test started (append them): afterwards each is ended with its
    descendants, its pipes closed and its status collected."""
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for child in made:
        if child.poll() is None:
            for descendant in psutil.Process(child.pid).children(recursive=True):
                descendant.kill()
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()
        if child.poll() is None:
            child.kill()
        child.wait()
