"""``replace``: ``attrs.evolve`` for the graph's frozen entities, at about half the cost.

Folds replace an entity on every event (a run's counters on each part update), and
``attrs.evolve`` is generic: it looks up the class's fields, reads them one ``getattr`` at a
time into a keyword dict and calls ``__init__`` with keywords. :func:`replace` reads every
field at once with one ``operator.attrgetter`` (a C loop) and calls ``__init__``
positionally; for a class whose instances keep their fields in ``__dict__`` (``Run`` and
``Message``, replaced on every part update) and whose ``__init__`` only stores them (no
validator, converter or post-init), it copies that dict instead (Run: 2.8 -> 1.1 us). It
covers classes whose fields are all plain positional ``__init__`` arguments (every entity
of the model); for any other class it is ``attrs.evolve``. A property test checks the two
agree for every entity class.
"""

from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, cast

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")

_Plan: TypeAlias = "tuple[Callable[[Any], tuple[Any, ...]], dict[str, int], bool] | None"
_new = object.__new__
_set = object.__setattr__


@functools.cache
def _plan(cls: type) -> _Plan:
    fields = attrs.fields(cls)
    if any(not f.init or f.kw_only or f.alias != f.name for f in fields) or len(fields) < 2:
        return None
    names = [f.name for f in fields]
    # Instances keep their fields in __dict__, and __init__ only stores them: copy the dict.
    by_dict = (
        "__slots__" not in cls.__dict__
        and not hasattr(cls, "__attrs_post_init__")
        and all(f.validator is None and f.converter is None for f in fields)
    )
    return operator.attrgetter(*names), {name: i for i, name in enumerate(names)}, by_dict


def replace(inst: T, **changes: Any) -> T:
    """A copy of the frozen attrs instance ``inst`` with ``changes`` (like ``attrs.evolve``)."""
    cls = type(inst)
    plan = _plan(cast("type", cls))
    if plan is None:
        return attrs.evolve(inst, **changes)  # type: ignore[misc]
    getter, index, by_dict = plan
    for name in changes:
        if name not in index:
            raise TypeError(f"{cls.__name__} has no field {name!r}")
    if by_dict:
        # __init__ would only store the values: the copy gets the field dict with changes.
        fields = inst.__dict__.copy()
        fields.update(changes)
        copy = _new(cls)
        _set(copy, "__dict__", fields)
        return copy
    values = list(getter(inst))
    for name, value in changes.items():
        values[index[name]] = value
    return cls(*values)
