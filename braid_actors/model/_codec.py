"""The one converter, canonical JSON, and digests.

Policies of :func:`make_converter`:

- datetimes are timezone-aware UTC and are written as RFC 3339 strings with a ``Z`` suffix
  and microsecond precision (``2026-12-02T10:27:40.123456Z``); naive datetimes are refused;
- enums are written by value;
- bytes are not part of the model (payload bytes never leave the journal layer);
- tuples are written as JSON arrays and read back as tuples;
- unions of attrs classes that carry a ``kind`` (parts) or ``type`` (events) literal field are
  written with that field and read back through it (a closed tagged union);
- ``None`` fields are written as ``null``: an unknown value stays visibly unknown;
- extra keys are refused when reading (a typo is an error, not a silently ignored field).

Canonical JSON, digests and times live in ``_canonical``.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any

import cattrs
from cattrs.preconf.json import make_converter as _make_json_converter

from braid_actors.errors import BadRequest
from braid_actors.model._canonical import format_time, parse_time


def make_converter() -> cattrs.Converter:
    """Build the project's converter (see the module docstring for its policies)."""
    conv = _make_json_converter(forbid_extra_keys=True)
    conv.register_unstructure_hook(datetime, format_time)
    conv.register_structure_hook(datetime, lambda v, _t: parse_time(v))
    _configure_unions(conv)
    return conv


@functools.cache
def converter() -> cattrs.Converter:
    """The shared converter instance (built once)."""
    return make_converter()


def structure_error(exc: BaseException) -> BadRequest:
    """Translate a cattrs/validation failure into a ``BadRequest`` naming paths, not values."""
    problems = (
        cattrs.transform_error(exc)
        if isinstance(exc, cattrs.BaseValidationError)
        else [type(exc).__name__]
    )
    return BadRequest(
        "parameters do not match the expected shape", details={"problems": problems[:20]}
    )


def _configure_unions(conv: cattrs.Converter) -> None:
    # Imported here: the entity modules import nothing from this module, and keeping the
    # union wiring in one place makes the converter's policies readable top to bottom.
    from braid_actors.model._events import EVENT_TYPES, Event
    from braid_actors.model._parts import PART_TYPES, Part

    def structure_part(value: Any, _t: Any) -> Any:
        if not isinstance(value, dict) or value.get("kind") not in PART_TYPES:
            raise ValueError("a part needs a known 'kind'")
        return conv.structure(value, PART_TYPES[value["kind"]])

    def structure_event(value: Any, _t: Any) -> Any:
        if not isinstance(value, dict) or value.get("type") not in EVENT_TYPES:
            raise ValueError("an event needs a known 'type'")
        return conv.structure(value, EVENT_TYPES[value["type"]])

    conv.register_structure_hook_func(lambda t: t == Part, structure_part)
    conv.register_structure_hook_func(lambda t: t == Event, structure_event)
