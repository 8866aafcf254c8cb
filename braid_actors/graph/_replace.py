"""``replace``: ``attrs.evolve`` for the graph's frozen entities, at about half the cost.

Folds replace an entity on every event (a run's counters on each part update), and
``attrs.evolve`` is generic: it looks up the class's fields, reads them one ``getattr`` at a
time into a keyword dict and calls ``__init__`` with keywords. :func:`replace` reads every
field at once with one ``operator.attrgetter`` (a C loop) and calls ``__init__``
positionally. It covers classes whose fields are all plain positional ``__init__``
arguments (every entity of the model); for any other class it is ``attrs.evolve``.
A property test checks the two agree for every entity class.
"""

from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, cast

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")

_Plan: TypeAlias = "tuple[Callable[[Any], tuple[Any, ...]], dict[str, int]] | None"


@functools.cache
def _plan(cls: type) -> _Plan:
    fields = attrs.fields(cls)
    if any(not f.init or f.kw_only or f.alias != f.name for f in fields) or len(fields) < 2:
        return None
    names = [f.name for f in fields]
    return operator.attrgetter(*names), {name: i for i, name in enumerate(names)}


def replace(inst: T, **changes: Any) -> T:
    """A copy of the frozen attrs instance ``inst`` with ``changes`` (like ``attrs.evolve``)."""
    cls = type(inst)
    plan = _plan(cast("type", cls))
    if plan is None:
        return attrs.evolve(inst, **changes)  # type: ignore[misc]
    getter, index = plan
    values = list(getter(inst))
    for name, value in changes.items():
        try:
            values[index[name]] = value
        except KeyError:
            raise TypeError(f"{cls.__name__} has no field {name!r}") from None
    return cls(*values)
