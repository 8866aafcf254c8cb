"""Every package's public face names each export once, and each name resolves."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = [
    "braid_actors.model",
    "braid_actors.graph",
    "braid_actors.journal",
    "braid_actors.workers",
    "braid_actors.providers",
    "braid_actors.supervisor",
    "braid_actors.app",
    "braid_actors.evidence",
    "tools.model_stub",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_public_names_are_exported_once_and_resolve(name: str) -> None:
    """`__all__` has no duplicates and every listed name exists on the package."""
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert len(exported) == len(set(exported))
    for item in exported:
        assert hasattr(module, item), f"{name} lists {item} but does not define it"


@pytest.mark.parametrize("name", PACKAGES)
def test_an_unknown_name_is_an_error_and_dir_lists_every_export(name: str) -> None:
    """Eager or loaded on first use (PEP 562), a package answers alike: a name it does not
    export is an AttributeError, and ``dir`` lists every export before it is used."""
    module = importlib.import_module(name)
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError):
        _ = module.no_such_name


def test_errors_have_unique_stable_codes() -> None:
    """Each error class has its own snake_case code (subclasses never silently share one)."""
    from braid_actors import errors

    classes = [getattr(errors, n) for n in errors.__all__]
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes)), sorted(c for c in codes if codes.count(c) > 1)
    assert all(c.replace("_", "").isalpha() and c == c.lower() for c in codes)


def test_every_braid_error_lives_in_the_errors_module() -> None:
    """No package defines an error of its own: every BraidError subclass anywhere in
    braid_actors is one of errors.__all__, so the code check above sees them all."""
    import pkgutil

    import braid_actors
    from braid_actors import errors

    for info in pkgutil.walk_packages(braid_actors.__path__, "braid_actors."):
        if info.name.endswith("__main__"):
            continue
        importlib.import_module(info.name)
    found: set[type[errors.BraidError]] = set()
    pending: list[type[errors.BraidError]] = [errors.BraidError]
    while pending:
        for sub in pending.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                pending.append(sub)
    outside = sorted(
        f"{c.__module__}.{c.__qualname__}" for c in found if c.__module__ != errors.__name__
    )
    assert outside == []
    listed = {getattr(errors, n) for n in errors.__all__}
    assert found <= listed
