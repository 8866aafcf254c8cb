"""The local worker's reply to one turn: the input directives, streamed as parts.

Each input line is answered in order (``docs/local-runner.md`` lists the directives):
plain text is echoed in a few growing chunks, ``!cmd`` asks permission and runs a shell
command, ``?stream``/``?sleep``/``?burn``/``?alloc``/``?at`` stream, wait or really use
resources for load and limit tests. :class:`Turn` owns the reply's cancel scope; the
program around it (``local.py``) reads Braid's messages and cancels it.
"""

from __future__ import annotations

import math
import random
import re
import time
from typing import Any, Final

import attrs
import trio

from braid_actors.errors import ProviderProtocolError
from braid_actors.model import (
    Part,
    ReasoningPart,
    TextPart,
    ToolRequestPart,
    ToolResultPart,
)
from braid_actors.workers._channel import Channel
from braid_actors.workers._quiet import Quiet
from braid_actors.workers._session import SessionLine, SessionState
from braid_actors.workers._shell import run_shell
from braid_actors.workers._start import Start
from braid_actors.workers._wire import encode_message, unstructure_part

MAX_SLEEP: Final = 600.0
SLEEP_TICK: Final = 0.25
"""``?sleep`` streams a chunk at least this often (seconds)."""
ECHO_CHUNKS: Final = 3
_SLEEP_RE: Final = re.compile(r"\?sleep\s+([0-9]+(?:\.[0-9]+)?)")
_BURN_RE: Final = re.compile(r"\?burn\s+([0-9]+(?:\.[0-9]+)?)")
_STREAM_RE: Final = re.compile(r"\?stream\s+([0-9]+(?:\.[0-9]+)?)\s+([0-9]+(?:\.[0-9]+)?)")
MAX_STREAM_RATE: Final = 100.0
"""Most part updates per second one ``?stream`` line may send."""
_ALLOC_RE: Final = re.compile(r"\?alloc\s+([0-9]+)")
_AT_RE: Final = re.compile(r"\?at\s+([0-9]+(?:\.[0-9]+)?)")
MAX_BURN: Final = 60.0
"""Most CPU seconds one ``?burn`` line may use."""
MAX_ALLOC_MB: Final = 2048
"""Most MiB one ``?alloc`` line may hold."""


