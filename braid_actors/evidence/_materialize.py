"""Turning a parser's drafts into stored entries: redaction, policy, objects, identities.

For each draft: the execution scope comes from its line's offset and the resume boundary;
its bodies (``content``, the line's ``raw_content``, a Claude ``intent_content``) are
redacted, then either stored as objects (``state: stored``, ``ref`` = ``sha256:`` of the
redacted bytes), omitted by the capture policy (``state: omitted``, with the length and
digest of the pre-redaction input and its ``digest_scope``), or unavailable (over the
32 MiB object limit: ``capture_limit``, counted ``truncated``). Every string copied from a
source into an entry or a source record (ids, names, paths, versions) is redacted too.

Identities: ``Source.id`` = ``src_`` + digest of (run, harness, file, session);
``source_key`` = ``<source id>:<line>:<ordinal>``; ``Entry.id`` = ``ctx_`` + 16 hex of the
digest of (run, source id) + ``_<line>_<ordinal>`` (:func:`source_entry_id`), so a source's
entries are neighbours in every index keyed by entry id; a run recorded before schema 3
keeps ``ctx_`` + digest of (run, source key) (:func:`entry_id`) for all its entries.
``object_hash`` is the digest of the entry without ``object_hash``, ``created_at`` and
``source`` (which it names by ``source_id``), so an unchanged record re-ingested has the
same hash (a duplicate) and a changed one becomes a new revision.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from json.encoder import encode_basestring
from typing import TYPE_CHECKING, Any, Final

import attrs
import orjson

from braid_actors.model import digest

from ._objects import MAX_OBJECT_BYTES, ref_of
from ._parsed import Line
from ._policy import CapturePolicy
from ._redact import Redactor

if TYPE_CHECKING:
    from ._parsed import Content, Draft, Outcome, SessionInfo

SCHEMA: Final = "agentprovenance.agent_context/v1"
PRIOR: Final = "prior_context"
CURRENT: Final = "current_execution"


# Encoders built once (``json.dumps`` with options builds one per call): _CANONICAL has
# exactly the options of ``model.canonical_json``, _COMPACT those objects were encoded with.
_CANONICAL: Final = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
)
_COMPACT: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def object_digest(value: Any) -> str:
    """``model.digest`` of a JSON value (the same canonical bytes, the same hash)."""
    return "sha256:" + hashlib.sha256(_CANONICAL.encode(value).encode("utf-8")).hexdigest()


def floatless_digest(value: Any) -> str:
    """:func:`object_digest` of a JSON value that holds no float, by orjson.

    Without floats orjson's sorted compact encoding is the canonical bytes: the same string
    escapes for every code point, keys sorted by code point (UTF-8 bytes sort the same way).
    What orjson refuses (integers beyond 64 bits, lone surrogates, deep nesting) goes to
    :func:`object_digest`, which encodes (or fails) as before.
    """
    try:
        data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return object_digest(value)
    return "sha256:" + hashlib.sha256(data).hexdigest()


def holds_float(value: Any) -> bool:
    """Whether a JSON value holds a float anywhere (iteratively: no depth limit)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def compact_json(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, separators=(",", ":"))``, by orjson where
    that gives the same text: a value without floats (orjson writes some exponents and NaN
    differently), and where orjson accepts it (what it refuses, integers beyond 64 bits,
    lone surrogates, keys that are not strings, deep nesting, goes to json, which encodes
    or fails as before). A walk for floats costs a fraction of json's encoding, which
    escapes every string in Python's encoder."""
    if not holds_float(value):
        try:
            return orjson.dumps(value).decode("utf-8")
        except orjson.JSONEncodeError:
            pass
    return _COMPACT.encode(value)


_STORED: Final = json.JSONEncoder(ensure_ascii=False, sort_keys=True)
"""The stored text of an entry body that may hold a float (``json.dumps(body,
ensure_ascii=False, sort_keys=True)``)."""


def entry_text(body: dict[str, Any]) -> str:
    """The text an entry body is stored as: read back by ``json.loads`` it is ``body``.

    A body without session metadata holds no float (see :meth:`Materializer.entry`), so
    orjson's sorted encoding reads back as the same value, with its keys in the same order
    (code point order); what orjson refuses (integers beyond 64 bits, lone surrogates) and
    bodies with session metadata (floats: NaN, which orjson writes as null) take ``json``.
    """
    if "session_metadata" not in body:
        try:
            return orjson.dumps(body, option=orjson.OPT_SORT_KEYS).decode("utf-8")
        except orjson.JSONEncodeError:
            pass
    return _STORED.encode(body)


def _short(value: Any, size: int = 32) -> str:
    return digest(value)[len("sha256:") :][:size]


def source_id(run_id: str, harness: str, path_key: str, session_id: str) -> str:
    return "src_" + _short([run_id, harness, path_key, session_id], 24)


