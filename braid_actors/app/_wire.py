"""The wire form of records and parameters: the model's converter with camelCase names.

Clients (headless, the daemon socket, exports) see ``runId`` and ``costUsd``; the model and
the journal keep Python names. This is the only place the two spellings meet.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import attrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from braid_actors.model import make_converter

if TYPE_CHECKING:
    import cattrs


def camel(name: str) -> str:
    """``cost_usd`` -> ``costUsd``."""
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def _strict(kind: type[Any]) -> Any:
    def hook(value: Any, _t: Any) -> Any:
        if isinstance(value, bool) and kind is not bool:
            raise TypeError(f"expected {kind.__name__}, got a boolean")
        if kind is float and isinstance(value, int | float):
            return float(value)
        if not isinstance(value, kind):
            raise TypeError(f"expected {kind.__name__}")
        return value

    return hook


@functools.cache
def wire() -> cattrs.Converter:
    """Converter for everything that crosses the client boundary."""
    conv = make_converter()

    def renames(cls: type[Any]) -> dict[str, Any]:
        return {a.name: override(rename=camel(a.name)) for a in attrs.fields(cls)}

    def unstructure_factory(cls: type[Any]) -> Any:
        return make_dict_unstructure_fn(cls, conv, **renames(cls))

    def structure_factory(cls: type[Any]) -> Any:
        return make_dict_structure_fn(cls, conv, _cattrs_forbid_extra_keys=True, **renames(cls))

    # Clients get no silent coercion: "5" is not an int and 1 is not a bool.
    for kind in (str, int, float, bool):
        conv.register_structure_hook(kind, _strict(kind))
    conv.register_unstructure_hook_factory(attrs.has, unstructure_factory)
    conv.register_structure_hook_factory(attrs.has, structure_factory)
    return conv


def to_wire(value: Any, as_type: Any = None) -> Any:
    """Unstructure a model value (or container of them) into camelCase JSON."""
    return wire().unstructure(value, as_type) if as_type is not None else wire().unstructure(value)
