"""Protocol events from committed records, and the subscriptions that carry them.

Design note: the journal actor calls every admission listener synchronously, right after a
batch is durable and folded into the read model. :class:`EventHub` is one such listener.
:class:`EventMapper` turns the batch into protocol events (``run.state``, ``run.event``,
``run.interaction``, ``run.finished``, ``journal.committed``) against the read model *as of
that batch* — no I/O, no waiting. The hub then offers each event to every matching
subscription with ``send_nowait`` on that subscription's bounded memory channel.

The journal never waits for a subscriber. A subscription whose buffer is full is dropped:
its channel is closed, so its reader gets what was already buffered, then
:meth:`Subscription.dropped_message` tells it the last sequence it saw, from which it can
catch up by reading state. Nothing is mapped while nobody is subscribed.

``run.state`` reports the state a run is in after a commit, once per commit that leaves it
in a state other than the one last reported (a batch that moves a run through several states
reports the last one). It is sent at the position of the run's last record in the batch, so
in the event stream a run's slot is released before the next run is admitted.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import cattrs
import trio

from braid_actors import graph
from braid_actors.app._views import run_record
from braid_actors.app._wire import to_wire, wire
from braid_actors.errors import BadRequest, UnknownConversation, UnknownRun
from braid_actors.journal import GraphAdmission, record_to_event
from braid_actors.model import (
    RunInteractionAnswered,
    RunInteractionRequested,
    RunPartUpdated,
    format_time,
    structure_error,
)

if TYPE_CHECKING:
    from braid_actors.graph import GraphState
    from braid_actors.journal import CommittedRecord
    from braid_actors.model import Run, RunState

EVENT_BUFFER = 1024
"""Default per-subscription buffer (events) before a slow subscriber is dropped."""

SUBSCRIBE = "subscribe"
"""The command name; it needs the connection's writer, so the session loop handles it."""

Message = dict[str, Any]

_BEHIND = "the subscriber fell too far behind; read state again from lastSeq"
_FAULT = "events could not be produced for a commit; read state again from lastSeq"


@attrs.frozen
class SubscribeParams:
    conversation_id: str | None = None
    run_id: str | None = None


def parse_subscribe(state: GraphState, params: object) -> SubscribeParams:
    """Structure ``subscribe`` params strictly; both filters must name known records."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise BadRequest("params must be a JSON object")
    try:
        parsed = wire().structure(params, SubscribeParams)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as exc:
        raise structure_error(exc) from None
    if parsed.conversation_id is not None and parsed.conversation_id not in state.conversations:
        raise UnknownConversation(
            f"no conversation {parsed.conversation_id}",
            details={"conversationId": parsed.conversation_id},
        )
    if parsed.run_id is not None and parsed.run_id not in state.runs:
        raise UnknownRun(f"no run {parsed.run_id}", details={"runId": parsed.run_id})
    return parsed


@attrs.frozen
class ProtocolEvent:
    """One unsolicited event: its name, wire data and what a filter matches it on."""

    name: str
    """``run.state``, ``run.event``, ``run.interaction``, ``run.finished`` or
    ``journal.committed``."""
    data: Mapping[str, Any]
    """The event's ``data`` object in wire form (camelCase)."""
    conversation_id: str | None
    """The conversation the event belongs to; null for ``journal.committed``."""
    run_id: str | None
    """The run the event belongs to; null for ``journal.committed``."""
    seq: int
    """Journal sequence of the record the event comes from."""


def _run_id_of(record: CommittedRecord) -> str | None:
    """The run a graph record touches (a submitted turn creates its run), if any."""
    data = record.data
    if record.type == "turn.submitted":
        run = data.get("run")
        found = run.get("run_id") if isinstance(run, Mapping) else None
    elif record.type.startswith("run."):
        found = data.get("run_id")
    else:
        return None
    return found if isinstance(found, str) else None