def source_entry_id(prefix: str, line: int, ordinal: int) -> str:
    """The id of a source's entry: ``prefix`` (:func:`entry_id_prefix` of the source) and
    its place in the file.

    Every entry id of a file shares the prefix, so the entries and links a pass writes land
    together in the indexes keyed by entry id (``entries_id``, the links' primary key). With
    a digest per entry each landed on a page of its own: a commit wrote one page per entry
    and per link, more as the run grew (Claude Code files of the evidence bench, one run:
    50 to 164 pages of 16 KiB per file, 809 MB of WAL for a 100 MB database).
    """
    return f"{prefix}{line}_{ordinal}"


def entry_id_prefix(run_id: str, source_id: str) -> str:
    """``ctx_`` + 16 hex of the digest of (run, source id) + ``_``: 64 bits, which the run's
    sources do not share (a collision among a run's sources would need about 2**32 of them)."""
    return "ctx_" + _short([run_id, source_id], 16) + "_"


def entry_id(run_id: str, source_key: str) -> str:
    """The entry id of a run recorded before schema 3 (``_schema.ENTRY_IDS``)."""
    # The canonical JSON of the pair, spelled out: the same bytes ``digest`` hashes (json's
    # own string encoder), without a general encoder call per entry.
    pair = "[" + encode_basestring(run_id) + "," + encode_basestring(source_key) + "]"
    return "ctx_" + hashlib.sha256(pair.encode("utf-8")).hexdigest()[:32]


@attrs.frozen
class EntryRow:
    """One entry ready to be written."""

    id: str
    session: str
    source_key: str
    sequence: int
    ordinal: int
    kind: str
    tool_call_id: str | None
    scope: str
    content_ref: str | None
    raw_ref: str | None
    intent_ref: str | None
    object_hash: str
    body: dict[str, Any]
    """The Entry wire object without ``source``."""


