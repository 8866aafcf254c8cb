"""Canonical JSON, digests and RFC 3339 times: what the digest form and every record need,
without the converter (cattrs), so a process that only hashes and stamps imports little.

Canonical JSON is the digest form: sorted keys, UTF-8, no insignificant whitespace, no NaN.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

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
