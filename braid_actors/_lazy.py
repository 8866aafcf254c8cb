"""A package's public names loaded on first use (PEP 562), outside the layers.

A package lists where each public name lives and, at run time only (its imports under
``TYPE_CHECKING`` are what the type checker reads, so a wrong name stays an error), sets::

    __getattr__, __dir__ = _lazy.names(__name__, _SOURCES)
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


def names(
    package: str, sources: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose name ``n`` is ``sources[n]``'s."""
    namespace = vars(sys.modules[package])

    def load(name: str) -> Any:
        module = sources.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def listed() -> list[str]:
        return sorted(set(namespace) | set(sources))

    return load, listed
