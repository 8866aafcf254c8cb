"""Opaque identifiers with a type prefix (``conv_``, ``br_``, ``msg_`` ...)."""

from __future__ import annotations

import secrets
from collections.abc import Callable

PREFIXES = frozenset(
    {
        "conv",
        "br",
        "msg",
        "turn",
        "run",
        "an",
        "env",
        "ckpt",
        "edge",
        "rule",
        "op",
        "part",
        "int",
        "wrk",
        "sess",
        "plan",
    }
)

IdSource = Callable[[str], str]
"""A function from prefix to a fresh identifier; the graph core takes one so tests stay
deterministic while production uses :func:`new_id`."""


def new_id(prefix: str) -> str:
    """A fresh random identifier ``<prefix>_<24 hex chars>``."""
    if prefix not in PREFIXES:
        raise ValueError(f"unknown identifier prefix {prefix!r}")
    return f"{prefix}_{secrets.token_hex(12)}"


def has_prefix(identifier: object, prefix: str) -> bool:
    """True when ``identifier`` is a string of the form ``<prefix>_<something>``."""
    return (
        isinstance(identifier, str)
        and identifier.startswith(prefix + "_")
        and len(identifier) > len(prefix) + 1
    )


class CountingIds:
    """Deterministic identifiers for tests and replays: ``br_000001`` ..."""

    def __init__(self) -> None:
        self._n = 0

    def __call__(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}_{self._n:06d}"
