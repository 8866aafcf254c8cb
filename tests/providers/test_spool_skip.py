"""A replayed spool passes over the part lines the journal already holds without decoding."""

from __future__ import annotations

from typing import TYPE_CHECKING

from braid_actors.providers._local_spool import SpoolSource
from braid_actors.workers import ProcessInfo, StopPolicy, encode_message

if TYPE_CHECKING:
    from pathlib import Path


def _source(tmp_path: Path, data: bytes) -> SpoolSource:
    source = SpoolSource(
        ProcessInfo(1, 1.0, 1, ()), tmp_path / "s.jsonl", tmp_path / "c.jsonl", StopPolicy()
    )
    source._append(data)
    return source


def _part(n: int) -> bytes:
    return encode_message(
        {"type": "part", "part": {"kind": "text", "part_id": "p", "text": "x" * n}}
    )


def test_skipped_parts_are_not_decoded_and_the_rest_comes_in_order(tmp_path: Path) -> None:
    lines = [
        encode_message({"type": "hello", "protocol": 1, "pid": 1}),
        *(_part(n) for n in range(1, 6)),
        b"not json at all, but already journaled\n".replace(b"not", b'{"type":"part",not'),
        encode_message({"type": "usage", "inputTokens": 1}),
    ]
    source = _source(tmp_path, b"".join(lines))
    budget = [4]  # the journal holds the first four parts and the broken line

    asked: list[int] = []

    def skip(count: int) -> int:
        asked.append(count)
        taken = min(count, budget[0])
        budget[0] -= taken
        return taken

    assert source.buffered(skip) == {"type": "hello", "protocol": 1, "pid": 1}
    fifth = source.buffered(skip)
    assert fifth is not None
    assert fifth["part"]["text"] == "xxxxx"  # parts 1-4 passed over, 5 decoded
    budget[0] = 1
    assert source.buffered(skip) == {"type": "usage", "inputTokens": 1}  # the broken line skipped
    assert source.buffered(skip) is None
    # a run of part lines is offered whole: all six, then the two left after four were taken
    assert asked == [6, 2, 1]


def test_without_skip_every_line_is_decoded(tmp_path: Path) -> None:
    source = _source(tmp_path, _part(1) + _part(2))
    first, second = source.buffered(), source.buffered()
    assert first is not None and second is not None
    assert (first["part"]["text"], second["part"]["text"]) == ("x", "xx")