@attrs.define(eq=False)
class Materializer:
    """Materializes one file's drafts for one run."""

    run_id: str
    path_key: str
    policy: CapturePolicy
    redactor: Redactor
    boundary: int
    lines: dict[int, Line]
    objects_written: dict[str, tuple[int, str, bool]] = attrs.Factory(dict)
    pending: dict[str, bytes] = attrs.Factory(dict)
    """Bodies to write with the pass's rows (by ref)."""
    omissions: dict[tuple[str, str], Counter[str]] = attrs.Factory(dict)
    truncated: Counter[tuple[str, str]] = attrs.Factory(Counter)
    _raw: dict[int, dict[str, Any]] = attrs.Factory(dict)

    def scope_of(self, line: int) -> str:
        return PRIOR if self.lines[line].start < self.boundary else CURRENT

    def source(self, outcome: Outcome, info: SessionInfo) -> dict[str, Any]:
        """The Source wire object of one session of the file."""
        clean = self.redactor.clean
        session_id = clean(info.session_id)
        body: dict[str, Any] = {
            "id": source_id(self.run_id, outcome.harness, self.path_key, session_id),
            "harness": outcome.harness,
            "channel": "transcript",
            "session_id": session_id,
            "path": clean(self.path_key),
            "parser_version": outcome.parser_version,
            "format_version": outcome.format_version,
            "binding": "explicit",
            "binding_evidence": ["caller_run_id", *(clean(e) for e in info.evidence)],
        }
        for key, value in (
            ("parent_session_id", info.parent_session_id),
            ("agent_id", info.agent_id),
            ("application_version", info.application_version),
            ("workdir", info.workdir),
        ):
            if value:
                body[key] = clean(value)
        return body

    def omit(self, session: str, scope: str, category: str) -> None:
        counts = self.omissions.get((session, scope))
        if counts is None:
            counts = self.omissions[(session, scope)] = Counter()
        counts[category] += 1

    def entry(
        self, draft: Draft, source: dict[str, Any], ids: dict[tuple[int, int], str]
    ) -> EntryRow | None:
        """The row of ``draft``, or null when the policy keeps no record of it (history)."""
        scope = self.scope_of(draft.line)
        if scope == PRIOR and not self.policy.history:
            self.omit(draft.session, scope, "history")
            return None
        clean = self.redactor.clean
        source_key = f"{source['id']}:{draft.line}:{draft.ordinal}"
        omit_content = (draft.kind == "tool_result" and not self.policy.tool_results) or (
            draft.kind == "configuration" and not self.policy.configuration
        )
        content = self._content(draft.content, omit_content, draft, scope, "parsed_content")
        if omit_content:
            category = "tool_result" if draft.kind == "tool_result" else "configuration"
            self.omit(draft.session, scope, category)
        raw = self._raw_ref(draft, scope)
        body: dict[str, Any] = {
            "schema_version": SCHEMA,
            "id": ids[draft.key],
            "run_id": self.run_id,
            "source_key": source_key,
            "sequence": draft.line,
            "source_ordinal": draft.ordinal,
            "execution_scope": scope,
            "kind": draft.kind,
            "status": clean(draft.status),
            "content": content,
            "raw_content": raw,
        }
        for key, value in (
            ("role", draft.role),
            ("agent_id", draft.agent_id),
            ("tool_call_id", draft.tool_call_id),
            ("tool_name", draft.tool_name),
            ("recorded_at", draft.recorded_at),
        ):
            if value:
                body[key] = clean(value)
        intent_ref = None
        if draft.intent is not None and raw.get("state") != "stored":
            intent = self._store_json(draft.intent)
            intent["reason"] = "derived_intent_projection"
            body["intent_content"] = intent
            intent_ref = intent.get("ref")
        if draft.session_metadata is not None:
            body["session_metadata"] = self.redactor.value(draft.session_metadata)[0]
        if draft.missing_fields:
            body["missing_fields"] = list(draft.missing_fields)
        refs = [ids[key] for key in draft.refs if key in ids]
        if refs:
            body["evidence_refs"] = refs
        # The body has no object_hash or created_at yet: the hashed object is the body with
        # its source named by id.
        hashed = dict(body, source_id=source["id"])
        # Only session metadata (a record's own values) can hold a float; every other part
        # of the body is strings, integers, booleans and nulls.
        if draft.session_metadata is None:
            object_hash = floatless_digest(hashed)
        else:
            object_hash = object_digest(hashed)
        body["object_hash"] = object_hash
        return EntryRow(
            id=ids[draft.key],
            session=draft.session,
            source_key=source_key,
            sequence=draft.line,
            ordinal=draft.ordinal,
            kind=draft.kind,
            tool_call_id=body.get("tool_call_id"),
            scope=scope,
            content_ref=content.get("ref"),
            raw_ref=raw.get("ref"),
            intent_ref=intent_ref,
            object_hash=object_hash,
            body=body,
        )

    # ---- bodies ----------------------------------------------------------------------

    def _content(
        self, content: Content | None, omit: bool, draft: Draft, scope: str, digest_scope: str
    ) -> dict[str, Any]:
        if content is None:
            return {
                "bytes": None,
                "redacted": False,
                "state": "unavailable",
                "reason": "source_not_recorded",
            }
        if content.value is None:
            return {
                "bytes": None,
                "media_type": content.media_type,
                "redacted": False,
                "state": "unavailable",
                "reason": content.reason or "source_not_recorded",
            }
        if isinstance(content.value, str):
            original = content.value.encode("utf-8")
            if omit:
                return _omitted(original, content.media_type, digest_scope)
            result = self.redactor.text(content.value)
            return self._put(
                result.text.encode("utf-8"), content.media_type, result.redacted, draft, scope
            )
        encoded = compact_json(content.value)
        original = encoded.encode("utf-8")  # (a lone surrogate fails here, as it always did)
        if omit:
            return _omitted(original, content.media_type, digest_scope)
        return self._store_json(content.value, draft, scope, encoded)

    def _store_json(
        self,
        value: Any,
        draft: Draft | None = None,
        scope: str = CURRENT,
        encoded: str | None = None,
    ) -> dict[str, Any]:
        """Store ``value`` as redacted JSON; ``encoded`` is its compact encoding when the
        caller has it already (:func:`compact_json` of ``value``)."""
        if encoded is None:
            encoded = compact_json(value)
        text = self.redactor.json_text(value, encoded)
        return self._put(text.text.encode("utf-8"), "application/json", text.redacted, draft, scope)

    def _put(
        self, data: bytes, media_type: str, redacted: bool, draft: Draft | None, scope: str
    ) -> dict[str, Any]:
        if len(data) > MAX_OBJECT_BYTES:
            if draft is not None:
                self.truncated[(draft.session, scope)] += 1
            return {
                "bytes": len(data),
                "media_type": media_type,
                "redacted": redacted,
                "state": "unavailable",
                "reason": "capture_limit",
            }
        ref = ref_of(data)
        if ref not in self.objects_written:
            self.objects_written[ref] = (len(data), media_type, redacted)
            self.pending[ref] = data
        return {
            "ref": ref,
            "bytes": len(data),
            "sha256": ref[len("sha256:") :],
            "media_type": media_type,
            "redacted": redacted,
            "state": "stored",
        }

    def _raw_ref(self, draft: Draft, scope: str) -> dict[str, Any]:
        if not self.policy.source_records:
            self.omit(draft.session, scope, "source_records")
        cached = self._raw.get(draft.line)
        if cached is None:
            line = self.lines[draft.line]
            if self.policy.source_records:
                cached = self._store_json(line.obj, draft, scope)
            else:
                cached = _omitted(line.raw, "application/json", "source_record")
            self._raw[draft.line] = cached
        return cached


def _omitted(original: bytes, media_type: str, digest_scope: str) -> dict[str, Any]:
    return {
        "bytes": len(original),
        "sha256": hashlib.sha256(original).hexdigest(),
        "media_type": media_type,
        "redacted": False,
        "state": "omitted",
        "reason": "capture_policy",
        "digest_scope": digest_scope,
    }
