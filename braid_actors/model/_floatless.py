"""Which model values can hold no float: their canonical JSON is then orjson's sorted output.

``canonical_json`` (sorted keys, compact, UTF-8, no NaN) and ``orjson.dumps`` with sorted
keys write the same bytes for every JSON value without a float: the same escapes for every
code point, keys in code-point order (UTF-8 bytes sort the same way). They differ on floats
(``1e+16`` against ``1e16``, and orjson writes NaN as null). orjson is several times faster,
so the journal encodes a record with it when the record's event provably holds no float.

The proof is from the declared field types, once per class: a field typed ``str``, ``int``,
``bool``, ``None``, ``datetime`` (written as a string), a ``Literal`` of those, or a tuple or
union of such holds no float; a field typed as an attrs class, or a union of them, is checked
at run time on the value's own class (a part is a union: a text part holds no float, a tool
request's JSON input may); any other type (``float``, ``Any``, a mapping) may hold one. The
model is typed strictly (mypy), so the declared type is what a field holds.
"""

from __future__ import annotations

import functools
import types
import typing
from datetime import datetime
from typing import Any, Final, Literal, Union, get_args, get_origin

import attrs

_LEAVES: Final = (str, int, bool, type(None), datetime)
_DYNAMIC: Final = "dynamic"
_Plan = tuple[str, ...] | None  # fields to check on the value, or None: may hold a float


def floatless(value: Any) -> bool:
    """True when ``value`` (an attrs instance of the model) provably holds no float."""
    cls: type = type(value)
    plan = _plan(cls)
    if plan is None:
        return False
    for name in plan:
        field = getattr(value, name)
        if field is not None and not floatless(field):
            return False
    return True


@functools.cache
def _plan(cls: type) -> _Plan:
    if not attrs.has(cls):
        return None
    hints = typing.get_type_hints(cls)
    dynamic: list[str] = []
    for field in attrs.fields(cls):
        verdict = _verdict(hints.get(field.name, Any))
        if verdict is False:
            return None
        if verdict == _DYNAMIC:
            dynamic.append(field.name)
    return tuple(dynamic)


def _verdict(tp: Any) -> bool | str:
    """True: holds no float; False: may hold one; ``dynamic``: ask the value's class."""
    if tp in _LEAVES:
        return True
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return all(isinstance(a, str | int) for a in args)  # bool is an int
    if origin is Union or origin is types.UnionType:
        verdicts = [_verdict(a) for a in args]
        if False in verdicts:
            return False
        return _DYNAMIC if _DYNAMIC in verdicts else True
    if origin is tuple:
        # a tuple of leaves; a tuple of attrs values would need a walk of its items
        return all(_verdict(a) is True for a in args if a is not Ellipsis)
    if isinstance(tp, type) and attrs.has(tp):
        return _DYNAMIC
    return False
