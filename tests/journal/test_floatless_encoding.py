"""Records of events that hold no float are encoded by orjson: the same canonical bytes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from braid_actors.errors import BadRequest
from braid_actors.journal import event_to_record
from braid_actors.journal._encoding import prepare_append
from braid_actors.model import (
    RunPartUpdated,
    RunUsageReported,
    TextPart,
    ToolRequestPart,
    ToolResultPart,
    Usage,
    canonical_json,
    floatless,
)

texts = st.text() | st.sampled_from(["\ud800", "a\udfffb", "\x00\x1f\x7f", "\u2028", '"\\/', "é😀"])
cursors = st.none() | st.integers(min_value=-(2**70), max_value=2**70)


def _plain(data: Any) -> bytes:
    """The plain computation: canonical JSON of the record's mapping."""
    return canonical_json(dict(data))


@given(texts, texts, cursors)
def test_a_text_part_update_is_encoded_to_the_canonical_bytes(
    text: str, part_id: str, cursor: int | None
) -> None:
    at = datetime(2026, 12, 2, 10, 0, 0, 123, tzinfo=UTC)
    event = RunPartUpdated("conv_1", "run_1", "msg_1", TextPart(part_id, text), at, cursor)
    record = event_to_record(event)
    try:
        expected = _plain(record.data)
    except UnicodeEncodeError:  # a lone surrogate is refused, fast path or not
        with pytest.raises(BadRequest):
            prepare_append([record], None)
        return
    assert prepare_append([record], None).plaintexts == (expected,)


@given(texts, st.integers(min_value=-(2**70), max_value=2**70), st.booleans())
def test_a_tool_result_part_update_is_encoded_to_the_canonical_bytes(
    text: str, n: int, truncated: bool
) -> None:
    part = ToolResultPart(f"p{n}", text, "ok", text, truncated, n)
    event = RunPartUpdated("c", "r", "m", part, datetime.now(UTC), n)
    record = event_to_record(event)
    try:
        expected = _plain(record.data)
    except UnicodeEncodeError:
        return
    assert prepare_append([record], None).plaintexts == (expected,)


def test_only_events_whose_types_exclude_floats_take_the_fast_path() -> None:
    """A text part holds no float; a tool request's JSON input and a usage's cost may."""
    at = datetime.now(UTC)
    text = RunPartUpdated("c", "r", "m", TextPart("p", "t"), at)
    tool = RunPartUpdated("c", "r", "m", ToolRequestPart("p", "n", {"x": 1.5}), at)
    usage = RunUsageReported("c", "r", Usage(input_tokens=1), 0.25, at)
    assert floatless(text)
    assert not floatless(tool)
    assert not floatless(usage)
    for event in (tool, usage):  # encoded the plain way, floats as json writes them
        record = event_to_record(event)
        assert prepare_append([record], None).plaintexts == (_plain(record.data),)
