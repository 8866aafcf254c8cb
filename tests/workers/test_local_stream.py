"""The local worker's streaming hot path: lines outside trio, still prompt to cancel."""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

import trio
from hypothesis import given
from hypothesis import strategies as st

from braid_actors.model import TextPart
from braid_actors.workers import encode_message
from braid_actors.workers._reply import text_part_line
from braid_actors.workers._wire import unstructure_part
from tests.workers.test_local_worker import local_worker, of_type, start, until_done

if TYPE_CHECKING:
    from pathlib import Path

SLOW_STREAM = "?stream 60 0.2"
"""One update every 5 s: a cancel that waited for the next tick would be seconds late."""


@given(
    part_id=st.from_regex(r"part_[a-z0-9_]{1,40}", fullmatch=True),
    dots=st.integers(min_value=1, max_value=6000),
)
def test_the_spliced_line_is_the_encoded_part(part_id: str, dots: int) -> None:
    """The hot path's line (head + text + tail) is byte for byte ``encode_message``."""
    text = "Streaming" + "." * dots
    head, tail = text_part_line(part_id)
    part = unstructure_part(TextPart(part_id=part_id, text=text))
    assert head + text.encode("ascii") + tail == encode_message({"type": "part", "part": part})


async def test_a_stream_sends_every_update_in_order(tmp_path: Path) -> None:
    """``?stream S R`` sends S * R updates of one part, each one dot longer."""
    async with local_worker(tmp_path) as worker:
        await worker.send(start(tmp_path, "?stream 0.5 20"))
        messages = await until_done(worker)
    texts = [m["part"]["text"] for m in of_type(messages, "part")]
    assert texts == ["Streaming" + "." * n for n in range(1, 11)]
    assert messages[-1]["outcome"] == "completed"


async def test_a_cancel_between_slow_ticks_is_prompt(tmp_path: Path) -> None:
    """A cancel while the stream waits for its next tick ends the turn at once."""
    async with local_worker(tmp_path) as worker:
        await worker.send(start(tmp_path, SLOW_STREAM))
        session = await worker.receive()
        assert session is not None
        assert session["type"] == "session"
        await trio.sleep(0.3)
        sent = time.monotonic()
        await worker.send({"type": "cancel"})
        messages = await until_done(worker)
        took = time.monotonic() - sent
    assert messages[-1]["outcome"] == "cancelled"
    assert messages[-1]["reason"] == "cancelled: Braid asked the worker to cancel"
    assert took < 2.0, f"cancel took {took:.2f} s"


async def test_sigterm_between_slow_ticks_is_prompt(tmp_path: Path) -> None:
    """SIGTERM while the stream waits for its next tick ends the turn at once."""
    async with local_worker(tmp_path) as worker:
        await worker.send(start(tmp_path, SLOW_STREAM))
        session = await worker.receive()
        assert session is not None
        await trio.sleep(0.3)
        sent = time.monotonic()
        os.kill(worker.info.pid, signal.SIGTERM)
        messages = await until_done(worker)
        took = time.monotonic() - sent
    assert messages[-1]["outcome"] == "cancelled"
    assert messages[-1]["reason"] == "cancelled: the worker received SIGTERM"
    assert took < 2.0, f"SIGTERM took {took:.2f} s"


async def test_a_stray_line_between_slow_ticks_is_answered_at_once(tmp_path: Path) -> None:
    """A stray line during a slow stream is answered at once (``bad_message``), and the
    stream goes on: the pump runs between ticks, not only at them."""
    async with local_worker(tmp_path) as worker:
        await worker.send(start(tmp_path, SLOW_STREAM))
        assert (await worker.receive() or {}).get("type") == "session"
        await trio.sleep(0.3)
        sent = time.monotonic()
        await worker.send({"type": "interaction_response", "interactionId": "int_x"})
        with trio.fail_after(10):
            while True:
                message = await worker.receive()
                assert message is not None
                if message["type"] == "error":
                    break
        took = time.monotonic() - sent
        assert message["code"] == "bad_message"
        await worker.send({"type": "cancel"})
        messages = await until_done(worker)
    assert messages[-1]["outcome"] == "cancelled"
    assert took < 2.0, f"the error came {took:.2f} s after the line"
