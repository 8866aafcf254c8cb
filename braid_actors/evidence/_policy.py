"""Capture policy: what additional context a run retains (``agentprovenance.context_capture/v1``).

A run's policy is fixed by its first ingest and never changes afterwards ("immutable
additional-context retention settings for new writes in this run"). The presets:

| preset | tool_results | source_records | history | configuration |
|---|---|---|---|---|
| ``basic`` | false | false | false | false |
| ``detailed`` | true | true | true | true |

``basic`` keeps messages, reasoning, tool calls, tasks, approvals and session records with
their bodies, and omits tool-result bodies, raw source records, retained prior context and
configuration bodies (typed ``session_metadata`` is still extracted). The one override,
``tool_results``, keeps tool-result bodies under ``basic``. Excluding tool results also
excludes raw source records, which embed them.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import attrs

from braid_actors.errors import EvidenceInvalidArgument

POLICY_VERSION: Final = "agentprovenance.context_capture/v1"
PRESETS: Final = ("basic", "detailed")

Preset = Literal["basic", "detailed"]


@attrs.frozen
class CapturePolicy:
    """The retention settings of one run."""

    preset: Preset
    """``basic`` or ``detailed``."""
    tool_result_override: bool | None = None
    """``overrides.tool_results`` when given; null means the preset decides."""

    @property
    def tool_results(self) -> bool:
        """Tool-result bodies are stored."""
        if self.tool_result_override is not None:
            return self.tool_result_override
        return self.preset == "detailed"

    @property
    def source_records(self) -> bool:
        """Raw source records (redacted lines) are stored."""
        return self.preset == "detailed" and self.tool_results

    @property
    def history(self) -> bool:
        """Entries of retained prior context are stored."""
        return self.preset == "detailed"

    @property
    def configuration(self) -> bool:
        """Configuration bodies are stored."""
        return self.preset == "detailed"

    def to_wire(self) -> dict[str, Any]:
        """The spec's ``CapturePolicy`` object."""
        body: dict[str, Any] = {
            "version": POLICY_VERSION,
            "preset": self.preset,
            "tool_results": self.tool_results,
            "source_records": self.source_records,
            "history": self.history,
            "configuration": self.configuration,
        }
        if self.tool_result_override is not None:
            body["overrides"] = {"tool_results": self.tool_result_override}
        return body

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> CapturePolicy:
        preset = body.get("preset")
        overrides = body.get("overrides") or {}
        return make_policy(preset, tool_results=overrides.get("tool_results"))


def make_policy(preset: object, *, tool_results: bool | None = None) -> CapturePolicy:
    """Build a policy from a preset name; an unknown preset is an ``invalid_argument``."""
    if preset == "basic":
        return CapturePolicy("basic", tool_results)
    if preset == "detailed":
        return CapturePolicy("detailed", tool_results)
    raise EvidenceInvalidArgument(
        "the capture policy preset must be basic or detailed", details={"field": "policy"}
    )
