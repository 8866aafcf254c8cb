"""A snapshot is sealed in short steps, between which the event loop runs."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from braid_actors.journal import Journal
from braid_actors.journal._actor import _paced
from braid_actors.journal._crypto import Sealer
from braid_actors.journal._snapseal import SEAL_STEP

from ._helpers import longest_wait_beside

if TYPE_CHECKING:
    from pathlib import Path


def test_a_sealing_fed_in_pieces_opens_as_one_seal() -> None:
    """The pieces' ciphertext with its tag is what ``Sealer.open`` takes for their join."""
    sealer = Sealer(os.urandom(32))
    pieces = [os.urandom(n) for n in (0, 1, 1000, SEAL_STEP, 17)]
    sealing = sealer.sealing(b"ad", sum(map(len, pieces)))
    for piece in pieces:
        sealing.add(memoryview(piece))
    sealed = bytes(sealing.finish())
    assert sealer.open(sealing.nonce, sealed, b"ad") == b"".join(pieces)
    assert len(sealed) == sum(map(len, pieces)) + 16


def test_each_step_hashes_or_encrypts_at_most_a_step_of_the_state(journal: Journal) -> None:
    """Two passes of ceil(size / SEAL_STEP) steps (hash, then encrypt), then the snapshot,
    which reads back as the state it sealed."""
    state = {"runs": ["x" * 1000] * 2000}  # ~2 MB of canonical JSON
    state_json = json.dumps(state, separators=(",", ":"), sort_keys=True).encode()
    steps = list(journal.seal_snapshot_json_steps(0, 1, state_json))
    per_pass = -(-len(state_json) // SEAL_STEP)
    assert per_pass >= 7
    assert steps[:-1] == [None] * (2 * per_pass)
    last = steps[-1]
    assert last is not None
    journal.write_snapshot(last)
    assert journal.latest_snapshot(1) == (0, state)


async def test_a_large_seal_leaves_the_loop_free(home: Path, key: bytes) -> None:
    """Sealed in paced steps, 32 MB never hold another task up for long (sealed at once
    they hold it for the whole seal: 25-56 ms here)."""
    state_json = b'{"x":"' + b"x" * 32_000_000 + b'"}'
    with Journal.open(home, key) as journal:
        steps, longest = await longest_wait_beside(
            lambda: _paced(journal.seal_snapshot_json_steps(0, 1, state_json))
        )
        last = steps[-1]
        assert last is not None
        journal.write_snapshot(last)
        assert journal.latest_snapshot(1) == (0, {"x": "x" * 32_000_000})
    assert longest < 0.02
