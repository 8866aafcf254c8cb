"""The one converter, canonical JSON, and digests.

Policies of :func:`make_converter`:

- datetimes are timezone-aware UTC and are written as RFC 3339 strings with a ``Z`` suffix
  and microsecond precision (``2026-12-02T10:27:40.123456Z``); naive datetimes are refused;
- enums are written by value;
- bytes are not part of the model (payload bytes never leave the journal layer);
- tuples are written as JSON arrays and read back as tuples;
- unions of attrs classes that carry a ``kind`` (parts) or ``type`` (events) literal field are
  written with that field and read back through it (a closed tagged union);
- ``None`` fields are written as ``null``: an unknown value stays visibly unknown;
- extra keys are refused when reading (a typo is an error, not a silently ignored field).

Canonical JSON is the digest form: sorted keys, UTF-8, no insignificant whitespace, no NaN.
"""

from __future__ import annotations

import functools
import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import cattrs
from cattrs.preconf.json import make_converter as _make_json_converter

from braid_actors.errors import BadRequest

DIGEST_PREFIX = "sha256:"
_isoformat = datetime.isoformat


def canonical_json(value: Any) -> bytes:
    """Return the canonical UTF-8 JSON bytes of a JSON-compatible value."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def digest_bytes(data: bytes) -> str:
    """``sha256:<hex>`` of raw bytes."""
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()


def digest(value: Any) -> str:
    """``sha256:<hex>`` of the canonical JSON of a JSON-compatible value."""
    return digest_bytes(canonical_json(value))


def is_digest(value: object) -> bool:
    """True when ``value`` has the ``sha256:<64 lowercase hex>`` form."""
    if not isinstance(value, str) or not value.startswith(DIGEST_PREFIX):
        return False
    hexpart = value[len(DIGEST_PREFIX) :]
    return len(hexpart) == 64 and all(c in "0123456789abcdef" for c in hexpart)


def format_time(value: datetime) -> str:
    """RFC 3339 UTC with microseconds and ``Z``."""
    if value.tzinfo is UTC and value.year >= 1000:
        # the hot path (every event has a time): "+00:00" cut off, no copy of the value
        return _isoformat(value, "T", "microseconds")[:-6] + "Z"
    if value.tzinfo is None:
        raise ValueError("naive datetimes are not allowed; use UTC")
    utc = value if value.tzinfo is UTC else value.astimezone(UTC)
    if utc.year < 1000:  # isoformat pads the year to 4 digits, strftime does not
        return utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    # isoformat is several times faster than strftime, and the same for years >= 1000
    return utc.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def parse_time(value: str) -> datetime:
    """Parse an RFC 3339 timestamp into an aware UTC datetime."""
    text = value[:-1] + "+00:00" if value.endswith("Z") else value
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        raise ValueError(f"timestamp {value!r} has no UTC offset")
    return parsed.astimezone(UTC)


def make_converter() -> cattrs.Converter:
    """Build the project's converter (see the module docstring for its policies)."""
    conv = _make_json_converter(forbid_extra_keys=True)
    conv.register_unstructure_hook(datetime, format_time)
    conv.register_structure_hook(datetime, lambda v, _t: parse_time(v))
    _configure_unions(conv)
    return conv


@functools.cache
def converter() -> cattrs.Converter:
    """The shared converter instance (built once)."""
    return make_converter()


def structure_error(exc: BaseException) -> BadRequest:
    """Translate a cattrs/validation failure into a ``BadRequest`` naming paths, not values."""
    problems = (
        cattrs.transform_error(exc)
        if isinstance(exc, cattrs.BaseValidationError)
        else [type(exc).__name__]
    )
    return BadRequest(
        "parameters do not match the expected shape", details={"problems": problems[:20]}
    )


def _configure_unions(conv: cattrs.Converter) -> None:
    # Imported here: the entity modules import nothing from this module, and keeping the
    # union wiring in one place makes the converter's policies readable top to bottom.
    from braid_actors.model._events import EVENT_TYPES, Event
    from braid_actors.model._parts import PART_TYPES, Part

    def structure_part(value: Any, _t: Any) -> Any:
        if not isinstance(value, dict) or value.get("kind") not in PART_TYPES:
            raise ValueError("a part needs a known 'kind'")
        return conv.structure(value, PART_TYPES[value["kind"]])

    def structure_event(value: Any, _t: Any) -> Any:
        if not isinstance(value, dict) or value.get("type") not in EVENT_TYPES:
            raise ValueError("an event needs a known 'type'")
        return conv.structure(value, EVENT_TYPES[value["type"]])

    conv.register_structure_hook_func(lambda t: t == Part, structure_part)
    conv.register_structure_hook_func(lambda t: t == Event, structure_event)
