"""The encrypted journal: the only durable state, and the actor that writes it.

- :class:`Journal` is the synchronous store (SQLite in WAL mode through sqlite-utils,
  AES-GCM payloads, a hash chain, snapshots, the operation ledger).
- :func:`run_journal` is the journal actor; its :class:`JournalHandle` is how every other
  actor appends, with an acknowledgement only once the commit holding the request is durable.
- :func:`verify_journal` checks a journal offline without writing.
- :func:`load_or_create_key` finds the key (``BRAID_KEY`` or ``journal.key``).
- :class:`GraphAdmission` is the conversation graph as the actor's admission (write model
  validates, read model shows only what is durable); :class:`GraphProjector` replays it for
  :func:`verify_journal`.

The journal is generic: an :class:`Admission` supplied by the application validates requests
and folds committed records into its read model.
"""

from ._actor import Admission, SnapshottingAdmission, run_journal
from ._handle import JournalHandle
from ._keys import load_or_create_key, parse_key
from ._projection import (
    GraphAdmission,
    GraphProjector,
    event_to_record,
    record_to_event,
)
from ._records import AppendResult, CommittedRecord, NewRecord, Operation
from ._request import Request
from ._store import Journal
from ._verify import Projector, VerifyReport, verify_journal

__all__ = [
    "Admission",
    "AppendResult",
    "CommittedRecord",
    "GraphAdmission",
    "GraphProjector",
    "Journal",
    "JournalHandle",
    "NewRecord",
    "Operation",
    "Projector",
    "Request",
    "SnapshottingAdmission",
    "VerifyReport",
    "event_to_record",
    "load_or_create_key",
    "parse_key",
    "record_to_event",
    "run_journal",
    "verify_journal",
]
