"""JSON shortcuts give exactly what plain ``json`` gives.

Lines are decoded by orjson unless json would read them differently (19 digits in a row,
or orjson refuses the line); format detection rules a JSONL file out as a Gemini document
by its first line instead of decoding the whole file. Both are checked against the plain
computation on generated lines: JSON values with big integers, floats, escapes and
surrogates, mutated by bytes that break or change them (quotes, digits, NUL, invalid UTF-8,
encoded surrogates, newlines), and UTF-16 documents. An entry's ``object_hash`` is
encoded by orjson when the entry holds no float: checked against the canonical digest on
float-free values with every kind of string and integers beyond 64 bits. A stored body is
read back by orjson unless it holds 19 digits in a row: checked against ``json.loads`` on
the texts json writes (floats, NaN and infinities, integers beyond 64 bits, escapes).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from braid_actors.evidence._detect import _is_gemini
from braid_actors.evidence._materialize import (
    compact_json,
    floatless_digest,
    holds_float,
    object_digest,
)
from braid_actors.evidence._parsed import (
    MAX_LINE_BYTES,
    loads_stored,
    long_digit_runs,
    split_lines,
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**19])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["\ud800", "\udfff", "é", "\u2028", "\x00", "\x7f", "😀"])
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=10,
)
NOISE = [b'"', b"\\", b"0", b"9", b"1234567890123456789", b"e", b"-", b".", b",", b":"]
NOISE += [b"{", b"}", b"[", b"\x00", b"\xff", b"\xed\xa0\x80", b"\xef\xbb\xbf", b" ", b"\x0c"]
NOISE += [b"\\ud800", b"NaN", b"1e400", b"\t", b"\r"]


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    value = draw(st.dictionaries(st.text(max_size=6), values, max_size=5) | values)
    raw = json.dumps(value, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(raw)))
        cut = draw(st.integers(0, 2))
        raw = raw[:at] + draw(st.sampled_from(NOISE)) + raw[at + cut :]
    return raw


def _plain_decode(raw: bytes) -> tuple[str, str | None]:
    """The line decode before the shortcut, as comparable text (repr keeps int/float,
    -0.0 and key order apart)."""
    if len(raw) > MAX_LINE_BYTES:
        return ("", "line_too_long")
    try:
        obj = json.loads(raw)
    except ValueError:
        return ("", "malformed_json")
    if not isinstance(obj, dict):
        return ("", "not_an_object")
    return (repr(obj), None)


def _plain_split(data: bytes) -> list[tuple[Any, ...]]:
    """The split before the shortcut (every line by json.loads)."""
    out: list[tuple[Any, ...]] = []
    position, number = 0, 0
    while position < len(data):
        newline = data.find(b"\n", position)
        number += 1
        if newline < 0:
            if data[position:].strip():
                out.append((number, position, len(data), data[position:], "", "incomplete_line"))
            break
        raw = data[position:newline]
        if raw.strip():
            out.append((number, position, newline + 1, raw, *_plain_decode(raw)))
        position = newline + 1
    return out


@given(st.lists(lines(), min_size=1, max_size=6), st.booleans())
def test_split_lines_decodes_as_json_loads(raws: list[bytes], complete: bool) -> None:
    data = b"\n".join(raws) + (b"\n" if complete else b"")
    split = split_lines(data)
    got = [
        (
            line.number,
            line.start,
            line.end,
            line.raw,
            repr(line.obj) if line.obj is not None else "",
            line.error,
        )
        for line in (*split.lines, *((split.deferred,) if split.deferred else ()))
    ]
    assert got == _plain_split(data)


@given(st.binary(max_size=80) | lines())
def test_long_digit_runs_finds_every_run(data: bytes) -> None:
    expected = [
        at
        for at in range(len(data))
        if len(data[at : at + 19]) == 19 and data[at : at + 19].isdigit()
    ]
    assert long_digit_runs(data) == expected


def _plain_is_gemini(data: bytes) -> bool:
    if not data.lstrip().startswith(b"{"):
        return False
    try:
        obj = json.loads(data)
    except ValueError:
        return False
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("messages"), list)
        and "sessionId" in obj
        and "projectHash" in obj
    )


def _gemini(extra: dict[str, Any]) -> dict[str, Any]:
    return {"sessionId": "s", "projectHash": "h", "messages": [{"type": "user"}], **extra}


@given(
    st.dictionaries(st.text(max_size=4), values, max_size=3).map(_gemini) | values,
    st.sampled_from([None, 2]),
    st.sampled_from(["utf-8", "utf-16-le", "utf-16-be", "utf-16", "utf-32-le"]),
    st.sampled_from([b"", b"\n", b" \n", b"\n\x0c", b"\n{}", b"\n\n", b"\r\n", b"\n  \t"]),
    st.sampled_from([b"", b" ", b"\n", b"\t "]),
)
def test_is_gemini_is_the_plain_check(
    value: Any, indent: int | None, encoding: str, tail: bytes, head: bytes
) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    try:
        body = text.encode(encoding)
    except UnicodeEncodeError:
        return  # a lone surrogate: not encodable
    tail_text = tail.decode("ascii").encode(encoding)
    for data in (head + body + tail, head + body + tail_text, body + b"\n" + body):
        assert _is_gemini(data) == _plain_is_gemini(data)


floatless = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1])
    | st.text()
    | st.characters().map(lambda c: c * 3)
    | st.sampled_from(["\ud800", "a\udfffb", "\x00\x1f\x7f", "\u2028", '"\\/']),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=16,
)


@given(floatless)
def test_floatless_digest_is_the_canonical_digest(value: Any) -> None:
    try:
        expected = object_digest(value)
    except UnicodeEncodeError:  # a lone surrogate: refused by both
        with pytest.raises(UnicodeEncodeError):
            floatless_digest(value)
        return
    assert floatless_digest(value) == expected


stored_values = st.recursive(
    scalars.filter(lambda v: not (isinstance(v, str) and "\ud800" <= v <= "\udfff"))
    | st.floats()  # NaN and the infinities included: json writes and reads them
    | st.sampled_from([2**64 + 1, -(2**70), 10**30, 0.1, 1e-7, -0.0]),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(stored_values, st.booleans())
def test_stored_text_reads_back_as_json_loads(value: Any, ascii_only: bool) -> None:
    """What the store wrote (json's or orjson's text of a body) reads back as json reads it:
    the same types (an integer beyond 64 bits stays an integer), values and key order."""
    text = json.dumps(value, ensure_ascii=ascii_only, sort_keys=True)
    data = text.encode("utf-8", "surrogatepass")
    assert repr(loads_stored(data)) == repr(json.loads(data))


compact_values = st.recursive(
    scalars
    | st.floats()  # NaN and the infinities included: json writes them, orjson would not
    | st.sampled_from([1e16, 1e-5, -2.5e-30, 1e300, 0.1, -0.0, 2**64 + 1, -(2**70)])
    | st.text()
    | st.characters().map(lambda c: c * 3)
    | st.sampled_from(["\ud800", "a\udfffb", "\x00\x1f\x7f\x08\x0c", "\u2028\u2029", '"\\/']),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8), inner, max_size=5)
        | st.dictionaries(st.integers(-3, 3) | st.booleans(), inner, max_size=2)
    ),
    max_leaves=16,
)


@given(compact_values)
def test_compact_json_is_json_dumps(value: Any) -> None:
    """The compact text of a value is json's, whatever the value holds (json encodes
    everything here, lone surrogates and NaN included, and so must the shortcut)."""
    assert compact_json(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def test_compact_json_takes_orjson_only_without_floats() -> None:
    assert holds_float([{"a": [1, {"b": 0.5}]}]) and holds_float(float("nan"))
    assert not holds_float({"a": [1, True, None, "0.5", {"b": 2**70}]})
    deep: Any = 1.5
    for _ in range(5000):  # deeper than the interpreter's recursion limit
        deep = [deep]
    assert holds_float(deep)
    nested: Any = "x"
    for _ in range(300):  # deeper than orjson takes: json encodes it
        nested = {"a": [nested]}
    assert compact_json(nested) == json.dumps(nested, separators=(",", ":"), ensure_ascii=False)
    # the floats where orjson and json part: exponents and NaN
    assert compact_json({"x": [1e16, 1e-5, float("nan")]}) == '{"x":[1e+16,1e-05,NaN]}'
