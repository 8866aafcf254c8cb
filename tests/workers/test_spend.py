"""Spend limits: crossings, unmeasured dimensions, override precedence, order."""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from braid_actors.model import Limits
from braid_actors.workers import (
    DIMENSIONS,
    Crossing,
    Dimension,
    Measured,
    effective_limits,
    first_crossing,
    unmeasured,
)

LIMITS = Limits(
    input_tokens=1000,
    output_tokens=500,
    cost_usd=0.25,
    wall_seconds=60.0,
    cpu_seconds=30.0,
    rss_bytes=512 * 1024 * 1024,
)
ABOVE = Measured(
    input_tokens=1001,
    output_tokens=501,
    cost_usd=0.2500001,
    wall_seconds=60.5,
    cpu_seconds=30.01,
    rss_bytes=512 * 1024 * 1024 + 1,
)


def only(dimension: Dimension, value: float) -> Measured:
    """A measurement of one dimension; the others unmeasured."""
    fields: dict[str, Any] = {dimension: value}
    return Measured(**fields)


def test_dimensions_are_the_limit_and_measurement_fields() -> None:
    """Every field of Limits and of Measured is a dimension, in the spec's order."""
    assert DIMENSIONS == (
        "input_tokens",
        "output_tokens",
        "cost_usd",
        "wall_seconds",
        "cpu_seconds",
        "rss_bytes",
    )
    assert tuple(f.name for f in attrs.fields(Limits)) == DIMENSIONS
    assert tuple(f.name for f in attrs.fields(Measured)) == DIMENSIONS


@pytest.mark.parametrize("dimension", DIMENSIONS)
def test_every_dimension_crosses(dimension: Dimension) -> None:
    """A measurement above its limit crosses it, reporting dimension, limit and value."""
    value = getattr(ABOVE, dimension)
    crossing = first_crossing(LIMITS, only(dimension, value))
    assert crossing == Crossing(
        dimension=dimension, limit=getattr(LIMITS, dimension), measured=value
    )


@pytest.mark.parametrize("dimension", DIMENSIONS)
def test_spending_exactly_the_limit_is_within_it(dimension: Dimension) -> None:
    """A measurement equal to its limit does not cross it."""
    assert first_crossing(LIMITS, only(dimension, getattr(LIMITS, dimension))) is None


def test_unmeasured_never_crosses_and_is_reported() -> None:
    """None is never treated as zero: it cannot cross, and it is listed as unmeasured."""
    tiny = Limits(
        input_tokens=0,
        output_tokens=0,
        cost_usd=0.0,
        wall_seconds=0.0,
        cpu_seconds=0.0,
        rss_bytes=0,
    )
    assert first_crossing(tiny, Measured()) is None
    assert unmeasured(tiny, Measured()) == DIMENSIONS
    assert unmeasured(Limits(), Measured()) == ()
    partial = Measured(input_tokens=0, cpu_seconds=0.0)
    assert unmeasured(tiny, partial) == (
        "output_tokens",
        "cost_usd",
        "wall_seconds",
        "rss_bytes",
    )


def test_nan_counts_as_unmeasured() -> None:
    """A NaN measurement is not a value: it neither crosses nor hides as measured."""
    nan = Measured(cost_usd=math.nan)
    assert first_crossing(LIMITS, nan) is None
    assert "cost_usd" in unmeasured(LIMITS, nan)


def test_no_limit_means_no_crossing() -> None:
    """With no limit set, any measurement is within."""
    assert first_crossing(Limits(), ABOVE) is None


def test_override_wins_per_field() -> None:
    """An override's limit replaces the default's; its None inherits the default."""
    defaults = Limits(input_tokens=100, cost_usd=1.0, cpu_seconds=10.0)
    override = Limits(input_tokens=50, wall_seconds=5.0, cpu_seconds=0.0)
    assert effective_limits(defaults, override) == Limits(
        input_tokens=50, cost_usd=1.0, wall_seconds=5.0, cpu_seconds=0.0
    )
    assert effective_limits(defaults, Limits()) == defaults
    assert effective_limits(Limits(), override) == override


def test_several_crossings_report_the_first_in_order() -> None:
    """When several limits are crossed at once, the earliest dimension in order is reported."""
    measured = ABOVE
    for dimension in DIMENSIONS:
        crossing = first_crossing(LIMITS, measured)
        assert crossing is not None
        assert crossing.dimension == dimension
        cleared: dict[str, Any] = {dimension: None}
        measured = attrs.evolve(measured, **cleared)
    assert first_crossing(LIMITS, measured) is None


values = st.one_of(st.none(), st.integers(min_value=0, max_value=10))


@given(
    limits=st.builds(Limits, *(values for _ in DIMENSIONS)),
    measured=st.builds(Measured, *(values for _ in DIMENSIONS)),
)
def test_first_crossing_is_the_first_exceeded_limit(limits: Limits, measured: Measured) -> None:
    """first_crossing names the first dimension whose known measurement exceeds its limit."""
    exceeded = [
        d
        for d in DIMENSIONS
        if getattr(limits, d) is not None
        and getattr(measured, d) is not None
        and getattr(measured, d) > getattr(limits, d)
    ]
    crossing = first_crossing(limits, measured)
    if not exceeded:
        assert crossing is None
    else:
        assert crossing is not None
        assert crossing.dimension == exceeded[0]
        assert crossing.measured > crossing.limit
