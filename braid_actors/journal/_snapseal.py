"""Sealing a snapshot: its state's checksum spliced into the payload, AES-GCM under the
journal's key, in steps short enough to run between commits."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import attrs

from braid_actors.model._canonical import DIGEST_PREFIX

from ._crypto import snapshot_ad
from ._inspect import snapshot_frame

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ._crypto import Sealer

SEAL_STEP = 1 << 18
"""Bytes of a snapshot hashed or encrypted in one step of its sealing (0.1-0.6 ms here)."""


@attrs.frozen
class SealedSnapshot:
    """A snapshot encrypted and ready to write (see :meth:`Journal.seal_snapshot`)."""

    seq: int
    nonce: bytes
    ciphertext: bytes | memoryview


def seal_steps(
    sealer: Sealer, seq: int, version: int, state_json: bytes
) -> Iterator[SealedSnapshot | None]:
    """Seal the snapshot of ``state_json`` (canonical JSON) at ``seq`` in steps that each
    hash or encrypt at most :data:`SEAL_STEP` bytes: None after each step, the sealed
    snapshot last (see ``Journal.seal_snapshot_json_steps``)."""
    if type(seq) is not int or seq < 0 or type(version) is not int:
        raise ValueError("a snapshot needs an integer seq >= 0 and an integer version")
    state = memoryview(state_json)
    hasher = hashlib.sha256()
    for at in range(0, len(state), SEAL_STEP):
        hasher.update(state[at : at + SEAL_STEP])
        yield None
    head, tail = snapshot_frame(DIGEST_PREFIX + hasher.hexdigest(), seq, version)
    sealing = sealer.sealing(snapshot_ad(seq), len(head) + len(state) + len(tail))
    sealing.add(head)
    for at in range(0, len(state), SEAL_STEP):
        sealing.add(state[at : at + SEAL_STEP])
        yield None
    sealing.add(tail)
    yield SealedSnapshot(seq, sealing.nonce, sealing.finish())