class EventMapper:
    """Maps committed batches to protocol events; remembers the last state reported per run."""

    def __init__(self, state: GraphState) -> None:
        self._reported: dict[str, RunState] = {
            run_id: run.state
            for run_id, run in state.runs.items()
            if not graph.is_terminal(run.state)
        }

    def map(self, state: GraphState, records: Sequence[CommittedRecord]) -> list[ProtocolEvent]:
        """The batch's events in journal order, ending with one ``journal.committed``."""
        if not records:
            return []
        run_ids = [_run_id_of(r) for r in records]
        last_touch = {run_id: i for i, run_id in enumerate(run_ids) if run_id is not None}
        events: list[ProtocolEvent] = []
        for i, (record, run_id) in enumerate(zip(records, run_ids, strict=True)):
            run = state.runs.get(run_id) if run_id is not None else None
            if run is None:
                continue
            if last_touch[run.run_id] == i:
                changed = self._state_change(state, run, record)
                if changed is not None:
                    events.append(changed)
            own = _record_event(state, run, record)
            if own is not None:
                events.append(own)
        last = records[-1]
        events.append(
            ProtocolEvent(
                "journal.committed",
                {"seq": last.seq, "count": len(records), "at": format_time(last.committed_at)},
                None,
                None,
                last.seq,
            )
        )
        return events

    def _state_change(
        self, state: GraphState, run: Run, record: CommittedRecord
    ) -> ProtocolEvent | None:
        previous = self._reported.get(run.run_id)
        if previous == run.state:
            return None
        if graph.is_terminal(run.state):
            self._reported.pop(run.run_id, None)
        else:
            self._reported[run.run_id] = run.state
        data = {
            "conversationId": run.conversation_id,
            "branchId": run.branch_id,
            "turnId": run.turn_id,
            "runId": run.run_id,
            "state": run.state,
            "previous": previous,
            "queuePosition": graph.queue_position(state, run.branch_id, run.run_id),
            "seq": record.seq,
            "at": format_time(record.committed_at),
        }
        return ProtocolEvent("run.state", data, run.conversation_id, run.run_id, record.seq)


def _record_event(state: GraphState, run: Run, record: CommittedRecord) -> ProtocolEvent | None:
    base = {"conversationId": run.conversation_id, "runId": run.run_id, "seq": record.seq}
    name: str
    data: dict[str, Any]
    if record.type == "run.part_updated":
        part_event = record_to_event(record.type, record.data)
        assert isinstance(part_event, RunPartUpdated)
        name = "run.event"
        data = {
            **base,
            "messageId": part_event.message_id,
            "partId": part_event.part.part_id,
            "part": to_wire(part_event.part),
            "at": format_time(part_event.at),
        }
    elif record.type in ("run.interaction_requested", "run.interaction_answered"):
        asked = record_to_event(record.type, record.data)
        if isinstance(asked, RunInteractionRequested):
            interaction_id = asked.interaction.interaction_id
        else:
            assert isinstance(asked, RunInteractionAnswered)
            interaction_id = asked.interaction_id
        now = next((i for i in run.interactions if i.interaction_id == interaction_id), None)
        if now is None:
            return None
        name = "run.interaction"
        data = {**base, "interaction": to_wire(now)}
    elif record.type == "run.finished" and graph.is_terminal(run.state):
        name = "run.finished"
        data = {
            **base,
            "state": run.state,
            "outcome": to_wire(run.outcome),
            "run": run_record(state, run),
        }
    else:
        return None
    return ProtocolEvent(name, data, run.conversation_id, run.run_id, record.seq)


