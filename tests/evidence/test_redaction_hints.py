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

from braid_actors.evidence._redact import (
    _BUILTIN,
    _FOLDS_INTO_ASCII,
    _GATES,
    _HINTS,
    BUILTIN_PATTERNS,
    Redactor,
    _hint,
    _lowered,
)

from .test_fast_paths import FRAGMENTS


def test_the_characters_folding_onto_ascii_are_all_listed() -> None:
    """Every non-ASCII code point the engine's case-insensitive matching pairs with an ASCII
    character, every one whose ``lower()`` holds an ASCII character and every one that
    ``lower()`` turns into more than one character is listed (so elsewhere ``lower()`` keeps
    the offsets)."""
    ascii_folded = re.compile(r"[\x00-\x7f]", re.IGNORECASE)
    found = set()
    for code in range(0x80, sys.maxunicode + 1):
        if 0xD800 <= code <= 0xDFFF:
            continue
        char = chr(code)
        lowered = char.lower()
        if ascii_folded.match(char) or (
            lowered != char and (len(lowered) != 1 or any(c.isascii() for c in lowered))
        ):
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


@given(texts | st.lists(st.sampled_from([*PIECES, "token", "TOKEN", "tok", "en"])).map("".join))
def test_each_rules_prefilter_is_its_hint_regex(value: str) -> None:
    """``may_match`` (gated literals included) says yes exactly when the rule's hint regex
    finds one of its literals in ``value``."""
    lowered = _lowered(value)
    for rule in _BUILTIN:
        assert rule.hint is not None or rule.kind == "pem_private_key"
        if rule.hint is not None:
            expected = rule.hint.search(value) is not None
            assert rule.may_match(value, lowered) == expected, (rule.kind, value)


def test_gated_literals_are_looked_for_only_behind_their_gate() -> None:
    (rule,) = [rule for rule in _BUILTIN if rule.kind == "secret_assignment"]
    assert _GATES == {"secret_assignment": "token"} and rule.gate == "token"
    assert set(rule._gated) == {x for x in rule.literals if "token" in x} and len(rule._gated) == 9
    assert set(rule._ungated) | set(rule._gated) == set(rule.literals)
    # each gated literal alone, in any case, is found through the gate
    for literal in rule._gated:
        for text in (f"x {literal}=1", f"{literal.upper()}:", f"a{literal.title()}b"):
            assert rule.may_match(text, _lowered(text)), text
    assert not rule.may_match("tokens: 12", "tokens: 12")
    assert not rule.may_match("accessor", "accessor")


def test_text_with_a_folding_character_goes_to_the_regex() -> None:
    assert _lowered("\u017fecret") is None and _hint("secret_assignment").search("\u017fecret")
    assert _lowered("sécret") == "sécret"


# Secrets behind every name and prefix the rules know, next to word characters, escapes and
# markers (offsets before and after a literal matter to the windowed search).
NAMES = (
    "client_secret",
    "client-secret",
    "clientsecret",
    "secret_key",
    "apikey",
    "api-key",
    "accesstoken",
    "refresh-token",
    "passwd",
    "credential",
    "x_api_key",
    "sk_live_",
    "rk_test_",
    "pk_live_",
    "ghs_",
    "github_pat_",
    "xoxp-",
    "AIza",
    "ASIA",
    "sk-",
    "Bearer ",
    "basic ",
    "://u:",
    "@h",
)
VALUES = ("=", ": ", '":"', "'", "abc123DEF456ghi789jkl0", "A" * 40, "Q1w2E3r4T5y6U7i8O9p0")
pieces = st.sampled_from(NAMES + VALUES + FRAGMENTS) | st.text(max_size=4)
secret_texts = st.lists(pieces, max_size=12).map("".join)


