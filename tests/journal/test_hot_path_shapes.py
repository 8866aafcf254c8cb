"""The stream's spelled-out shortcuts give exactly what the converter gives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import cattrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from braid_actors.errors import ProviderProtocolError
from braid_actors.journal import event_to_record
from braid_actors.model import PART_TYPES, RunPartUpdated, TextPart, ToolResultPart, converter
from braid_actors.workers._wire import _converter, structure_part

texts = st.text() | st.sampled_from(["", "\x00\n", "é😀", "\ud800"])
times = st.datetimes(
    min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)
)


@given(texts.filter(bool), texts, texts, texts, st.none() | st.integers(), times)
def test_a_text_part_update_is_unstructured_as_the_converter_does(
    conv: str, run: str, part_id: str, text: str, cursor: int | None, at: datetime
) -> None:
    event = RunPartUpdated(conv, run, "msg", TextPart(part_id, text), at, cursor)
    expected = converter().unstructure(event)
    del expected["type"]
    data = dict(event_to_record(event).data)
    assert data == expected
    assert list(data) == list(expected)  # the same key order too (it reaches subscribers)
    assert list(data["part"]) == list(expected["part"])


def test_other_updates_take_the_converter() -> None:
    part = ToolResultPart("p", "req", "ok", "done")
    event = RunPartUpdated("c", "r", "m", part, datetime.now(UTC) - timedelta(days=1), 4)
    expected = converter().unstructure(event)
    del expected["type"]
    assert dict(event_to_record(event).data) == expected


wire_values: st.SearchStrategy[Any] = st.none() | st.integers() | st.booleans() | texts
wire_parts = st.fixed_dictionaries(
    {"kind": st.just("text")}, optional={"part_id": texts, "text": texts}
) | st.fixed_dictionaries(
    {"kind": st.sampled_from(["text", "reasoning", 3])},
    optional={"part_id": wire_values, "text": wire_values, "extra": wire_values},
)


def _plain_structure(value: dict[str, Any]) -> Any:
    """The plain reading: the part class its kind names, through the converter."""
    kind = value.get("kind")
    cls = PART_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProviderProtocolError("no known kind")
    try:
        return _converter.structure(value, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError):
        raise ProviderProtocolError("does not match") from None


@given(wire_parts)
def test_a_wire_part_is_read_as_the_converter_reads_it(value: dict[str, Any]) -> None:
    """Whatever the dict, the shortcut for text parts agrees with the plain reading:
    the same part, or a refusal."""
    try:
        plain = _plain_structure(value)
    except ProviderProtocolError:
        with pytest.raises(ProviderProtocolError):
            structure_part(value)
        return
    got = structure_part(value)
    assert got == plain and type(got) is type(plain)
