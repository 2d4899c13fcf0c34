"""The on-disk compile cache: file format and checks, a second process that compiles nothing,
corrupted entries rebuilt, concurrent writers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchburn.runtime.disk_cache import (CacheEntry, CorruptEntry, DiskCache, decode, encode)
from torchburn.runtime.jit import ObjectCode

ROOT = Path(__file__).resolve().parents[2]
KEY = "ab" + "0" * 62
SECRET = bytes(range(32))


def entry(key: str = KEY, payload: bytes = b"\x7fELF object code") -> CacheEntry:
    text = "program @p(%x: f32[4] strides [1]) -> (%out0: f32[4] strides [1]) {\n  call @k0(%x, %out0)\n}\n"
    return CacheEntry(key, text, ObjectCode(payload, "x86_64-unknown-linux-gnu", "znver4", "+avx2"),
                      "torchburn_p", (("k0", "aten.exp.default @ m.py:3"),))


def test_encode_decode_round_trip() -> None:
    e = entry()
    assert decode(encode(e, SECRET), KEY, SECRET) == e


def test_object_parts_round_trip_and_must_match_the_object() -> None:
    """A program emitted in parts keeps its objects apart (`ObjectCode.part_sizes`, each loaded
    on its own); sizes that do not add up to the object are refused, never split wrongly."""
    from dataclasses import replace

    from torchburn.runtime.disk_cache import _digest

    e = entry()
    parts = replace(e, object=replace(e.object, data=b"\x7fELF one\x7fELF two", part_sizes=(8, 8)))
    back = decode(encode(parts, SECRET), KEY, SECRET)
    assert back == parts and back.object.objects == (b"\x7fELF one", b"\x7fELF two")
    data = encode(parts, SECRET)
    body = data[:-32].replace(b'"object_parts": [8, 8]', b'"object_parts": [8, 9]')  # same length
    assert body != data[:-32]
    with pytest.raises(CorruptEntry, match="sizes"):
        decode(body + _digest(body, SECRET), KEY, SECRET)


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "other-key"])
def test_damaged_files_are_refused(damage: str) -> None:
    data = encode(entry(), SECRET)
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data = data[:40] + bytes([data[40] ^ 1]) + data[41:]
    elif damage == "empty":
        data = b""
    else:
        data = encode(entry(key="cd" + "1" * 62), SECRET)
    with pytest.raises(CorruptEntry):
        decode(data, KEY, SECRET)


def test_store_load_and_corrupt_entry_is_deleted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = DiskCache(tmp_path)
    assert cache.load(KEY) is None and cache.stats.misses == 1
    path = cache.store(entry())
    assert path == tmp_path / "v1" / "ab" / f"{KEY}.tbc" and path.is_file()
    assert cache.load(KEY) == entry()
    assert cache.info()["entries"] == 1
    path.write_bytes(path.read_bytes()[:-5])
    with caplog.at_level("WARNING", logger="torchburn"):
        assert cache.load(KEY) is None
    assert "is corrupt" in caplog.text and "deleting it" in caplog.text
    assert not path.exists() and cache.stats.corrupt == 1
    assert not list((tmp_path / "v1").glob("*/.*.tmp"))


def test_prune_keeps_the_most_recent(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=0)  # no automatic pruning
    keys = [f"{i:02d}" + "f" * 62 for i in range(5)]
    for i, k in enumerate(keys):
        p = cache.store(entry(k))
        assert p is not None
        os.utime(p, (1000 + i, 1000 + i))
    size = os.path.getsize(cache.path(keys[0]))
    assert cache.prune(2 * size) == 3
    assert [p.name[:2] for p in cache.files()] == ["03", "04"]
    assert cache.clear() == 2 and cache.info()["entries"] == 0


def test_unwritable_folder_never_fails(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert DiskCache(blocker).store(entry()) is None


CHILD = textwrap.dedent("""
    import json, sys, torch
    from torchburn.compiler import driver
    from torchburn.backend import torchburn_backend

    def f(x, y):
        return torch.sigmoid(x) * y + 1.0

    x, y = torch.randn(8, 16), torch.randn(8, 16)
    out = torch.compile(f, backend=torchburn_backend)(x, y)
    torch.testing.assert_close(out, f(x, y))
    s = driver.STATS
    print(json.dumps({"compiled": s.compiled, "disk_hits": s.disk_hits, "memory_hits": s.memory_hits}))
""")


def run_child(cache_dir: Path) -> tuple[dict[str, int], str]:
    env = dict(os.environ, TORCHBURN_CACHE_DIR=str(cache_dir))
    env.pop("TORCHBURN_DUMP", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_second_process_loads_from_disk_and_corrupt_entries_are_rebuilt(tmp_path: Path) -> None:
    first, _ = run_child(tmp_path)
    assert first == {"compiled": 1, "disk_hits": 0, "memory_hits": 0}
    files = DiskCache(tmp_path).files()
    assert len(files) == 1
    second, _ = run_child(tmp_path)
    assert second == {"compiled": 0, "disk_hits": 1, "memory_hits": 0}

    good = files[0].read_bytes()
    files[0].write_bytes(good[: len(good) - 100])  # truncated by a crash, say
    third, log = run_child(tmp_path)
    assert third == {"compiled": 1, "disk_hits": 0, "memory_hits": 0}
    assert "is corrupt" in log
    assert files[0].read_bytes() == good  # rebuilt, identical
    fourth, _ = run_child(tmp_path)
    assert fourth["disk_hits"] == 1


WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from torchburn.runtime.disk_cache import CacheEntry, DiskCache
    from torchburn.runtime.jit import ObjectCode

    root, key, seed = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    cache = DiskCache(root)
    for i in range(40):
        payload = bytes([seed]) * (1000 + 37 * seed + i)  # a different size each time
        cache.store(CacheEntry(key, "program text", ObjectCode(payload, "t", "c", "f"), "e"))
""")


def test_concurrent_writers_never_expose_a_partial_file(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), KEY, str(seed)], env=env)
               for seed in range(1, 5)]
    reader = DiskCache(tmp_path)
    seen = 0
    while any(w.poll() is None for w in writers):
        e = reader.load(KEY)
        if e is not None:
            seen += 1
            assert len(set(e.object.data)) == 1  # one writer's complete payload
    assert all(w.wait(timeout=120) == 0 for w in writers)
    assert reader.stats.corrupt == 0
    final = reader.load(KEY)
    assert final is not None and len(set(final.object.data)) == 1
    assert not list((tmp_path / "v1").glob("*/.*.tmp"))  # no temporary file left behind


def test_cache_command(tmp_path: Path) -> None:
    DiskCache(tmp_path).store(entry())
    env = dict(os.environ, TORCHBURN_CACHE_DIR=str(tmp_path),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    info = subprocess.run([sys.executable, "-m", "torchburn", "cache", "info"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert info.returncode == 0, info.stderr
    assert f"location: {tmp_path / 'v1'}" in info.stdout and "entries:  1" in info.stdout
    clear = subprocess.run([sys.executable, "-m", "torchburn", "cache", "clear"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert clear.returncode == 0 and "removed 1 entry" in clear.stdout
    assert DiskCache(tmp_path).files() == []
    off = subprocess.run([sys.executable, "-m", "torchburn", "cache", "info"],
                         env=dict(env, TORCHBURN_CACHE_DIR="off"), capture_output=True, text=True, timeout=120)
    assert "off" in off.stdout