@attrs.define(eq=False)
class Subscription:
    """One client's filtered view of the event stream, bounded by its channel."""

    subscription_id: str
    conversation_id: str | None
    run_id: str | None
    buffer: int
    receive: trio.MemoryReceiveChannel[Message]
    _send: trio.MemorySendChannel[Message]
    dropped: bool = False
    """True once the subscription was ended early (see ``reason``); nothing more is offered."""
    reason: str | None = None
    """Why it was dropped."""
    last_seq: int = 0
    """Journal sequence of the last event accepted into the buffer."""

    @property
    def filtered(self) -> bool:
        return self.conversation_id is not None or self.run_id is not None

    def matches(self, event: ProtocolEvent) -> bool:
        if self.conversation_id is not None and event.conversation_id != self.conversation_id:
            return False
        return self.run_id is None or event.run_id == self.run_id

    def offer(self, event: ProtocolEvent) -> bool:
        """Queue without waiting; False (and the channel closed) when the reader is gone or
        too far behind."""
        message = {"event": event.name, "subscriptionId": self.subscription_id, "data": event.data}
        try:
            self._send.send_nowait(message)
        except trio.WouldBlock:
            self.drop(_BEHIND)
            return False
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.close()
            return False
        self.last_seq = event.seq
        return True

    def drop(self, reason: str) -> None:
        """End the subscription early; its reader learns why after the buffered events."""
        self.dropped = True
        self.reason = reason
        self.close()

    def close(self) -> None:
        """No more events; the reader gets what is buffered, then the end of the channel."""
        self._send.close()

    def dropped_message(self) -> Message:
        """The one line a dropped subscriber gets after its buffered events."""
        return {
            "event": "subscription.dropped",
            "subscriptionId": self.subscription_id,
            "data": {
                "subscriptionId": self.subscription_id,
                "lastSeq": self.last_seq,
                "buffer": self.buffer,
                "reason": self.reason or _BEHIND,
            },
        }


@attrs.define(eq=False)
class EventHub:
    """The application's subscriptions; attach it to the admission as a commit listener."""

    buffer: int = EVENT_BUFFER
    """Per-subscription buffer for new subscriptions."""
    _admission: GraphAdmission | None = None
    _subscriptions: dict[str, Subscription] = attrs.Factory(dict)
    _mapper: EventMapper | None = None

    def attach(self, admission: GraphAdmission) -> None:
        """Listen to ``admission``'s committed batches."""
        self._admission = admission
        admission.listeners.append(self.committed)

    def subscribe(
        self, *, conversation_id: str | None = None, run_id: str | None = None
    ) -> Subscription:
        """A new subscription; it sees batches committed from now on."""
        if self._admission is None:
            raise RuntimeError("the event hub is not attached to an admission")
        if self._mapper is None:
            self._mapper = EventMapper(self._admission.read)
        send, receive = trio.open_memory_channel[Message](self.buffer)
        # Not durable, so not a model identifier: it names the subscription on its connection.
        sub_id = f"sub_{secrets.token_hex(12)}"
        sub = Subscription(sub_id, conversation_id, run_id, self.buffer, receive, send)
        self._subscriptions[sub.subscription_id] = sub
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        sub.close()
        self._subscriptions.pop(sub.subscription_id, None)
        if not self._subscriptions:
            self._mapper = None

    @property
    def subscriptions(self) -> int:
        return len(self._subscriptions)

    def committed(self, records: Sequence[CommittedRecord]) -> None:
        """Admission listener: map the batch once, offer it to every subscription."""
        if self._mapper is None or self._admission is None:
            return
        try:
            events = self._mapper.map(self._admission.read, records)
        except Exception:
            # This runs in the journal actor: a mapping fault must never stop the journal.
            # Every subscriber is dropped instead and can read state again.
            for sub in self._subscriptions.values():
                sub.drop(_FAULT)
            self._subscriptions.clear()
            self._mapper = None
            return
        if not events:
            return
        *own, committed = events
        for sub in list(self._subscriptions.values()):
            if not self._deliver(sub, own, committed):
                self._subscriptions.pop(sub.subscription_id, None)
        if not self._subscriptions:
            self._mapper = None

    @staticmethod
    def _deliver(sub: Subscription, own: list[ProtocolEvent], committed: ProtocolEvent) -> bool:
        matched = False
        for event in own:
            if sub.matches(event):
                matched = True
                if not sub.offer(event):
                    return False
        # A filtered subscriber hears of a commit only when it carried something it wanted.
        if matched or not sub.filtered:
            return sub.offer(committed)
        return True
