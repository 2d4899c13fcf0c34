"""The disk cache runs no stranger's code: private folder and key, keyed digests, untrusted
folders skipped with one warning."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from blake3 import blake3

from torchburn.runtime.disk_cache import (DIGEST_BYTES, KEY_FILE, CacheEntry, DiskCache, decode, encode)
from torchburn.runtime.jit import ObjectCode

KEY = "ab" + "0" * 62


def entry(payload: bytes = b"\x7fELF object code") -> CacheEntry:
    text = "program @p(%x: f32[4] strides [1]) -> (%out0: f32[4] strides [1]) {\n  call @k0(%x, %out0)\n}\n"
    return CacheEntry(KEY, text, ObjectCode(payload, "x86_64-unknown-linux-gnu", "znver4", "+avx2"), "torchburn_p")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_folder_key_and_entries_are_private(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    path = DiskCache(root).store(entry())
    assert path is not None
    assert mode(root) == 0o700 and mode(root / "v1") == 0o700 and mode(path.parent) == 0o700
    assert mode(root / KEY_FILE) == 0o600 and len((root / KEY_FILE).read_bytes()) == 32
    assert mode(path) == 0o600
    assert DiskCache(root).load(KEY) == entry()  # a second process reads the same key


def test_planted_entry_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An attacker who can write the folder but not read the key writes a well-formed entry with
    a plain (or wrongly keyed) digest: it is deleted, never loaded."""
    cache = DiskCache(tmp_path)
    path = cache.store(entry())
    assert path is not None
    body = encode(entry(b"\xcc evil code"), bytes(32))[:-DIGEST_BYTES]
    for forged in (body + blake3(body).digest(), body + blake3(body, key=b"k" * 32).digest()):
        path.write_bytes(forged)
        with caplog.at_level("WARNING", logger="torchburn"):
            assert DiskCache(tmp_path).load(KEY) is None
        assert not path.exists()
    assert "not written by this user's torchburn" in caplog.text


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permissions")
@pytest.mark.parametrize("what", ["folder", "key"])
def test_folder_writable_by_others_is_not_used(tmp_path: Path, what: str, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "cache"
    DiskCache(root).store(entry())
    if what == "folder":
        os.chmod(root, 0o777)
    else:
        os.chmod(root / KEY_FILE, 0o644)
    cache = DiskCache(root)
    with caplog.at_level("WARNING", logger="torchburn"):
        assert cache.load(KEY) is None
        assert cache.store(entry()) is None
        assert cache.load(KEY) is None
    warnings = [r for r in caplog.records if "not using the disk cache" in r.getMessage()]
    assert len(warnings) == 1, caplog.text  # one warning, then the cache stays off


def test_entry_under_another_key_fails_its_digest(tmp_path: Path) -> None:
    data = encode(entry(), b"a" * 32)
    with pytest.raises(ValueError, match="digest"):
        decode(data, KEY, b"b" * 32)
