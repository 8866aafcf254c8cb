"""Bodies and link evidence encoded by orjson read back as what ``json`` would have stored.

``entry_text`` encodes a body without session metadata with orjson; ``json.loads`` of that
text must give the same value with the same key order as ``json.loads`` of ``json.dumps(body,
ensure_ascii=False, sort_keys=True)``, the plain encoding, for every float-free JSON value.
What orjson refuses, and bodies with session metadata, get the plain text itself.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from typing import TYPE_CHECKING, Any

from hypothesis import given
from hypothesis import strategies as st

from braid_actors.evidence import EvidenceStore
from braid_actors.evidence._links import _evidence
from braid_actors.evidence._materialize import entry_text

from ._helpers import FIXTURES

if TYPE_CHECKING:
    from pathlib import Path


def _plain(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False, sort_keys=True)


def _same(body: dict[str, Any]) -> None:
    got, plain = json.loads(entry_text(body)), json.loads(_plain(body))
    assert got == plain
    assert json.dumps(got) == json.dumps(plain)  # the same key order, all the way down


_TEXT = st.text(st.characters(exclude_categories=["Cs"]))
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(_TEXT.filter(lambda k: k != "session_metadata"), _VALUES, max_size=6))
def test_float_free_bodies_read_back_the_same(body: dict[str, Any]) -> None:
    _same(body)


def test_what_orjson_refuses_and_session_metadata_take_json() -> None:
    """Integers beyond 64 bits and lone surrogates: json's text; session metadata (floats,
    NaN included): json's text, byte for byte."""
    for body in (
        {"n": 2**70, "a": "x"},
        {"s": "lone \ud800 surrogate"},
        {"session_metadata": {"t": 0.1, "nan": float("nan"), "e": 1e-7}, "id": "x"},
    ):
        assert entry_text(body) == _plain(body)


def test_every_fixture_entry_reads_back_as_its_plain_encoding(tmp_path: Path) -> None:
    """Every stored body of every fixture, stored again both ways: the same value."""
    home = tmp_path / "home"
    with EvidenceStore.open(home) as store:
        for path in sorted(FIXTURES.rglob("*.json*")):
            store.ingest(path, run_id="run_text", policy="detailed")
    with closing(sqlite3.connect(home / "evidence.sqlite3")) as conn:
        bodies = [json.loads(row[0]) for row in conn.execute("SELECT body FROM entries")]
    assert len(bodies) > 1000
    assert any("session_metadata" in body for body in bodies)
    for body in bodies:
        _same(body)


_EVIDENCE_VALUES = st.none() | _TEXT | st.lists(_TEXT, max_size=3)


@given(st.dictionaries(st.from_regex(r"[a-z_]{1,12}", fullmatch=True), _EVIDENCE_VALUES))
def test_link_evidence_is_the_plain_encoding_byte_for_byte(fields: dict[str, Any]) -> None:
    """A link's evidence (strings, nulls, lists of strings) encoded by orjson is exactly
    ``json.dumps(fields, ensure_ascii=False, sort_keys=True, separators=(",", ":"))``:
    rows stored before compare equal to rows computed now."""
    plain = json.dumps(fields, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    assert _evidence(**fields) == plain


def test_link_evidence_with_a_lone_surrogate_takes_json() -> None:
    fields = {"value": "a\ud800b", "basis": "x"}
    plain = json.dumps(fields, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    assert _evidence(**fields) == plain
