"""Redaction: secrets are replaced before anything is hashed, stored or shown.

Every body the evidence store writes passes through :meth:`Redactor.text` (strings) or
:meth:`Redactor.value` (parsed JSON, every string value and key). A match is replaced by
``[REDACTED:<kind>]``, a marker with no quotes or backslashes, so redacting JSON text keeps
it valid JSON. Objects are addressed by the digest of the *redacted* bytes, so the same
secret never yields a reference that could confirm a guess at it.

Built-in kinds: Anthropic / OpenAI style ``sk-`` keys, AWS access key ids and secret
assignments, GitHub, GitLab, Slack, Stripe and Google API tokens, JSON web tokens, bearer and
basic ``Authorization`` credentials, credentials in URLs, PEM private key blocks (also when
the end marker is missing), and ``key = value`` assignments whose name says secret and whose
value looks like one. Callers add their own regular expressions (kind ``configured``).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Final

import attrs

from braid_actors.errors import EvidenceInvalidArgument

if TYPE_CHECKING:
    from collections.abc import Sequence

_SECRET_NAME = (
    r"(?:api[_-]?key|apikey|secret(?:[_-]?key)?|client[_-]?secret|access[_-]?token|"
    r"auth[_-]?token|refresh[_-]?token|private[_-]?key|password|passwd|credentials?)"
)

BUILTIN_PATTERNS: Final[tuple[tuple[str, str], ...]] = (
    (
        "pem_private_key",
        r"(?s)-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?"
        r"(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
    ),
    ("anthropic_key", r"sk-ant-[A-Za-z0-9_\-]{16,}"),
    ("openai_key", r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}"),
    ("aws_access_key_id", r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b"),
    (
        "aws_secret_access_key",
        r"(?i)(?P<keep>aws_secret_access_key[\"']?\s*[:=]\s*[\"']?)[A-Za-z0-9/+=]{40,}",
    ),
    ("github_token", r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})"),
    ("gitlab_token", r"\bglpat-[A-Za-z0-9_\-]{20,}"),
    ("slack_token", r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"),
    ("stripe_key", r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}"),
    ("google_api_key", r"\bAIza[0-9A-Za-z_\-]{35}"),
    ("jwt", r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),
    ("bearer_token", r"(?i)(?P<keep>\bbearer[ \t]+)[A-Za-z0-9._~+/\-]{8,}=*"),
    ("basic_credentials", r"(?i)(?P<keep>\bbasic[ \t]+)[A-Za-z0-9+/]{12,}={0,2}(?![A-Za-z0-9])"),
    ("url_credentials", r"(?P<keep>://[^\s/:@\"'\\]+:)[^\s/@\"'\\]+(?=@)"),
    (
        "secret_assignment",
        r"(?i)(?P<keep>(?<![A-Za-z0-9])" + _SECRET_NAME + r"[\"']?\s*[:=]\s*[\"']?)"
        r"(?=[A-Za-z0-9_\-+/=.]*[0-9])(?=[A-Za-z0-9_\-+/=.]*[A-Za-z])[A-Za-z0-9_\-+/=.]{12,}",
    ),
)


# Literals at least one of which every match of the built-in rule contains (matched with the
# rule's own case flag; case-folded literals are lowercase), so a string without any of them
# is skipped without running the rule.
_HINTS: Final[dict[str, tuple[tuple[str, ...], bool]]] = {
    "pem_private_key": (("PRIVATE KEY",), False),
    "anthropic_key": (("sk-ant-",), False),
    "openai_key": (("sk-",), False),
    "aws_access_key_id": (("AKIA", "ASIA", "AGPA", "AIDA", "AROA", "ANPA", "ANVA", "AIPA"), False),
    "aws_secret_access_key": (("aws_secret_access_key",), True),
    "github_token": (("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"), False),
    "gitlab_token": (("glpat-",), False),
    "slack_token": (("xox",), False),
    "stripe_key": (("_live_", "_test_"), False),
    "google_api_key": (("AIza",), False),
    "jwt": (("eyJ",), False),
    "bearer_token": (("bearer",), True),
    "basic_credentials": (("basic",), True),
    "url_credentials": (("://",), False),
    # Every name of _SECRET_NAME spelled out up to its first optional part (a bare "token"
    # would match every usage record's "input_tokens").
    "secret_assignment": (
        (
            "api",
            "secret",
            "access_token",
            "access-token",
            "accesstoken",
            "auth_token",
            "auth-token",
            "authtoken",
            "refresh_token",
            "refresh-token",
            "refreshtoken",
            "private",
            "passw",
            "credential",
        ),
        True,
    ),
}

# Per built-in rule: the most characters a match's start can precede the hint literal the
# match contains (every ``secret_assignment`` name starts with its literal, but for
# ``client_secret``, 7 characters before ``secret``; ``stripe_key``'s ``sk_`` precedes
# ``_live_``). A rule listed here is tried only at those few offsets before each occurrence
# of its literals, instead of at every offset of the text; ``pem_private_key`` (any number
# of characters before ``PRIVATE KEY``) and configured rules are searched throughout.
_LEADS: Final[dict[str, int]] = {
    "anthropic_key": 0,
    "openai_key": 0,
    "aws_access_key_id": 0,
    "aws_secret_access_key": 0,
    "github_token": 0,
    "gitlab_token": 0,
    "slack_token": 0,
    "stripe_key": 2,
    "google_api_key": 0,
    "jwt": 0,
    "bearer_token": 0,
    "basic_credentials": 0,
    "url_credentials": 0,
    "secret_assignment": 7,
}

# Per case-folding built-in rule: a word several of its literals contain. Those literals are
# looked for only in a text that holds the word (one scan instead of one per literal: nine of
# ``secret_assignment``'s fourteen end in "token", which most long texts don't contain); the
# answer is the same, since a text without the word holds none of them.
_GATES: Final[dict[str, str]] = {"secret_assignment": "token"}

_MEMO_MAX_CHARS: Final = 256
"""Strings up to this length are remembered with their result (ids, keys, names repeat)."""
_MEMO_MAX_ENTRIES: Final = 65_536


_FOLDS_INTO_ASCII: Final = ("\u0130", "\u0131", "\u017f", "\u212a")
"""The only non-ASCII characters the regex engine's case folding matches to ASCII ones
(dotted capital I, dotless i, long s, Kelvin sign; found by trying every code point, which a
test does again)."""


def _lowered(value: str) -> str | None:
    """``value.lower()`` when ``literal in value.lower()`` is exactly whether the case-folding
    hint regex of an ASCII ``literal`` finds it in ``value``, else null.

    That holds for ASCII text (lowering is the engine's folding there), and for any text
    without :data:`_FOLDS_INTO_ASCII`: a case-folded match of an ASCII literal is then a run
    of ASCII characters, which ``lower()`` maps one to one onto the literal, and no other
    character lowers to ASCII. The regex on long non-ASCII text costs about 20 times the
    ``in`` checks.
    """
    if not value.isascii():
        for char in _FOLDS_INTO_ASCII:
            if char in value:
                return None
    return value.lower()


def _hint(kind: str) -> re.Pattern[str]:
    literals, fold = _HINTS[kind]
    return re.compile("|".join(map(re.escape, literals)), re.IGNORECASE if fold else 0)


@attrs.frozen
class _Rule:
    kind: str
    pattern: re.Pattern[str]
    hint: re.Pattern[str] | None = None
    literals: tuple[str, ...] = ()
    fold: bool = False
    lead: int | None = None
    """See :data:`_LEADS`; null: the rule is searched at every offset."""
    gate: str | None = None
    """See :data:`_GATES` (case-folding rules only)."""
    _ungated: tuple[str, ...] = attrs.field(init=False)
    _gated: tuple[str, ...] = attrs.field(init=False)

    @_ungated.default
    def _literals_without_gate(self) -> tuple[str, ...]:
        gate = self.gate
        return self.literals if gate is None else tuple(x for x in self.literals if gate not in x)

    @_gated.default
    def _literals_with_gate(self) -> tuple[str, ...]:
        gate = self.gate
        return () if gate is None else tuple(x for x in self.literals if gate in x)

    def may_match(self, value: str, lowered: str | None) -> bool:
        """False only when no match of the rule can occur in ``value``.

        ``lowered`` is :func:`_lowered` of ``value``: its ``lower()`` when that finds every
        case-folded occurrence of an ASCII literal, else null (the hint regex decides).
        """
        if self.hint is None:
            return True
        if not self.fold:
            # Case-sensitive: ``in`` for one literal; for several, the hint regex finds any
            # of them in one pass (the same answer, several times faster than one ``in`` each).
            if len(self.literals) == 1:
                return self.literals[0] in value
            return self.hint.search(value) is not None
        if lowered is None:
            return self.hint.search(value) is not None
        if any(literal in lowered for literal in self._ungated):
            return True
        gate = self.gate
        return gate is not None and gate in lowered and any(x in lowered for x in self._gated)

    def substitute(self, value: str, lowered: str | None = None) -> tuple[str, int]:
        """``pattern.subn`` with the rule's marker (``lowered`` as for :meth:`may_match`)."""
        marker = f"[REDACTED:{self.kind}]"
        keep = "keep" in self.pattern.groupindex  # the name or scheme stays readable
        starts = self._starts(value, lowered)
        if starts is None:
            if keep:
                return self.pattern.subn(lambda m: (m.group("keep") or "") + marker, value)
            return self.pattern.subn(marker, value)
        # The same matches subn finds: it takes the leftmost match at or after the end of
        # the previous one, and every match starts at one of ``starts`` (no rule matches
        # the empty string, and ``match`` at an offset sees the text before it, as the
        # lookbehinds and word boundaries need).
        parts: list[str] = []
        done = 0
        for start in starts:
            if start < done:
                continue
            found = self.pattern.match(value, start)
            if found is None:
                continue
            parts.append(value[done : found.start()])
            parts.append((found.group("keep") or "") + marker if keep else marker)
            done = found.end()
        if not parts:
            return value, 0
        parts.append(value[done:])
        return "".join(parts), (len(parts) - 1) // 2

    def _starts(self, value: str, lowered: str | None) -> list[int] | None:
        """Every offset where a match can start, in order; null when unknown."""
        if self.lead is None or self.hint is None:
            return None
        if self.fold:
            if lowered is None:
                return None  # (case folding that lower() does not see)
            text = lowered  # the same offsets: _lowered keeps every character one character
        else:
            text = value
        found: set[int] = set()
        for literal in self.literals:
            at = text.find(literal)
            while at >= 0:
                found.update(range(max(0, at - self.lead), at + 1))
                at = text.find(literal, at + 1)
        return sorted(found)


_BUILTIN: Final = tuple(
    _Rule(kind, re.compile(source), _hint(kind), *_HINTS[kind], _LEADS.get(kind), _GATES.get(kind))
    for kind, source in BUILTIN_PATTERNS
)


@attrs.frozen
class _Gate:
    """Literals such that no rule may match a text holding none of them: one pass that rules
    every rule out at once (most texts hold no hint at all: 96% of the strings and JSON
    texts of the fixtures), instead of each rule's own check.

    A rule's :meth:`_Rule.may_match` says yes only when the text holds one of its literals
    (case-sensitive rules: looked for as they are, several at once by the rule's hint
    regex) or its lowered text does (case-folding ones; a gated literal holds its gate).
    A literal holding another one of its kind is left out (the shorter one is found wherever
    the longer one is), and so is a case-sensitive literal whose lowercase holds a folded one
    (``_lowered`` keeps every character one character, so it holds that lowercase).
    """

    folded: tuple[str, ...]
    """Lowercase literals looked for in the lowered text."""
    exact: tuple[str, ...]
    """Literals looked for in the text as it is."""
    patterns: tuple[re.Pattern[str], ...]
    """Hint regexes of the case-sensitive rules with several literals."""

    @classmethod
    def of(cls, rules: Sequence[_Rule]) -> _Gate | None:
        """The gate of ``rules``; null when one has no literal hint (a configured one)."""
        folded: set[str] = set()
        exact: set[str] = set()
        patterns: list[re.Pattern[str]] = []
        for rule in rules:
            if rule.hint is None:
                return None
            if rule.fold:
                literals = rule.literals if rule.gate is None else (*rule._ungated, rule.gate)
                folded.update(literal.lower() for literal in literals)
            elif len(rule.literals) == 1:
                exact.add(rule.literals[0])
            else:
                patterns.append(rule.hint)
        folded = {x for x in folded if not any(y != x and y in x for y in folded)}
        exact = {
            x
            for x in exact
            if not any(y != x and y in x for y in exact) and not any(y in x.lower() for y in folded)
        }
        return cls(tuple(sorted(folded)), tuple(sorted(exact)), tuple(patterns))

    def quiet(self, value: str, lowered: str | None) -> bool:
        """True when no rule may match ``value`` (``lowered``: its :func:`_lowered`)."""
        if lowered is None:
            return False  # (case folding that lower() does not see: the rules decide)
        # Plain loops: most texts are short (median 29 characters in the fixtures), where
        # a generator per tuple cost 2.4 us a text against 1.6.
        for literal in self.folded:
            if literal in lowered:
                return False
        for literal in self.exact:
            if literal in value:
                return False
        for pattern in self.patterns:  # noqa: SIM110
            if pattern.search(value) is not None:
                return False
        return True


@attrs.frozen
class Redacted:
    """A redacted string and whether anything was replaced."""

    text: str
    redacted: bool


@attrs.define(eq=False)
class Redactor:
    """Applies the built-in rules plus configured regular expressions.

    Results of short strings are remembered (in memory only, for the redactor's lifetime):
    redaction is a pure function of the string, so a remembered result is the result.
    """

    rules: tuple[_Rule, ...]
    _memo: dict[str, Redacted] = attrs.field(factory=dict, init=False)
    _gate: _Gate | None = attrs.field(init=False)
    _none: tuple[bool, ...] = attrs.field(init=False)

    @_gate.default
    def _gate_default(self) -> _Gate | None:
        return _Gate.of(self.rules)

    @_none.default
    def _none_default(self) -> tuple[bool, ...]:
        return (False,) * len(self.rules)

    @classmethod
    def create(cls, patterns: Sequence[str] = ()) -> Redactor:
        """A redactor with the built-in rules and ``patterns`` (kind ``configured``)."""
        configured: list[_Rule] = []
        for number, source in enumerate(patterns, start=1):
            try:
                configured.append(_Rule("configured", re.compile(source)))
            except re.error:
                raise EvidenceInvalidArgument(
                    "a configured redaction pattern is not a valid regular expression",
                    details={"pattern_index": number},
                ) from None
        return cls(rules=(*_BUILTIN, *configured))

    def candidates(self, value: str) -> tuple[bool, ...]:
        """Per rule: whether it may match somewhere in ``value`` (if not, it leaves ``value``
        and every substring of it unchanged)."""
        lowered = _lowered(value)
        if self._quiet(value, lowered):
            return self._none
        return tuple(rule.may_match(value, lowered) for rule in self.rules)

    def _quiet(self, value: str, lowered: str | None) -> bool:
        gate = self._gate
        return gate is not None and gate.quiet(value, lowered)

    def text(self, value: str) -> Redacted:
        """Redact one string."""
        short = len(value) <= _MEMO_MAX_CHARS
        if short:
            known = self._memo.get(value)
            if known is not None:
                return known
        result = self._run(value, None)
        if short:
            if len(self._memo) >= _MEMO_MAX_ENTRIES:
                self._memo.clear()
            self._memo[value] = result
        return result

    def _run(self, value: str, allowed: tuple[bool, ...] | None) -> Redacted:
        """Apply the rules in order, each only when its hint occurs in the current text.

        ``allowed`` (from :meth:`candidates` of a text containing ``value``) may rule a hint
        out in advance; that holds only while ``value`` is unchanged, since a replacement
        marker can bring a hint in, so after the first replacement every rule is checked.
        """
        lowered = _lowered(value)
        if self._quiet(value, lowered):
            return Redacted(value, False)
        changed = False
        for index, rule in enumerate(self.rules):
            if allowed is not None and not changed and not allowed[index]:
                continue
            if not rule.may_match(value, lowered):
                continue
            value, count = rule.substitute(value, lowered)
            if count:
                changed = True
                lowered = _lowered(value)
        return Redacted(value, changed)

    def clean(self, value: str) -> str:
        """Redact one string and return the text only."""
        return self.text(value).text

    def value(self, value: Any) -> tuple[Any, bool]:
        """Redact every string (keys included) inside a parsed JSON value."""
        return self._value(value, None)

    def json_text(self, value: Any, encoded: str) -> Redacted:
        """The redacted JSON text of ``value``, whose compact encoding is ``encoded``.

        The same as redacting every string and key of ``value``, encoding the result and
        redacting that text (a secret can span a key and its value), but cheaper: a rule
        whose literal hint is absent from ``encoded`` is absent from every string inside it
        too (encoding only escapes quotes, backslashes and control characters, which no hint
        contains), so it is not tried on them; and when no string changes, the encoding is
        reused instead of encoding again.
        """
        allowed = self.candidates(encoded)
        if not any(allowed):
            return Redacted(encoded, False)
        clean, hit = self._value(value, allowed)
        if not hit:
            return self._run(encoded, allowed)
        return Redacted(self.text(_compact(clean)).text, True)

    def _value(self, value: Any, allowed: tuple[bool, ...] | None) -> tuple[Any, bool]:
        if isinstance(value, str):
            if allowed is None or len(value) <= _MEMO_MAX_CHARS:
                result = self.text(value)  # remembered: keys and short values repeat
            else:
                result = self._run(value, allowed)
            return result.text, result.redacted
        if isinstance(value, list):
            changed = False
            items: list[Any] = []
            for item in value:
                clean, hit = self._value(item, allowed)
                items.append(clean)
                changed = changed or hit
            return items, changed
        if isinstance(value, dict):
            changed = False
            mapping: dict[str, Any] = {}
            for key, item in value.items():
                clean_key, key_hit = self._value(str(key), allowed)
                clean, hit = self._value(item, allowed)
                mapping[clean_key] = clean
                changed = changed or hit or key_hit
            return mapping, changed
        return value, False


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
