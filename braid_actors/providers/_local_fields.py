"""Reading the fields of a local worker's protocol message, each refused by name."""

from __future__ import annotations

from typing import Any, Literal

from braid_actors.errors import ProviderProtocolError


def outcome_of(value: str) -> Literal["completed", "failed", "cancelled"]:
    if value == "completed":
        return "completed"
    return "failed" if value == "failed" else "cancelled"


def text_field(message: dict[str, Any], key: str) -> str:
    value = optional_text_field(message, key)
    if value is None:
        raise ProviderProtocolError(
            "a worker message lacks a required field",
            details={"type": message.get("type"), "field": key},
        )
    return value


def optional_text_field(message: dict[str, Any], key: str) -> str | None:
    value = message.get(key)
    if value is not None and not isinstance(value, str):
        raise ProviderProtocolError(
            "a worker message field is not a string",
            details={"type": message.get("type"), "field": key},
        )
    return value


def count_field(message: dict[str, Any], key: str) -> int | None:
    value = message.get(key)
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise ProviderProtocolError(
            "a worker token count is not a non-negative integer", details={"field": key}
        )
    return value
