"""The redactor's literal hints decide exactly what their case-folding regexes decide.

A rule runs only where its hint occurs. For the case-insensitive rules the hint is looked up
with ``in`` on ``value.lower()`` instead of the (much slower) case-folding regex, also for
non-ASCII text that holds none of the few characters the regex engine folds onto ASCII
letters; these tests try every code point for that list and compare both lookups on text
built from hint literals and case-folding characters.
"""

from __future__ import annotations

import re
import sys

from hypothesis import given
from hypothesis import strategies as st

from braid_actors.evidence._redact import _FOLDS_INTO_ASCII, _HINTS, _hint, _lowered


def test_the_characters_folding_onto_ascii_are_all_listed() -> None:
    """Every non-ASCII code point the engine's case-insensitive matching pairs with an ASCII
    character, and every one whose ``lower()`` holds an ASCII character, is listed."""
    ascii_folded = re.compile(r"[\x00-\x7f]", re.IGNORECASE)
    found = set()
    for code in range(0x80, sys.maxunicode + 1):
        if 0xD800 <= code <= 0xDFFF:
            continue
        char = chr(code)
        lowered = char.lower()
        if ascii_folded.match(char) or (lowered != char and any(c.isascii() for c in lowered)):
            found.add(char)
    assert found == set(_FOLDS_INTO_ASCII)


FOLDING = [kind for kind, (_literals, fold) in _HINTS.items() if fold]
LITERALS = {literal for kind in FOLDING for literal in _HINTS[kind][0]}
SWAPS = {"s": "\u017f", "i": "\u0131", "I": "\u0130", "k": "\u212a"}
PIECES = sorted(
    LITERALS
    | {literal.replace(a, b, 1) for literal in LITERALS for a, b in SWAPS.items()}
    | {literal.upper() for kind in FOLDING for literal in _HINTS[kind][0]}
    | set(_FOLDS_INTO_ASCII)
    | {"é", "ß", "Σ", "ς", "ǅ", "ﬁ", "_", "-", " ", "e", "A", "\u0307"}
)
texts = st.lists(st.sampled_from(PIECES) | st.text(max_size=3), max_size=10).map("".join)


@given(texts)
def test_lowered_lookup_is_the_hint_regex(value: str) -> None:
    lowered = _lowered(value)
    for kind in FOLDING:
        by_regex = _hint(kind).search(value) is not None
        if lowered is None:
            continue  # the regex itself decides
        by_lookup = any(literal in lowered for literal in _HINTS[kind][0])
        assert by_lookup == by_regex, (kind, value)


def test_text_with_a_folding_character_goes_to_the_regex() -> None:
    assert _lowered("\u017fecret") is None and _hint("secret_assignment").search("\u017fecret")
    assert _lowered("sécret") == "sécret"
