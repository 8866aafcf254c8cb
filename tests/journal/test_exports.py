"""The public face of braid_actors.journal."""

from __future__ import annotations

import inspect

import braid_actors.journal as journal


def test_each_public_name_is_exported_once() -> None:
    """__all__ lists every public name of the package exactly once, and each one exists."""
    assert len(journal.__all__) == len(set(journal.__all__))
    assert sorted(journal.__all__) == journal.__all__
    for name in journal.__all__:
        assert hasattr(journal, name), name
    public = {
        name
        for name, value in vars(journal).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert public == set(journal.__all__)


def test_exported_objects_come_from_the_journal_package() -> None:
    """Exports are defined in the journal's private modules, not re-exported from elsewhere."""
    for name in journal.__all__:
        module = getattr(journal, name).__module__
        assert module.startswith("braid_actors.journal._"), (name, module)