def _check_substitution(value: str) -> None:
    lowered = _lowered(value)
    for rule, (kind, source) in zip(_BUILTIN, BUILTIN_PATTERNS, strict=True):
        assert rule.kind == kind
        pattern = re.compile(source)
        marker = f"[REDACTED:{kind}]"
        if "keep" in pattern.groupindex:

            def keep(match: re.Match[str], mark: str = marker) -> str:
                return (match.group("keep") or "") + mark

            expected = pattern.subn(keep, value)
        else:
            expected = pattern.subn(marker, value)
        assert rule.substitute(value, lowered) == expected, (kind, value)


@given(secret_texts)
def test_windowed_substitution_is_subn(value: str) -> None:
    """Each rule's substitution finds exactly the matches ``pattern.subn`` finds."""
    _check_substitution(value)


def test_windowed_substitution_is_subn_for_every_name_and_value() -> None:
    for name in NAMES:
        for separator in ("", "=", ": ", '":"', "'"):
            for value in VALUES:
                for before in ("", "x", " ", "\\n", "_"):
                    _check_substitution(f"{before}{name}{separator}{value} {name.upper()}{value}")


def test_every_rule_with_a_lead_has_literal_hints() -> None:
    assert all(rule.literals for rule in _BUILTIN if rule.lead is not None)
    assert [rule.kind for rule in _BUILTIN if rule.lead is None] == ["pem_private_key"]


# ---- the redactor's gate: one loop that rules every rule out at once ------------------

GATE_PIECES = sorted(
    {literal for literals, _fold in _HINTS.values() for literal in literals}
    | {literal.upper() for literals, _fold in _HINTS.values() for literal in literals}
    | {literal.title() for literals, _fold in _HINTS.values() for literal in literals}
    | {"token", "TOKEN", "tok", "en", "sk", "-", "_", ":/", "/", "PRIVATE", " KEY"}
)
gate_texts = st.lists(
    st.sampled_from(GATE_PIECES + list(PIECES)) | st.text(max_size=3), max_size=10
).map("".join)


@given(gate_texts)
def test_a_quiet_text_is_one_no_rule_may_match(value: str) -> None:
    """Where the gate finds none of its literals, no rule's own check says yes, and the
    redactor's answers equal those of a redactor without the gate."""
    gated = Redactor.create()
    ungated = Redactor.create()
    ungated._gate = None
    lowered = _lowered(value)
    if gated._quiet(value, lowered):
        assert not any(rule.may_match(value, lowered) for rule in gated.rules), value
    assert gated.candidates(value) == ungated.candidates(value)
    assert gated._run(value, None) == ungated._run(value, None)


def test_the_gate_finds_each_literal_and_steps_aside_for_configured_rules() -> None:
    redactor = Redactor.create()
    gate = redactor._gate
    assert gate is not None and "token" in gate.folded and "sk-" in gate.exact
    assert "sk-ant-" not in gate.exact and "PRIVATE KEY" not in gate.exact  # "sk-", "private"
    for kind, (literals, fold) in _HINTS.items():
        for literal in literals:
            texts = [literal, f"x {literal} y", f"({literal}"]
            if fold:
                texts += [f"x {literal.upper()} y", f"({literal.title()})"]
            for text in texts:
                assert not redactor._quiet(text, _lowered(text)), (kind, text)
    for text in ("plain words, input_tokens 12", "a url: https://example.com", "Basic"):
        assert not redactor._quiet(text, _lowered(text)), text  # token, ://, basic (folded)
    for text in ("plain words and numbers 12", "akia gh_p", "SK-1", "Sk-", "EYJ"):
        assert redactor._quiet(text, _lowered(text)), text  # case-sensitive literals
    assert not redactor._quiet("\u017fecret", None)  # a folding character: the rules decide
    # A configured pattern has no literal hint: every text goes to the rules.
    configured = Redactor.create([r"hunter\d"])
    assert configured._gate is None
    assert not configured._quiet("plain words", _lowered("plain words"))
    assert configured.text("my hunter2 pass").text == "my [REDACTED:configured] pass"
