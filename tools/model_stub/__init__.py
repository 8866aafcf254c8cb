"""A scripted model server on loopback for driving real coding-agent CLIs offline.

It speaks enough of the Anthropic Messages API (``POST /v1/messages``) and the OpenAI
Responses API (``POST /v1/responses``) for Claude Code and Codex, answers from a script
(:mod:`tools.model_stub._script`), and records every request so tests can assert the exact
context a harness sent. ``docs/model-stub.md`` documents the script, the endpoints and the
settings each CLI needs; :mod:`tools.model_stub.harness` finds the installed CLIs.
"""

from tools.model_stub._script import (
    Script,
    ScriptedError,
    ScriptError,
    Step,
    StepUsage,
    ToolCall,
    load_script,
    parse_script,
    parse_step,
)
from tools.model_stub._server import (
    ModelStub,
    RecordedRequest,
    open_model_stub,
    serve_model_stub,
)

__all__ = [
    "ModelStub",
    "RecordedRequest",
    "Script",
    "ScriptError",
    "ScriptedError",
    "Step",
    "StepUsage",
    "ToolCall",
    "load_script",
    "open_model_stub",
    "parse_script",
    "parse_step",
    "serve_model_stub",
]
