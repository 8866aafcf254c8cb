"""The graph as the journal's admission: a write model that validates, a read model that shows.

Design note: the journal actor calls :meth:`GraphAdmission.admit` for each append request
before the batch is written, and :meth:`GraphAdmission.committed` after the batch is
durable. ``admit`` folds the request's graph event into the *write model* (``apply``
validates before it mutates, so a refused event changes nothing). ``committed`` folds the
same events into the *read model*, which is the only state readers see: nothing becomes
visible before it is durable. Both are folds of the same events, so they agree once the
journal has caught up.

The write model folds each event with the sequence number it will be committed under: the
journal numbers the records of its accepted requests consecutively, in the order they were
admitted, so it is the last staged sequence plus the record's position. The only thing a
sequence number changes in the graph is a run's ``events.last_seq``, so the two models then
hold equal entities. A part update (a provider's stream: most events) is therefore not
folded a second time: ``committed`` installs the message and run the write model produced,
when the record's actual sequence is the one they were folded under (any other event, or a
mismatch, is folded as usual). The journal actor admits the next batch only after this one
was folded into the read model, so the write model then holds nothing newer than this batch.

A request carries at most one graph event (plus any application records), so a refusal
never leaves half a request in the write model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from braid_actors import graph
from braid_actors.errors import BadRequest, JournalCorrupt
from braid_actors.graph import GraphState
from braid_actors.journal._encoding import PreEncoded, canonical_bytes
from braid_actors.journal._records import CommittedRecord, NewRecord
from braid_actors.model import (
    EVENT_TYPES,
    Event,
    Message,
    Run,
    RunPartUpdated,
    TextPart,
    converter,
    floatless,
    format_time,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence

    from braid_actors.journal._store import Journal

APP_RECORD_TYPES: frozenset[str] = frozenset(
    {
        "application.started",
        "application.shutdown.requested",
        "application.stopped",
    }
)
"""Journal records that are not graph events but are part of the durable history."""


class _EventData(PreEncoded):
    """A record payload that remembers the event it was made from.

    The journal hands the very same mapping to ``admit`` and ``committed``, so the typed
    event is folded without being structured back from JSON (the hot path). An event that
    holds no float (``model.floatless``) carries its canonical bytes, written by orjson.
    """

    __slots__ = ("event", "folded")
    event: Event
    folded: tuple[int, Message, Run] | None
    """A part update's message and run as the write model folded them, and under which
    sequence number (see the module note)."""


def event_to_record(event: Event) -> NewRecord:
    """The journal form of a graph event: its stream, type and canonical fields."""
    if type(event) is RunPartUpdated and type(event.part) is TextPart:
        # a stream's hot path, spelled out: what the converter gives (a test checks it)
        part = event.part
        data = _EventData(
            conversation_id=event.conversation_id,
            run_id=event.run_id,
            message_id=event.message_id,
            part={"part_id": part.part_id, "text": part.text, "kind": part.kind},
            at=format_time(event.at),
            cursor=event.cursor,
        )
        plain = True  # strings and an int: floatless(event) says so, at a cost per event
    else:
        data = _EventData(converter().unstructure(event))
        del data["type"]
        plain = floatless(event)
    data.event = event
    data.folded = None
    data.plaintext = None
    if plain:
        try:  # noqa: SIM105 - contextlib.suppress is three more calls per event
            data.plaintext = orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:  # beyond 64-bit ints, lone surrogates
            pass
    return NewRecord(stream=event.stream, type=event.type, data=data)


def _event_of(record_type: str, data: Mapping[str, Any]) -> Event:
    if isinstance(data, _EventData):
        return data.event
    return record_to_event(record_type, data)


def record_to_event(record_type: str, data: Mapping[str, Any]) -> Event:
    """Inverse of :func:`event_to_record`."""
    return converter().structure({**data, "type": record_type}, Event)  # type: ignore[arg-type]


def is_graph_record(record_type: str) -> bool:
    return record_type in EVENT_TYPES


class GraphAdmission:
    """Admission for the journal actor; ``read`` is the committed graph readers use."""

    def __init__(self, state: GraphState | None = None, *, seq: int = 0) -> None:
        base = state or GraphState()
        self.read: GraphState = base
        # The write model starts as a copy that shares the (frozen) entities: folds replace
        # entities and never change them, so only the collections need their own copies.
        self._write: GraphState = graph.copy_state(base)
        self.seq = seq
        """Journal sequence of the last record folded into the read model."""
        self.listeners: list[Any] = []
        """Callables invoked with each committed batch after the read model changed."""
        self.snapshot_per_entity = 0
        """Decline a snapshot until the tail since the last one holds this many events per
        entity of the graph (0: never decline). A snapshot encodes every entity, a restart
        replays the tail: this bounds both to the same order (see ``snapshot``)."""
        self._snapshot_seq = seq
        self._staged_seq = seq
        """Sequence number the last record admitted into the write model will have."""
        self._pieces: graph.PieceCache = {}
        """Encoded entities of the last snapshot: the next one encodes only what changed."""

    @classmethod
    def load(cls, journal: Journal) -> GraphAdmission:
        """Rebuild from the newest snapshot of this projection version plus the tail."""
        snap = journal.latest_snapshot(graph.PROJECTION_VERSION)
        state, seq = GraphState(), 0
        if snap is not None:
            seq, payload = snap
            state = graph.load_state(payload)
        admission = cls(state, seq=seq)
        tail = list(journal.read(after_seq=seq))
        admission._replay(tail)
        return admission

    def _replay(self, records: Iterable[CommittedRecord]) -> None:
        """Fold committed records into the read model; the write model is then its copy
        (one fold per record, not two)."""
        for record in records:
            if is_graph_record(record.type):
                graph.apply(self.read, record_to_event(record.type, record.data), record.seq)
            elif record.type not in APP_RECORD_TYPES:
                raise JournalCorrupt(
                    f"journal record {record.seq} has unknown type {record.type}",
                    details={"seq": record.seq},
                )
            self.seq = record.seq
        self._staged_seq = self.seq
        self._write = graph.copy_state(self.read)

    # ---- the journal actor's Admission protocol ----------------------------------------

    def admit(self, records: Sequence[NewRecord]) -> None:
        if len(records) == 1 and is_graph_record(records[0].type):
            # an event's append (the hot path)
            seq = self._staged_seq + 1
            self._admit_event(records[0], seq)
            self._staged_seq = seq
            return
        graph_records = [r for r in records if is_graph_record(r.type)]
        unknown = [
            r.type
            for r in records
            if not is_graph_record(r.type) and r.type not in APP_RECORD_TYPES
        ]
        if unknown:
            raise BadRequest("unknown journal record type", details={"types": unknown})
        if len(graph_records) > 1:
            raise BadRequest("an append carries at most one graph event")
        seq = self._staged_seq
        for record in records:
            seq += 1
            if is_graph_record(record.type):
                self._admit_event(record, seq)
        self._staged_seq = seq

    def _admit_event(self, record: NewRecord, seq: int) -> None:
        """Fold the graph event ``record`` into the write model as record ``seq`` (a refused
        event raises before the caller moves the staged sequence)."""
        write, data = self._write, record.data
        event = _event_of(record.type, data)
        graph.apply(write, event, seq)
        if type(event) is RunPartUpdated and type(data) is _EventData:
            data.folded = (seq, write.messages[event.message_id], write.runs[event.run_id])

    def committed(self, records: Sequence[CommittedRecord]) -> None:
        read = self.read
        for record in records:
            data = record.data
            if isinstance(data, _EventData) and (folded := data.folded) is not None:
                data.folded = None
                if folded[0] == record.seq:
                    # the write model's fold of this very record (see the module note)
                    event = data.event
                    assert isinstance(event, RunPartUpdated)
                    read.messages[event.message_id] = folded[1]
                    read.runs[event.run_id] = folded[2]
                    read.events += 1
                    self.seq = record.seq
                    continue
            if is_graph_record(record.type):
                graph.apply(read, _event_of(record.type, data), record.seq)
            self.seq = record.seq
        self._staged_seq = max(self._staged_seq, self.seq)
        for listener in list(self.listeners):
            listener(records)

    def snapshot(self) -> tuple[int, Iterator[bytes]] | None:
        """The read model's snapshot, or None when it is not yet worth taking.

        With ``snapshot_per_entity`` k, one is taken only once k events per entity were
        folded since the last: its cost (encoding each entity) is then at most ~1/k of a
        fold per event, however fast events come, and a restart replays at most k events
        per entity beyond the journal's own ``snapshot_every``.
        """
        if self.snapshot_per_entity:
            entities = graph.entity_count(self.read)
            if self.seq - self._snapshot_seq < self.snapshot_per_entity * entities:
                return None
        self._snapshot_seq = self.seq
        # A copy later folds do not change, encoded piece by piece between commits.
        return graph.PROJECTION_VERSION, graph.iter_state_json(
            graph.copy_state(self.read), canonical_bytes, self._pieces
        )


class GraphProjector:
    """The graph fold for ``verify_journal``: replays records and checksums the result."""

    version = graph.PROJECTION_VERSION

    def initial(self) -> GraphState:
        return GraphState()

    def apply(self, state: GraphState, record: CommittedRecord) -> GraphState:
        if is_graph_record(record.type):
            graph.apply(state, record_to_event(record.type, record.data), record.seq)
        return state

    def checksum(self, state: GraphState) -> str:
        return graph.checksum(state)

    def dump(self, state: GraphState) -> Mapping[str, Any]:
        return graph.dump_state(state)
