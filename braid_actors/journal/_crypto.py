"""Payload encryption, associated data, and the hash chain.

Every payload is AES-256-GCM with a fresh 12-byte random nonce. The associated data binds a
ciphertext to the row it belongs to, so a ciphertext moved to another row (another sequence
number, stream, type, operation or snapshot) no longer decrypts:

=============  ==========================================================================
payload        associated data (fields framed by :func:`frame`)
=============  ==========================================================================
event          ``"braid.event.v1", seq, stream, type, committed_at``
operation      ``"braid.op.v1", op_id, command, params_digest, seq``
snapshot       ``"braid.snapshot.v1", seq``
key check      ``"braid.keycheck.v1", format_version``
=============  ==========================================================================

The hash chain links events: ``hash_n = sha256(frame("braid.chain.v1", hash_{n-1}, seq,
stream, type, committed_at, nonce, ciphertext))`` written ``sha256:<hex>``; the first event's
``prev_hash`` is :data:`GENESIS_HASH`.

:func:`frame` writes each field as a 4-byte big-endian length followed by its bytes (strings as
UTF-8, integers as 8-byte big-endian signed), so no two different field lists frame alike.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from braid_actors.errors import JournalKeyError

KEY_SIZE = 32
NONCE_SIZE = 12
TAG_SIZE = 16
GENESIS_HASH = "sha256:" + "0" * 64
KEY_CHECK_PLAINTEXT = b"braid journal key check"


class DecryptError(Exception):
    """A ciphertext did not authenticate under this key and associated data (internal)."""


def frame(*fields: bytes | str | int) -> bytes:
    """Length-prefixed concatenation of ``fields`` (see the module docstring)."""
    parts: list[bytes] = []
    for value in fields:
        if isinstance(value, bytes):
            raw = value
        elif isinstance(value, str):
            raw = value.encode("utf-8")
        else:
            raw = value.to_bytes(8, "big", signed=True)
        parts.append(len(raw).to_bytes(4, "big"))
        parts.append(raw)
    return b"".join(parts)


def _field(raw: bytes) -> bytes:
    return len(raw).to_bytes(4, "big") + raw


_SEQ = struct.Struct(">Iq")  # a framed integer: length 8, then the value
_EVENT_TAG = _field(b"braid.event.v1")
_CHAIN_TAG = _field(b"braid.chain.v1")


def event_ad(seq: int, stream: str, type_: str, committed_at: str) -> bytes:
    return event_ad_framed(seq, frame(stream, type_, committed_at))


def event_ad_framed(seq: int, framed_tail: bytes) -> bytes:
    """:func:`event_ad` with ``frame(stream, type, committed_at)`` computed by the caller.

    The journal frames the tail once per (stream, type) in a batch; the bytes are identical.
    """
    return _EVENT_TAG + _SEQ.pack(8, seq) + framed_tail


def operation_ad(op_id: str, command: str, params_digest: str, seq: int) -> bytes:
    return frame("braid.op.v1", op_id, command, params_digest, seq)


def snapshot_ad(seq: int) -> bytes:
    return frame("braid.snapshot.v1", seq)


def key_check_ad(format_version: int) -> bytes:
    return frame("braid.keycheck.v1", format_version)


def chain_hash(
    prev_hash: str,
    seq: int,
    stream: str,
    type_: str,
    committed_at: str,
    nonce: bytes,
    ciphertext: bytes,
) -> str:
    """The chain link of one event (see the module docstring)."""
    return chain_hash_framed(prev_hash, seq, frame(stream, type_, committed_at), nonce, ciphertext)


def chain_hash_framed(
    prev_hash: str, seq: int, framed_tail: bytes, nonce: bytes, ciphertext: bytes
) -> str:
    """:func:`chain_hash` with ``frame(stream, type, committed_at)`` computed by the caller."""
    body = (
        _CHAIN_TAG,
        len(prev_hash).to_bytes(4, "big"),
        prev_hash.encode("ascii"),
        _SEQ.pack(8, seq),
        framed_tail,
        len(nonce).to_bytes(4, "big"),
        nonce,
        len(ciphertext).to_bytes(4, "big"),
        ciphertext,
    )
    return "sha256:" + hashlib.sha256(b"".join(body)).hexdigest()


class Sealer:
    """AES-GCM with random nonces under one 32-byte key; safe to share between threads."""

    __slots__ = ("_aead", "_key")

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_SIZE:
            raise JournalKeyError(f"the journal key must be {KEY_SIZE} bytes")
        self._aead = AESGCM(key)
        self._key = key

    def sealing(self, ad: bytes, size: int) -> Sealing:
        """A :meth:`seal` of ``size`` bytes fed piece by piece (same layout: the ciphertext
        with the 16-byte tag after it), so a large one can be encrypted in short steps."""
        return Sealing(self._key, ad, size)

    def seal(self, plaintext: bytes, ad: bytes) -> tuple[bytes, bytes]:
        """Encrypt; returns ``(nonce, ciphertext_with_tag)``."""
        nonce = os.urandom(NONCE_SIZE)
        return nonce, self._aead.encrypt(nonce, plaintext, ad)

    def encrypt(self, nonce: bytes, plaintext: bytes, ad: bytes) -> bytes:
        """Encrypt under a caller-drawn random nonce (the journal draws a batch's at once)."""
        return self._aead.encrypt(nonce, plaintext, ad)

    def open(self, nonce: bytes, ciphertext: bytes, ad: bytes) -> bytes:
        """Decrypt and authenticate, or raise :class:`DecryptError`."""
        if len(nonce) != NONCE_SIZE:
            raise DecryptError("bad nonce length")
        try:
            return self._aead.decrypt(nonce, ciphertext, ad)
        except InvalidTag:
            raise DecryptError("authentication failed") from None


class Sealing:
    """One AES-GCM encryption in progress under a random nonce (see :meth:`Sealer.sealing`),
    written in place into one buffer: no piece of the ciphertext is copied again."""

    __slots__ = ("_buffer", "_encryptor", "_filled", "nonce")

    def __init__(self, key: bytes, ad: bytes, size: int) -> None:
        self.nonce = os.urandom(NONCE_SIZE)
        self._encryptor = Cipher(algorithms.AES(key), modes.GCM(self.nonce)).encryptor()
        self._encryptor.authenticate_additional_data(ad)
        # Anonymous memory, whose pages the kernel zeroes as the steps first write them
        # (a bytearray is zeroed at once: 16 ms for 32 MB in one step); update_into wants
        # room for a block more than it writes.
        self._buffer = memoryview(mmap.mmap(-1, size + TAG_SIZE + 15))
        self._filled = 0

    def add(self, plaintext: bytes | memoryview) -> None:
        self._filled += self._encryptor.update_into(plaintext, self._buffer[self._filled :])

    def finish(self) -> memoryview:
        """The ciphertext of everything added, then the tag."""
        self._encryptor.finalize()  # (nothing is held back in GCM)
        end = self._filled + TAG_SIZE
        self._buffer[self._filled : end] = self._encryptor.tag
        return self._buffer[:end]
