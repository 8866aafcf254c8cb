"""Spend limits: which limit a run's measured spend crosses first. Pure; no I/O.

A run's limits are the defaults overridden, field by field, by its branch's run overrides
(:func:`effective_limits`). The run actor measures spend as it goes — tokens and cost from
the provider's usage reports, wall time from its own clock, CPU seconds and peak RSS from the
process-tree observer — and after each event asks :func:`first_crossing`. The first event
for which it answers is the last event the run accepts; the run ends with outcome
``spend_limit_exceeded`` naming the crossing's dimension, limit and measured value.

Unknown is never zero: a dimension whose measurement is ``None`` cannot cross its limit, and
:func:`unmeasured` lists the limited dimensions nobody measured, so the caller can say that
the limit was not enforceable instead of implying it held. A limit is crossed when the
measured value *exceeds* it (spending exactly the limit is within it). When several limits
are crossed at once, the first in :data:`DIMENSIONS` order is reported.
"""

from __future__ import annotations

import math
from typing import Final, Literal, TypeVar

import attrs

from braid_actors.model import Limits

Dimension = Literal[
    "input_tokens", "output_tokens", "cost_usd", "wall_seconds", "cpu_seconds", "rss_bytes"
]
DIMENSIONS: Final[tuple[Dimension, ...]] = Dimension.__args__  # type: ignore[attr-defined]
"""Every spend dimension, in the order crossings are reported when several happen at once."""

_T = TypeVar("_T")


@attrs.frozen
class Measured:
    """A run's spend so far; ``None`` means not measured (never "zero")."""

    input_tokens: int | None = None
    """Input tokens reported (or estimated) so far."""
    output_tokens: int | None = None
    """Output tokens reported (or estimated) so far."""
    cost_usd: float | None = None
    """Cost in US dollars reported so far."""
    wall_seconds: float | None = None
    """Seconds since the run started."""
    cpu_seconds: float | None = None
    """CPU seconds of the run's worker trees."""
    rss_bytes: int | None = None
    """Peak resident memory of the run's worker trees, in bytes."""

    def value(self, dimension: Dimension) -> float | None:
        """The measurement of one dimension; ``None`` when unmeasured (NaN counts as that)."""
        measured: float | None = getattr(self, dimension)
        if measured is None or (isinstance(measured, float) and math.isnan(measured)):
            return None
        return measured


@attrs.frozen
class Crossing:
    """A limit the measured spend went past."""

    dimension: Dimension
    """Which limit, by its spec name."""
    limit: float
    """The limit in force."""
    measured: float
    """The measured value that went past it."""


def limit_of(limits: Limits, dimension: Dimension) -> float | None:
    """The limit set for one dimension, or ``None`` for no limit."""
    limit: float | None = getattr(limits, dimension)
    return limit


def effective_limits(defaults: Limits, override: Limits) -> Limits:
    """``defaults`` with every limit that ``override`` sets replacing it (field by field;
    an override's ``None`` inherits)."""
    return Limits(
        input_tokens=_first(override.input_tokens, defaults.input_tokens),
        output_tokens=_first(override.output_tokens, defaults.output_tokens),
        cost_usd=_first(override.cost_usd, defaults.cost_usd),
        wall_seconds=_first(override.wall_seconds, defaults.wall_seconds),
        cpu_seconds=_first(override.cpu_seconds, defaults.cpu_seconds),
        rss_bytes=_first(override.rss_bytes, defaults.rss_bytes),
    )


def first_crossing(limits: Limits, measured: Measured) -> Crossing | None:
    """The first limit (in :data:`DIMENSIONS` order) that ``measured`` exceeds, or ``None``.

    An unmeasured dimension never crosses; see :func:`unmeasured`.
    """
    for dimension in DIMENSIONS:
        limit = limit_of(limits, dimension)
        value = measured.value(dimension)
        if limit is not None and value is not None and value > limit:
            return Crossing(dimension=dimension, limit=limit, measured=value)
    return None


def unmeasured(limits: Limits, measured: Measured) -> tuple[Dimension, ...]:
    """The dimensions that have a limit but no measurement (so they cannot be enforced)."""
    return tuple(
        dimension
        for dimension in DIMENSIONS
        if limit_of(limits, dimension) is not None and measured.value(dimension) is None
    )


def _first(chosen: _T | None, fallback: _T | None) -> _T | None:
    return fallback if chosen is None else chosen
