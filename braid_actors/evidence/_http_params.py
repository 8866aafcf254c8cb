"""Query parameters of the evidence API, as the spec declares them, and their checking.

Each route lists its parameters once (:data:`ROUTES`); :func:`parse_query` turns a raw query
string into typed values or raises ``invalid_argument`` naming the field. A parameter given
twice, a value that is not UTF-8, or one outside the spec's bounds is refused; parameters the
spec does not declare are ignored.
"""

from __future__ import annotations

import re
from typing import Any, Final, Literal
from urllib.parse import parse_qsl

import attrs

from braid_actors.errors import EvidenceInvalidArgument

Kind = Literal["string", "integer", "boolean"]
_INTEGER: Final = re.compile(r"-?[0-9]{1,20}")


@attrs.frozen
class Param:
    """One query parameter and its schema bounds."""

    name: str
    kind: Kind = "string"
    required: bool = False
    low: int | None = None
    """``minLength`` of a string, ``minimum`` of an integer."""
    high: int | None = None
    """``maxLength`` of a string, ``maximum`` of an integer."""
    enum: tuple[str, ...] | None = None
    pattern: str | None = None
    default: Any = None


_RUN: Final = Param("run", required=True, low=1, high=512)
_CURSOR_8K: Final = Param("cursor", high=8192)
_CURSOR_16K: Final = Param("cursor", high=16384)
_PAGE_LIMIT: Final = Param("limit", "integer", low=1, high=200, default=50)
_BYTE_OFFSET: Final = Param("offset", "integer", low=0, default=0)
_BYTE_LIMIT: Final = Param("limit", "integer", low=4, high=262144, default=65536)
_REF_PATTERN: Final = r"sha256:[a-f0-9]{64}"

CONTEXT_ROUTES: Final[dict[str, tuple[Param, ...]]] = {
    "overview": (_RUN,),
    "entries": (
        _RUN,
        Param("session"),
        Param("harness"),
        Param("source"),
        Param("kind"),
        Param("tool_call"),
        Param("entry", high=512),
        Param("node", high=512),
        Param("group", enum=("conversation", "configuration")),
        Param("revisions", "boolean", default=False),
        _CURSOR_8K,
        _PAGE_LIMIT,
    ),
    "session-relations": (
        _RUN,
        Param("harness", required=True, low=1, high=128),
        Param("session", required=True, low=1, high=512),
        _CURSOR_8K,
        _PAGE_LIMIT,
    ),
    "content": (
        _RUN,
        Param("ref", required=True, pattern=_REF_PATTERN),
        _BYTE_OFFSET,
        _BYTE_LIMIT,
    ),
    "links": (_RUN, Param("entry", required=True, low=1, high=512)),
    "compare": (
        _RUN,
        Param("left", required=True, low=1, high=512),
        Param("right", required=True, low=1, high=512),
        Param("right_run", low=1, high=512),
    ),
}
"""The ``/v1/context/{name}`` routes (mirrored under ``/api/context/{name}``)."""

DASHBOARD_ROUTES: Final[dict[str, tuple[Param, ...]]] = {
    # harness and session are read only to be refused: the records cover the whole run.
    "/api/compare/records": (
        _RUN,
        _CURSOR_16K,
        Param("harness", low=1, high=128),
        Param("session", low=1, high=512),
    ),
    "/api/search/sources": (
        _RUN,
        Param("harness", low=1, high=128),
        Param("session", low=1, high=512),
        _CURSOR_16K,
    ),
    "/api/artifact": (
        _RUN,
        Param("node", required=True, low=1),
        Param("mode", enum=("body", "raw"), default="body"),
        _BYTE_OFFSET,
        _BYTE_LIMIT,
        Param("view_lang"),
    ),
}
"""The dashboard-only routes."""


def _invalid(message: str, field: str) -> EvidenceInvalidArgument:
    return EvidenceInvalidArgument(message, details={"field": field})


def parse_query(raw: bytes, params: tuple[Param, ...]) -> dict[str, Any]:
    """The typed values of ``params`` in the query string ``raw`` (defaults filled in)."""
    try:
        pairs = parse_qsl(
            raw.decode("ascii"), keep_blank_values=True, strict_parsing=False, errors="strict"
        )
    except UnicodeError:
        raise _invalid("the query string is not valid UTF-8", "query") from None
    given: dict[str, str] = {}
    for key, value in pairs:
        if key in given:
            raise _invalid(f"{key} is given more than once", key)
        given[key] = value
    return {param.name: _value(param, given.get(param.name)) for param in params}


def _value(param: Param, text: str | None) -> Any:
    name = param.name
    if text is None:
        if param.required:
            raise _invalid(f"{name} is required", name)
        return param.default
    if param.kind == "integer":
        if not _INTEGER.fullmatch(text):
            raise _invalid(f"{name} must be an integer", name)
        number = int(text)
        if (param.low is not None and number < param.low) or (
            param.high is not None and number > param.high
        ):
            raise _invalid(f"{name} must be an integer from {_bounds(param)}", name)
        return number
    if param.kind == "boolean":
        if text not in ("true", "false"):
            raise _invalid(f"{name} must be true or false", name)
        return text == "true"
    if (param.low is not None and len(text) < param.low) or (
        param.high is not None and len(text) > param.high
    ):
        raise _invalid(f"{name} must be a string of {_bounds(param)} characters", name)
    if param.enum is not None and text not in param.enum:
        raise _invalid(f"{name} must be one of {', '.join(param.enum)}", name)
    if param.pattern is not None and not re.fullmatch(param.pattern, text):
        raise _invalid(f"{name} does not match {param.pattern}", name)
    return text


def _bounds(param: Param) -> str:
    low = 0 if param.low is None else param.low
    return f"{low} to {param.high}" if param.high is not None else f"{low} up"