@attrs.define(eq=False)
class Turn:
    """One reply: emits parts, asks permissions, runs shell commands; cancellable."""

    channel: Channel
    start: Start
    history: SessionState
    """The session as the turn found it (before its user input)."""
    shell_timeout: float
    """Seconds a ``!`` shell command may run before its process group is killed."""
    quiet: Quiet | None = None
    """Waits outside trio while no input or signal can need another task."""
    parts: dict[str, Part] = attrs.Factory(dict)
    """Latest version of each emitted part, in first-emission order."""
    ended: tuple[str, str] | None = None
    """Set by :meth:`abort`: the outcome and reason that interrupted the reply."""
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    _index: int = 0
    _waiting: dict[str, trio.Event] = attrs.Factory(dict)
    _answers: dict[str, tuple[bool, str | None]] = attrs.Factory(dict)
    _held_memory: list[bytearray] = attrs.Factory(list)

    def abort(self, outcome: str, reason: str) -> None:
        if self.ended is None:
            self.ended = (outcome, reason)
            self.scope.cancel(reason=reason)

    async def run(self) -> tuple[str, str | None]:
        """Reply to every input line; return ``(outcome, reason)``."""
        result: tuple[str, str | None] = ("completed", None)
        with self.scope:
            result = await self._reply()
        if self.scope.cancelled_caught and self.ended is not None:
            return self.ended
        return result

    # -- bookkeeping

    @property
    def _stem(self) -> str:
        mid = self.start.assistant_message_id
        return mid[4:] if mid.startswith("msg_") else mid

    def _next_index(self) -> int:
        self._index += 1
        return self._index

    async def _emit(self, part: Part) -> None:
        self.parts[part.part_id] = part
        await self.channel.send("part", part=unstructure_part(part))

    def reply_line(self) -> SessionLine:
        texts = [p.text for p in self.parts.values() if isinstance(p, TextPart)]
        return SessionLine(self.start.assistant_message_id, "assistant", "\n".join(texts))

    def output_chars(self) -> int:
        total = 0
        for part in self.parts.values():
            if isinstance(part, TextPart | ReasoningPart):
                total += len(part.text)
            elif isinstance(part, ToolResultPart):
                total += len(part.summary)
        return total

    def answer(self, msg: dict[str, Any]) -> None:
        """Deliver an ``interaction_response``; raise for one that answers nothing."""
        interaction_id = msg.get("interactionId")
        allow = msg.get("allow")
        message = msg.get("message")
        if not isinstance(interaction_id, str) or interaction_id not in self._waiting:
            raise ProviderProtocolError("interaction_response names no pending interaction")
        if not isinstance(allow, bool) or not (message is None or isinstance(message, str)):
            raise ProviderProtocolError("interaction_response needs allow (bool) and message")
        self._answers[interaction_id] = (allow, message)
        self._waiting.pop(interaction_id).set()

    # -- the reply

    async def _reply(self) -> tuple[str, str | None]:
        lines = [line.strip() for line in self.start.text.splitlines() if line.strip()]
        if not lines:
            await self._stream(TextPart, "You said nothing.")
        for line in lines:
            sleep = _SLEEP_RE.fullmatch(line)
            if line.startswith("!") and line[1:].strip():
                await self._shell(line[1:].strip())
            elif line == "?think":
                await self._think(len(lines))
            elif line == "?fail":
                return "failed", "failed_by_request: the input asked the local runner to fail"
            elif sleep is not None and float(sleep.group(1)) <= MAX_SLEEP:
                await self._sleep(float(sleep.group(1)))
            elif (
                (stream := _STREAM_RE.fullmatch(line))
                and float(stream.group(1)) <= MAX_SLEEP
                and 0 < float(stream.group(2)) <= MAX_STREAM_RATE
            ):
                await self._stream_for(float(stream.group(1)), float(stream.group(2)))
            elif (burn := _BURN_RE.fullmatch(line)) and float(burn.group(1)) <= MAX_BURN:
                await self._burn(float(burn.group(1)))
            elif (alloc := _ALLOC_RE.fullmatch(line)) and int(alloc.group(1)) <= MAX_ALLOC_MB:
                await self._alloc(int(alloc.group(1)))
            elif (at := _AT_RE.fullmatch(line)) and float(at.group(1)) - time.time() <= MAX_SLEEP:
                await self._wait_until(float(at.group(1)))
            else:
                await self._stream(TextPart, f"You said: {line} ({self._held()})")
        return "completed", None

    def _held(self) -> str:
        count = len(self.history.lines)
        noun = "message" if count == 1 else "messages"
        return f"{count} earlier {noun} in this session"

    async def _stream(self, cls: type[TextPart] | type[ReasoningPart], text: str) -> None:
        part_id = f"part_{self._stem}_{self._next_index():03d}"
        chunks = min(ECHO_CHUNKS, len(text))
        for n in range(1, chunks + 1):
            await self._emit(cls(part_id=part_id, text=text[: len(text) * n // chunks]))
            await trio.lowlevel.checkpoint()

    async def _think(self, line_count: int) -> None:
        await self._stream(
            ReasoningPart,
            f"Thinking about {line_count} input line(s) with {self._held()}.",
        )

    async def _sleep(self, seconds: float) -> None:
        part_id = f"part_{self._stem}_{self._next_index():03d}"
        ticks = max(1, math.ceil(seconds / SLEEP_TICK))
        text = f"Sleeping {seconds:g} s"
        for _ in range(ticks):
            await trio.sleep(seconds / ticks)
            text += "."
            await self._emit(TextPart(part_id=part_id, text=text))
        await self._emit(TextPart(part_id=part_id, text=text + " done."))

    async def _stream_for(self, seconds: float, rate: float) -> None:
        """Send ``rate`` updates of one growing text part per second for ``seconds``."""
        part_id = f"part_{self._stem}_{self._next_index():03d}"
        count = max(1, int(seconds * rate))
        # A phase of its own within one period: many workers sharing one start line (`?at`)
        # then do not all wake at the same instant.
        start = trio.current_time() + random.random() / rate - 1 / rate
        # The text is "Streaming" and dots: JSON needs no escape in it, so each line is the
        # encoded part around the text's bytes (a test checks this equals encode_message).
        head, tail = text_part_line(part_id)
        text = "Streaming"
        try:
            for n in range(1, count + 1):
                due = start + n / rate
                # The hot path: a tick with no input and no signal never enters trio.
                if self.quiet is None or self.channel.detached or not self.quiet.wait_until(due):
                    await trio.sleep_until(due)
                text += "."
                await self.channel.send_line(head + text.encode("ascii") + tail)
        finally:
            if text != "Streaming":
                self.parts[part_id] = TextPart(part_id=part_id, text=text)

    async def _wait_until(self, wall: float) -> None:
        """Send nothing until the wall clock reads ``wall`` (a start line for many workers)."""
        await trio.sleep(max(0.0, wall - time.time()))

    async def _burn(self, cpu_seconds: float) -> None:
        """Really use ``cpu_seconds`` of CPU (busy work), staying responsive to cancel."""
        part_id = f"part_{self._stem}_{self._next_index():03d}"
        goal = time.process_time() + cpu_seconds
        spins = 0
        while time.process_time() < goal:
            deadline = time.process_time() + 0.05
            while time.process_time() < deadline:
                spins += 1
            await trio.lowlevel.checkpoint()
        await self._emit(TextPart(part_id=part_id, text=f"Burned {cpu_seconds:g} CPU s."))

    async def _alloc(self, mib: int) -> None:
        """Really hold ``mib`` MiB of touched memory until the turn ends."""
        block = bytearray(mib * 1024 * 1024)
        for offset in range(0, len(block), 4096):
            block[offset] = 1  # touch every page so it counts in RSS
        self._held_memory.append(block)
        await self._emit(
            TextPart(
                part_id=f"part_{self._stem}_{self._next_index():03d}", text=f"Holding {mib} MiB."
            )
        )
        await trio.sleep(0.5)  # long enough for the supervisor to observe it

    async def _shell(self, command: str) -> None:
        index = self._next_index()
        request_id = f"part_{self._stem}_{index:03d}"
        await self._emit(
            ToolRequestPart(
                part_id=request_id, name="shell", input={"command": command},
                call_id=f"shell_{index}",
            )
        )  # fmt: skip
        interaction_id = f"int_{self._stem}_{index:03d}"
        allow, message = await self._ask(interaction_id, {"tool": "shell", "command": command})
        result_id = f"part_{self._stem}_{self._next_index():03d}"
        if not allow:
            summary = "Permission denied." + (f" {message}" if message else "")
            await self._emit(
                ToolResultPart(
                    part_id=result_id, request_part_id=request_id, status="denied",
                    summary=summary,
                )
            )  # fmt: skip
            return
        result = await run_shell(command, self.start.workspace, self.shell_timeout)
        await self._emit(
            ToolResultPart(
                part_id=result_id,
                request_part_id=request_id,
                status="ok" if result.exit_code == 0 else "error",
                summary=result.summary,
                truncated=result.truncated,
                exit_code=result.exit_code,
            )
        )

    async def _ask(self, interaction_id: str, subject: dict[str, Any]) -> tuple[bool, str | None]:
        event = trio.Event()
        self._waiting[interaction_id] = event
        await self.channel.send(
            "interaction", interactionId=interaction_id, kind="permission", subject=subject
        )
        await event.wait()
        return self._answers.pop(interaction_id)


TEXT_MARK: Final = "<<the text>>"


def text_part_line(part_id: str) -> tuple[bytes, bytes]:
    """The protocol line of a text part ``part_id`` split where its (escape-free) text goes."""
    part = unstructure_part(TextPart(part_id=part_id, text=TEXT_MARK))
    line = encode_message({"type": "part", "part": part})
    head, tail = line.split(TEXT_MARK.encode())
    return head, tail
