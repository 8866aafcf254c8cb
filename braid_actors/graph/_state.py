"""The graph projection: every entity by identifier, plus the branch queues.

``GraphState`` is the fold of the journal's graph events. Its canonical dump (and the
checksum of that dump) is what snapshots store and what ``journal verify`` compares with a
full replay, so the dump lists collections in a deterministic order and holds nothing that
is not itself derived from events.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from braid_actors.model import (
    Branch,
    Conversation,
    Edge,
    Environment,
    Message,
    Run,
    Turn,
    Worker,
    converter,
    digest,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

PROJECTION_VERSION = 2
"""Bumped whenever the fold's meaning or the dump's shape changes; older snapshots rebuild."""


@attrs.define(eq=False)
class GraphState:
    """Mutable projection owned by one folder (the journal's admission or read model)."""

    conversations: dict[str, Conversation] = attrs.Factory(dict)
    branches: dict[str, Branch] = attrs.Factory(dict)
    messages: dict[str, Message] = attrs.Factory(dict)
    turns: dict[str, Turn] = attrs.Factory(dict)
    runs: dict[str, Run] = attrs.Factory(dict)
    edges: dict[str, Edge] = attrs.Factory(dict)
    environments: dict[str, Environment] = attrs.Factory(dict)
    workers: dict[str, Worker] = attrs.Factory(dict)
    queues: dict[str, list[str]] = attrs.Factory(dict)
    """Per branch: queued run ids in admission order."""
    active: dict[str, str] = attrs.Factory(dict)
    """Per branch: the run holding the branch's single active slot."""
    events: int = 0
    """How many graph events were folded."""
    out_edges: dict[str, list[str]] = attrs.Factory(dict)
    """Derived index (not dumped): edge destinations by source, for cycle checks."""

    def add_edge(self, edge: Edge) -> None:
        """Record an edge and index it."""
        self.edges[edge.edge_id] = edge
        self.out_edges.setdefault(edge.source_id, []).append(edge.destination_id)


_COLLECTIONS: tuple[tuple[str, type[Any]], ...] = (
    ("conversations", Conversation),
    ("branches", Branch),
    ("messages", Message),
    ("turns", Turn),
    ("runs", Run),
    ("edges", Edge),
    ("environments", Environment),
    ("workers", Worker),
)


def copy_state(state: GraphState) -> GraphState:
    """A copy that later folds into ``state`` do not change, cheap enough for the event loop.

    Entities are frozen and a fold replaces them rather than changing them, so copying the
    collections (and the queue lists, which folds do change in place) is enough: the copy
    can then be dumped in another thread while ``state`` moves on.
    """
    copied = GraphState(
        queues={key: list(value) for key, value in state.queues.items()},
        active=dict(state.active),
        events=state.events,
        out_edges={key: list(value) for key, value in state.out_edges.items()},
    )
    for name, _cls in _COLLECTIONS:
        setattr(copied, name, dict(getattr(state, name)))
    return copied


def entity_count(state: GraphState) -> int:
    """How many entities the state holds (what a dump encodes one by one)."""
    return sum(len(getattr(state, name)) for name, _cls in _COLLECTIONS)


def dump_state(state: GraphState) -> dict[str, Any]:
    """JSON-compatible, deterministic form of the whole projection."""
    conv = converter()
    out: dict[str, Any] = {}
    for name, cls in _COLLECTIONS:
        items: Mapping[str, Any] = getattr(state, name)
        out[name] = {key: conv.unstructure(items[key], cls) for key in sorted(items)}
    out["queues"] = {key: list(state.queues[key]) for key in sorted(state.queues)}
    out["active"] = dict(sorted(state.active.items()))
    out["events"] = state.events
    return out


PieceCache = dict[tuple[str, str], tuple[Any, bytes]]
"""(collection, key) → (the entity, its encoded ``"key":value`` piece), kept between
snapshots."""


def iter_state_json(
    state: GraphState, encode: Callable[[Any], bytes], cache: PieceCache | None = None
) -> Iterator[bytes]:
    """The canonical JSON of :func:`dump_state`, one entity at a time.

    ``encode`` is a canonical JSON encoder (sorted keys, no whitespace): the joined pieces
    are then byte for byte ``encode(dump_state(state))``, since the dump's keys are in
    sorted order at every level. Each entity is unstructured only when its piece is asked
    for, so a caller can interleave other work (use it on a :func:`copy_state`).

    With ``cache`` (kept by the caller from one call to the next, with the same
    ``encode``), an entity that is the very object encoded last time gives its piece again:
    entities are frozen and a fold replaces, never changes them, so only what changed since
    is encoded anew. A pass that runs to its end leaves only this state's entities in it.
    """
    conv = converter()
    collections = dict(_COLLECTIONS)
    seen: set[tuple[str, str]] = set()
    yield b"{"
    for index, name in enumerate(sorted([*collections, "queues", "active", "events"])):
        yield (b"," if index else b"") + encode(name) + b":"
        if name in collections:
            items: Mapping[str, Any] = getattr(state, name)
            cls = collections[name]
            yield b"{"
            for n, key in enumerate(sorted(items)):
                entity = items[key]
                hit = None if cache is None else cache.get((name, key))
                if hit is not None and hit[0] is entity:
                    piece = hit[1]
                else:
                    piece = encode(key) + b":" + encode(conv.unstructure(entity, cls))
                    if cache is not None:
                        cache[name, key] = (entity, piece)
                if cache is not None:
                    seen.add((name, key))
                yield (b"," + piece) if n else piece
            yield b"}"
        elif name == "queues":
            yield encode({key: list(value) for key, value in state.queues.items()})
        elif name == "active":
            yield encode(dict(state.active))
        else:
            yield encode(state.events)
    yield b"}"
    if cache is not None:
        for gone in [k for k in cache if k not in seen]:
            del cache[gone]


def load_state(data: Mapping[str, Any]) -> GraphState:
    """Inverse of :func:`dump_state`."""
    conv = converter()
    state = GraphState()
    for name, cls in _COLLECTIONS:
        target: dict[str, Any] = getattr(state, name)
        for key, value in data[name].items():
            target[key] = conv.structure(value, cls)
    state.queues = {key: list(value) for key, value in data["queues"].items()}
    state.active = dict(data["active"])
    state.events = int(data["events"])
    for edge in state.edges.values():
        state.out_edges.setdefault(edge.source_id, []).append(edge.destination_id)
    return state


def checksum(state: GraphState) -> str:
    """``sha256:`` of the canonical dump: equal states have equal checksums."""
    return digest(dump_state(state))
