"""Where the journal key comes from: BRAID_KEY or a 0600 key file."""

from __future__ import annotations

import base64
import os
import stat
from typing import TYPE_CHECKING

import pytest

from braid_actors.errors import JournalKeyError, UnsafeKeyFile
from braid_actors.journal import load_or_create_key

if TYPE_CHECKING:
    from pathlib import Path

RAW = bytes(range(32))


def test_key_file_is_created_with_mode_0600_in_a_0700_home(home: Path) -> None:
    """The first call creates home (0700) and journal.key (0600) holding 32 random bytes."""
    key = load_or_create_key(home, env={})
    assert len(key) == 32
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    path = home / "journal.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == key.hex() + "\n"


def test_existing_key_file_is_reused(home: Path) -> None:
    """Later calls return the same key and do not rewrite the file."""
    first = load_or_create_key(home, env={})
    before = (home / "journal.key").stat().st_mtime_ns
    assert load_or_create_key(home, env={}) == first
    assert (home / "journal.key").stat().st_mtime_ns == before


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_key_file_readable_by_others_is_refused(home: Path, mode: int) -> None:
    """A key file with any group/other permission bit is refused and never read."""
    load_or_create_key(home, env={})
    os.chmod(home / "journal.key", mode)
    with pytest.raises(UnsafeKeyFile) as info:
        load_or_create_key(home, env={})
    assert f"{mode:04o}" in info.value.message
    assert info.value.code == "journal_key_unsafe"


@pytest.mark.parametrize("content", [b"", b"abcd\n", b"00" * 31 + b"\n", b"zz" * 32])
def test_key_file_of_wrong_length_is_refused(home: Path, content: bytes) -> None:
    """A key file that does not hold 64 hex characters is a JournalKeyError."""
    home.mkdir(mode=0o700)
    path = home / "journal.key"
    path.write_bytes(content)
    os.chmod(path, 0o600)
    with pytest.raises(JournalKeyError):
        load_or_create_key(home, env={})


def test_symlinked_key_file_is_refused(home: Path, tmp_path: Path) -> None:
    """The key file is opened without following symlinks."""
    home.mkdir(mode=0o700)
    target = tmp_path / "elsewhere.key"
    target.write_text(RAW.hex() + "\n")
    os.chmod(target, 0o600)
    (home / "journal.key").symlink_to(target)
    with pytest.raises(JournalKeyError):
        load_or_create_key(home, env={})


@pytest.mark.parametrize(
    "value",
    [
        RAW.hex(),
        RAW.hex().upper(),
        base64.b64encode(RAW).decode(),
        base64.urlsafe_b64encode(RAW).decode(),
        base64.urlsafe_b64encode(RAW).decode().rstrip("="),
        f"  {RAW.hex()}\n",
    ],
)
def test_braid_key_accepts_hex_and_base64(home: Path, value: str) -> None:
    """BRAID_KEY is 64 hex characters or (urlsafe) base64 of 32 bytes; no key file is made."""
    assert load_or_create_key(home, env={"BRAID_KEY": value}) == RAW
    assert not (home / "journal.key").exists()


@pytest.mark.parametrize(
    "value",
    [
        "",
        "secret-passphrase",
        RAW.hex()[:-2],
        RAW.hex() + "00",
        base64.b64encode(RAW[:31]).decode(),
        base64.b64encode(RAW + b"x").decode(),
        "g" * 64,
    ],
)
def test_malformed_braid_key_is_refused_without_echoing_it(home: Path, value: str) -> None:
    """A malformed BRAID_KEY is a JournalKeyError whose message never contains the value."""
    with pytest.raises(JournalKeyError) as info:
        load_or_create_key(home, env={"BRAID_KEY": value})
    if value:
        assert value not in str(info.value)
        assert value not in repr(info.value)
    assert info.value.__cause__ is None
    assert info.value.__context__ is None
