"""The records the journal stores and hands back.

These are plain frozen values. ``data`` and ``result`` mappings are JSON-compatible and are
treated as immutable once handed to the journal: the journal keeps a reference to the mapping
it was given (it does not deep-copy it) and hands that same mapping to the admission, to
subscribers and back to the producer.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import attrs


def _non_empty(_instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{attribute.name} must be a non-empty string")


@attrs.frozen
class NewRecord:
    """A record to append; the journal assigns its sequence number and time."""

    stream: str = attrs.field(validator=_non_empty)
    """The stream the record belongs to, for example ``conversation:c_1``."""
    type: str = attrs.field(validator=_non_empty)
    """The record type, for example ``message_added``."""
    data: Mapping[str, Any]
    """JSON-compatible payload; encrypted at rest."""


@attrs.frozen
class CommittedRecord:
    """A record that is durable in the journal."""

    seq: int
    """Position in the journal, contiguous from 1."""
    stream: str
    """The stream the record belongs to."""
    type: str
    """The record type."""
    data: Mapping[str, Any]
    """The decrypted JSON-compatible payload."""
    committed_at: datetime
    """UTC time of the transaction that committed the record."""
    hash: str
    """``sha256:<hex>`` link of the hash chain ending at this record."""


@attrs.frozen
class Operation:
    """An idempotency ledger entry: the outcome recorded for one operation id."""

    op_id: str = attrs.field(validator=_non_empty)
    """Caller-chosen operation identifier, unique across the journal."""
    command: str = attrs.field(validator=_non_empty)
    """The command that ran under this id."""
    params_digest: str = attrs.field(validator=_non_empty)
    """``sha256:`` digest of the canonical command parameters."""
    result: Mapping[str, Any]
    """JSON-compatible result returned to every retry with the same parameters."""


@attrs.frozen
class AppendResult:
    """The journal actor's answer to one append request."""

    records: tuple[CommittedRecord, ...]
    """The records this request committed; empty for a duplicate."""
    result: Mapping[str, Any] | None
    """The operation's recorded result, or ``None`` when the request carried no operation."""
    duplicate: bool
    """True when the operation was already recorded and nothing was written."""
