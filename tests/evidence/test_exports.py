"""The public face of braid_actors.evidence."""

from __future__ import annotations

import inspect
from pathlib import Path

import braid_actors.evidence as evidence


def test_each_public_name_is_exported_once() -> None:
    """__all__ lists every public name of the package exactly once, and each one exists."""
    assert len(evidence.__all__) == len(set(evidence.__all__))
    for name in evidence.__all__:
        assert hasattr(evidence, name), name
    public = {
        name
        for name, value in vars(evidence).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert public == set(evidence.__all__)


def test_exported_objects_come_from_the_evidence_package() -> None:
    """Classes and functions are defined in the evidence package's private modules."""
    for name in evidence.__all__:
        value = getattr(evidence, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__.startswith("braid_actors.evidence._"), name


def test_private_modules_stay_small() -> None:
    """Every module of the package stays under 600 lines."""
    for path in Path(evidence.__file__).parent.glob("*.py"):
        assert len(path.read_text(encoding="utf-8").splitlines()) < 600, path.name
