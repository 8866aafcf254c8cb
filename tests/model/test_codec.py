"""Canonical JSON, digests and the one converter."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import attrs
import cattrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from braid_actors.model import (
    EVENT_TYPES,
    PART_TYPES,
    Completeness,
    Event,
    Message,
    Part,
    TextPart,
    canonical_json,
    converter,
    digest,
    format_time,
    is_digest,
    parse_time,
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def test_canonical_json_sorts_keys_uses_utf8_and_no_whitespace() -> None:
    """Canonical form: sorted keys, raw UTF-8, compact separators."""
    assert canonical_json({"b": 1, "a": ["é", None]}) == '{"a":["é",null],"b":1}'.encode()


def test_canonical_json_refuses_nan() -> None:
    """NaN has no canonical JSON form."""
    with pytest.raises(ValueError, match="JSON"):
        canonical_json({"x": float("nan")})


@given(json_values)
def test_canonical_json_is_stable_under_reordering(value: object) -> None:
    """Parsing and re-serializing gives the same bytes, so equal values share a digest."""
    once = canonical_json(value)
    assert canonical_json(json.loads(once)) == once
    assert is_digest(digest(value))


def test_digest_format() -> None:
    """Digests are sha256: plus 64 lowercase hex digits."""
    d = digest({"a": 1})
    assert d.startswith("sha256:")
    assert is_digest(d)
    assert not is_digest("sha256:" + "A" * 64)
    assert not is_digest("md5:" + "0" * 64)


def test_times_are_utc_rfc3339_and_naive_is_refused() -> None:
    """Datetimes are written as UTC with Z; a naive one is an error."""
    t = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=timezone(timedelta(hours=2)))
    assert format_time(t) == "2026-01-02T01:04:05.000006Z"
    assert parse_time(format_time(t)) == t
    with pytest.raises(ValueError, match="naive"):
        format_time(datetime(2026, 1, 1))


@given(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31)))
def test_a_utc_time_is_written_as_strftime_writes_it(naive: datetime) -> None:
    """The hot path for UTC values gives what the plain strftime form gives (always six
    digits of microseconds; years before 1000 as strftime writes them), and the same for
    the same instant in another zone."""
    plain = naive.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert format_time(naive.replace(tzinfo=UTC)) == plain
    if naive.year < 9999:
        other = naive.replace(tzinfo=UTC).astimezone(timezone(timedelta(hours=-3)))
        assert format_time(other) == plain


def test_every_part_kind_round_trips_through_the_union() -> None:
    """Each part kind structures back from its unstructured form via its kind tag."""
    conv = converter()
    samples: list[Part] = []
    for kind, cls in PART_TYPES.items():
        fields = {f.name: f for f in attrs.fields(cls)}
        values: dict[str, Any] = {}
        for name, field in fields.items():
            if name == "kind" or field.default is not attrs.NOTHING:
                continue
            values[name] = {"input": {"a": 1}, "payload": {"b": 2}, "size": 3, "status": "ok"}.get(
                name, name
            )
        samples.append(cls(**values))
        assert samples[-1].kind == kind
    for part in samples:
        assert conv.structure(conv.unstructure(part), Part) == part  # type: ignore[arg-type]


def test_unknown_or_extra_fields_are_refused() -> None:
    """A typo is an error, not a silently dropped field; an unknown kind is an error."""
    conv = converter()
    now = datetime.now(UTC)
    msg = Message(
        "msg_1",
        "conv_1",
        "br_1",
        "user",
        (TextPart("p", "hi"),),
        now,
        now,
        Completeness("complete"),
    )
    data = conv.unstructure(msg)
    data["colour"] = "blue"
    with pytest.raises(cattrs.ClassValidationError):
        conv.structure(data, Message)
    with pytest.raises(ValueError, match="known 'kind'"):
        conv.structure({"kind": "nope", "part_id": "p"}, Part)  # type: ignore[arg-type]


def test_event_union_is_closed_and_tagged() -> None:
    """Every event class carries its own type tag; the union resolves each tag."""
    for tag, cls in EVENT_TYPES.items():
        assert attrs.fields_dict(cls)["type"].default == tag
    assert len(EVENT_TYPES) == len(set(EVENT_TYPES.values()))
    with pytest.raises(ValueError, match="known 'type'"):
        converter().structure({"type": "run.teleported"}, Event)  # type: ignore[arg-type]
