"""Codex configuration snapshots: ``turn_context``, ``world_state`` and the
``event_msg/thread_settings_applied`` event, each a ``configuration`` entry whose checked
fields (:data:`._parsed.CHECKED_FIELDS`) are those the record shows present."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._parsed import Content, as_dict, as_str

if TYPE_CHECKING:
    from ._parsed import DraftLine


def turn_context(helper: DraftLine, payload: dict[str, Any]) -> None:
    fields = {"configuration"}
    for key, name in (
        ("model", "configuration.model"),
        ("cwd", "configuration.workdir"),
        ("approval_policy", "configuration.approval_policy"),
        ("sandbox_policy", "configuration.sandbox_policy"),
    ):
        if key in payload:
            fields.add(name)
    sandbox = payload.get("sandbox_policy")
    if isinstance(sandbox, dict):
        if "writable_roots" in sandbox:
            fields.add("configuration.directory_restrictions")
        if "network_access" in sandbox:
            fields.add("configuration.network_restrictions")
    helper.add(
        "configuration", "turn_context", content=Content.json(payload), fields=frozenset(fields)
    )
    helper.outcome.stat(helper.session, "configurations")


def world_state(helper: DraftLine, payload: dict[str, Any]) -> None:
    world = as_dict(payload.get("state"))
    fields = {"configuration"}
    if as_str(world.get("model")):
        fields.add("configuration.model")
    environments = as_dict(as_dict(world.get("environments")).get("environments"))
    if any(as_str(as_dict(env).get("cwd")) for env in environments.values()):
        fields.add("configuration.workdir")
    helper.add(
        "configuration", "world_state", content=Content.json(payload), fields=frozenset(fields)
    )
    helper.outcome.stat(helper.session, "configurations")


def thread_settings(helper: DraftLine, event: dict[str, Any]) -> None:
    """A settings snapshot: each checked field counts as present when its key is recorded
    (an explicit null is a recorded value), never guessed from anything else."""
    settings = as_dict(event.get("thread_settings"))
    fields = {"configuration"}
    for key, name in (
        ("model", "configuration.model"),
        ("model_provider_id", "configuration.provider"),
        ("approval_policy", "configuration.approval_policy"),
        ("cwd", "configuration.workdir"),
        ("permission_profile", "configuration.sandbox_policy"),
    ):
        if key in settings:
            fields.add(name)
    profile = as_dict(settings.get("permission_profile"))
    if "entries" in as_dict(profile.get("file_system")):
        fields.add("configuration.directory_restrictions")
    if "network" in profile:
        fields.add("configuration.network_restrictions")
    helper.add(
        "configuration",
        "thread_settings_applied",
        content=Content.json(event),
        fields=frozenset(fields),
    )
    helper.outcome.stat(helper.session, "configurations")
