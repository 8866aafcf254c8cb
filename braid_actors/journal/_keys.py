"""Where the journal key comes from.

1. ``BRAID_KEY``, when present in the environment (even empty), is the key: 64 hexadecimal
   characters, or standard or URL-safe base64 (padding optional) of exactly 32 bytes.
   Anything else is refused; the message never repeats the value.
2. Otherwise ``<home>/journal.key``. It is created on first use with
   ``O_CREAT | O_EXCL`` and mode 0600 (``home`` itself is created with mode 0700 when missing)
   and holds the key as 64 lowercase hexadecimal characters and a newline, so it can be
   copied into ``BRAID_KEY`` as is. An existing key file that group or others may access
   (``mode & 0o077``) is refused with :class:`UnsafeKeyFile`; one that does not hold 32 bytes
   of key is refused with :class:`JournalKeyError`.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from typing import TYPE_CHECKING

from braid_actors.errors import JournalKeyError, UnsafeKeyFile

from ._crypto import KEY_SIZE
from ._head import fsync_dir

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

KEY_ENV = "BRAID_KEY"
KEY_FILE = "journal.key"
_HEX = frozenset("0123456789abcdefABCDEF")


def load_or_create_key(home: Path, env: Mapping[str, str] = os.environ) -> bytes:
    """Return the 32-byte journal key from ``BRAID_KEY`` or ``home/journal.key``."""
    if KEY_ENV in env:
        return parse_key(env[KEY_ENV])
    path = home / KEY_FILE
    try:
        return _read_key_file(path)
    except FileNotFoundError:
        pass
    _ensure_home(home)
    try:
        return _create_key_file(path)
    except FileExistsError:
        # another process created it between our read and create: use theirs
        return _read_key_file(path)


def parse_key(text: str) -> bytes:
    """Decode a ``BRAID_KEY`` value (hex or base64 of 32 bytes)."""
    value = text.strip()
    if len(value) == 2 * KEY_SIZE and all(c in _HEX for c in value):
        return bytes.fromhex(value)
    decoded = _b64(value)
    if decoded is None or len(decoded) != KEY_SIZE:
        raise JournalKeyError(
            f"{KEY_ENV} is not a valid key: expected 64 hexadecimal characters "
            f"or base64 of {KEY_SIZE} bytes"
        )
    return decoded


def _b64(value: str) -> bytes | None:
    if not value or len(value) > 64:
        return None
    standard = value.replace("-", "+").replace("_", "/")
    standard += "=" * (-len(standard) % 4)
    try:
        return base64.b64decode(standard, validate=True)
    except (binascii.Error, ValueError):
        return None


def _ensure_home(home: Path) -> None:
    if home.is_dir():
        return
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(home, 0o700)


def _read_key_file(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:  # a symlink (O_NOFOLLOW), a directory, no permission
        raise JournalKeyError(
            f"the key file {path} cannot be read ({exc.strerror})", details={"path": str(path)}
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise JournalKeyError(f"the key file {path} is not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise UnsafeKeyFile(
                f"the key file {path} has mode {mode:04o}; it must not be readable or "
                f"writable by group or others (chmod 600 {path})",
                details={"path": str(path), "mode": f"{mode:04o}"},
            )
        raw = os.read(fd, 4 * KEY_SIZE + 1)
    finally:
        os.close(fd)
    text = raw.decode("ascii", errors="replace").strip()
    if len(text) != 2 * KEY_SIZE or not all(c in _HEX for c in text):
        raise JournalKeyError(
            f"the key file {path} does not hold a {KEY_SIZE}-byte key "
            f"(expected {2 * KEY_SIZE} hexadecimal characters)",
            details={"path": str(path)},
        )
    return bytes.fromhex(text)


def _create_key_file(path: Path) -> bytes:
    key = os.urandom(KEY_SIZE)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        os.write(fd, key.hex().encode("ascii") + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(path.parent)
    return key
