"""``graph._replace.replace`` agrees with ``attrs.evolve`` for every entity of the graph."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from braid_actors import graph
from braid_actors.graph._replace import _plan, replace
from braid_actors.graph._state import _COLLECTIONS
from braid_actors.model import RunPartUpdated, TextPart
from tests.graph.test_graph import G

ENTITY_CLASSES = [cls for _name, cls in _COLLECTIONS]


def _populated() -> list[Any]:
    """One instance of every entity class, from a small real graph."""
    g = G()
    branch = g.conversation()
    g.turn(branch, "first")
    _turn, run_id = g.turn(branch, "second", finish=False)
    found: dict[type, Any] = {}
    for name, _cls in _COLLECTIONS:
        for entity in getattr(g.s, name).values():
            found.setdefault(type(entity), entity)
    assert run_id in g.s.runs
    return list(found.values())


INSTANCES = _populated()
VALUES = st.one_of(st.none(), st.integers(), st.text(max_size=5), st.tuples(st.integers()))


def test_the_instances_cover_the_folded_entities() -> None:
    names = {type(i).__name__ for i in INSTANCES}
    assert names >= {"Conversation", "Branch", "Message", "Turn", "Run", "Edge"}
    assert {type(i) for i in INSTANCES} <= set(ENTITY_CLASSES)


@given(data=st.data())
def test_replace_equals_evolve(data: st.DataObject) -> None:
    inst = data.draw(st.sampled_from(INSTANCES))
    names = [f.name for f in attrs.fields(type(inst))]
    chosen = data.draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
    changes = {name: data.draw(VALUES) for name in chosen}
    assert replace(inst, **changes) == attrs.evolve(inst, **changes)
    assert type(replace(inst, **changes)) is type(inst)


def test_an_unknown_field_is_a_type_error() -> None:
    for inst in INSTANCES:
        with pytest.raises(TypeError):
            replace(inst, no_such_field=1)


def test_a_class_it_cannot_plan_falls_back_to_evolve() -> None:
    @attrs.frozen
    class Private:
        _hidden: int
        shown: int = 0

    assert replace(Private(1), shown=2) == Private(1, 2)


def test_a_part_update_folds_the_same_with_either() -> None:
    """The fold that uses it gives the state a plain evolve would (a streamed part)."""
    g = G()
    branch = g.conversation()
    _turn, run_id = g.turn(branch, "hi", finish=False)
    g.start(run_id)
    run = g.s.runs[run_id]
    msg_id = run.assistant_message_id
    assert msg_id is not None
    for n in range(1, 4):
        part = TextPart(part_id="part_1", text="x" * n)
        ev = RunPartUpdated(run.conversation_id, run_id, msg_id, part, g.at(), n)
        before = g.s.messages[msg_id]
        graph.apply(g.s, ev, 100 + n)
        after = g.s.messages[msg_id]
        assert after.parts == (part,)
        assert after == attrs.evolve(
            before, parts=(part,), updated_at=ev.at, completeness=after.completeness
        )
        assert g.s.runs[run_id].events.last_seq == 100 + n
        assert g.s.runs[run_id].provider_cursor == n


def test_a_dict_copy_leaves_the_original_as_it_was() -> None:
    """Run and Message are copied by their field dict: the copy's dict is its own."""
    for inst in INSTANCES:
        if type(inst).__name__ not in ("Run", "Message"):
            continue
        cls: type = type(inst)
        plan = _plan(cls)
        assert plan is not None
        assert plan[2], f"{type(inst).__name__} is not copied by its dict"
        before = attrs.asdict(inst, recurse=False)
        first = attrs.fields(type(inst))[0].name
        copy = replace(inst, **{first: "changed"})
        assert getattr(copy, first) == "changed"
        assert attrs.asdict(inst, recurse=False) == before
        assert copy.__dict__ is not inst.__dict__
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            setattr(copy, first, "again")
