"""The on-disk compile cache: a second process loads object code instead of compiling again.

One file per compiled program, `<TORCHBURN_CACHE_DIR>/v1/<key[:2]>/<key>.tbc`, where the key
(`driver.cache_key`) covers everything that changes the code: the graph's structural hash, the
pipeline with every user pass's `uuid()`, the target CPU and features, the torchburn version and
a digest of its source, and the llvmlite and LLVM versions. A file holds:

    b"TBCACHE1" | u32 header length | header (JSON) | program text | object code | BLAKE3 digest

The program text is the final loop IR as printed (`program.tbir`); on load its signature (buffers,
symbols, workspace, calls) is parsed back to rebuild the launcher without running a pass, and the
header names the entry function and the kernels (for reports). The 32-byte BLAKE3 digest covers everything before it;
a file that is truncated, corrupted or written for another key is deleted and rebuilt, never
loaded, and the event is logged on the `torchburn` logger.

Writers never expose partial files: each writes a temporary file in the same folder and renames
it into place with `os.replace` (atomic on POSIX and Windows), so concurrent processes compiling
the same graph both succeed and the last rename wins with an identical, complete file. When
the folder grows past `max_bytes`, the least recently used entries (by modification time,
refreshed on every load) are removed.

    python -m torchburn cache info     # location, entries, size
    python -m torchburn cache clear    # remove every entry
"""
from __future__ import annotations

import functools
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from blake3 import blake3

from .jit import ObjectCode

log = logging.getLogger("torchburn")

MAGIC = b"TBCACHE1"
FORMAT = "v1"
SUFFIX = ".tbc"
DIGEST_BYTES = 32
#: Default bound on the cache folder's size.
DEFAULT_MAX_BYTES = 1 << 30
#: Temporary files older than this are leftovers of a writer that died.
STALE_TEMP_SECONDS = 3600


class CorruptEntry(ValueError):
    """A cache file that fails its checks (it is deleted and rebuilt)."""


@dataclass(frozen=True)
class CacheEntry:
    """What a cache file holds."""

    key: str
    program_text: str
    object: ObjectCode
    #: The exported entry function's symbol.
    entry_name: str
    #: `(name, origin)` of each kernel, for reports, without parsing the kernels.
    kernels: tuple[tuple[str, str], ...] = ()


@dataclass
class DiskCacheStats:
    hits: int = 0
    misses: int = 0
    stores: int = 0
    corrupt: int = 0


def encode(entry: CacheEntry) -> bytes:
    """The bytes of a cache file for `entry` (digest included)."""
    program = entry.program_text.encode("utf-8")
    header = json.dumps({
        "key": entry.key, "triple": entry.object.triple, "cpu": entry.object.cpu,
        "features": entry.object.features, "program_bytes": len(program),
        "object_bytes": len(entry.object.data), "entry": entry.entry_name,
        "kernels": [list(k) for k in entry.kernels],
    }, sort_keys=True).encode("utf-8")
    body = b"".join([MAGIC, len(header).to_bytes(4, "little"), header, program, entry.object.data])
    return body + blake3(body).digest()


def decode(data: bytes, key: str) -> CacheEntry:
    """Parse and check a cache file's bytes; raises `CorruptEntry` saying what is wrong."""
    if len(data) < len(MAGIC) + 4 + DIGEST_BYTES:
        raise CorruptEntry(f"truncated ({len(data)} bytes)")
    body, digest = data[:-DIGEST_BYTES], data[-DIGEST_BYTES:]
    if blake3(body).digest() != digest:
        raise CorruptEntry("BLAKE3 digest mismatch")
    if not body.startswith(MAGIC):
        raise CorruptEntry("not a torchburn cache file")
    pos = len(MAGIC)
    header_len = int.from_bytes(body[pos:pos + 4], "little")
    pos += 4
    try:
        header = json.loads(body[pos:pos + header_len].decode("utf-8"))
        pos += header_len
        n_prog, n_obj = int(header["program_bytes"]), int(header["object_bytes"])
        entry_name = str(header["entry"])
        kernels = tuple((str(name), str(origin)) for name, origin in header.get("kernels", ()))
    except (ValueError, KeyError, TypeError) as err:
        raise CorruptEntry(f"bad header: {err}") from None
    if header.get("key") != key:
        raise CorruptEntry(f"written for key {str(header.get('key'))[:16]}...")
    if pos + n_prog + n_obj != len(body):
        raise CorruptEntry("sizes in the header do not match the file")
    program = body[pos:pos + n_prog].decode("utf-8")
    obj = ObjectCode(bytes(body[pos + n_prog:]), header["triple"], header["cpu"], header["features"])
    return CacheEntry(key, program, obj, entry_name, kernels)


class DiskCache:
    """Compiled programs in a folder, keyed by `driver.cache_key`."""

    def __init__(self, root: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.root = Path(root)
        self.folder = self.root / FORMAT
        self.max_bytes = max_bytes
        self.stats = DiskCacheStats()

    def path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}{SUFFIX}"

    # ---- load and store -------------------------------------------------------------------------
    def load(self, key: str) -> Optional[CacheEntry]:
        """The entry for `key`, or None (missing, or corrupt: then it is deleted and logged)."""
        path = self.path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self.stats.misses += 1
            return None
        except OSError as err:
            log.warning("torchburn: cannot read disk cache entry %s: %s", path, err)
            self.stats.misses += 1
            return None
        try:
            entry = decode(data, key)
        except CorruptEntry as err:
            self.stats.corrupt += 1
            self.stats.misses += 1
            log.warning("torchburn: disk cache entry %s is corrupt (%s); deleting it and compiling again",
                        path, err)
            self._unlink(path)
            return None
        try:
            os.utime(path)  # least recently used goes first when pruning
        except OSError:
            pass
        self.stats.hits += 1
        return entry

    def store(self, entry: CacheEntry) -> Optional[Path]:
        """Write `entry` atomically; returns its path, or None when the folder is not writable
        (logged: a cache that cannot be written never fails a compilation)."""
        path = self.path(entry.key)
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{entry.key[:16]}.", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(encode(entry))
            os.chmod(tmp, 0o644)  # mkstemp makes it private; entries hold nothing secret
            os.replace(tmp, path)
        except OSError as err:
            log.warning("torchburn: cannot write disk cache entry %s: %s", path, err)
            if tmp is not None:
                self._unlink(Path(tmp))
            return None
        self.stats.stores += 1
        if self.max_bytes > 0:
            self.prune(self.max_bytes)
        return path

    # ---- maintenance ---------------------------------------------------------------------------
    def files(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return sorted(self.folder.glob(f"*/*{SUFFIX}"))

    def info(self) -> dict[str, object]:
        files = self.files()
        sizes = [_size(p) for p in files]
        return {"location": str(self.folder), "entries": len(files), "bytes": sum(sizes),
                "max_bytes": self.max_bytes}

    def prune(self, max_bytes: int) -> int:
        """Delete least recently used entries (and stale temporaries) until the folder holds
        at most `max_bytes`; returns how many entries were deleted."""
        now = time.time()
        for tmp in self.folder.glob("*/.*.tmp"):
            try:
                if now - tmp.stat().st_mtime > STALE_TEMP_SECONDS:
                    self._unlink(tmp)
            except OSError:
                pass
        entries = []
        for p in self.files():
            try:
                st = p.stat()
            except OSError:
                continue
            entries.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in entries)
        removed = 0
        for _, size, p in sorted(entries):
            if total <= max_bytes:
                break
            self._unlink(p)
            total -= size
            removed += 1
        if removed:
            log.info("torchburn: disk cache pruned %d entries to stay under %d bytes", removed, max_bytes)
        return removed

    def clear(self) -> int:
        """Delete every entry and temporary file; returns how many entries were deleted."""
        files = self.files()
        for p in files:
            self._unlink(p)
        if self.folder.is_dir():
            for tmp in self.folder.glob("*/.*.tmp"):
                self._unlink(tmp)
            for sub in self.folder.iterdir():
                try:
                    sub.rmdir()
                except OSError:
                    pass
        return len(files)

    @staticmethod
    def _unlink(path: Path) -> None:
        try:
            path.unlink()
        except OSError:
            pass


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


_caches: dict[Path, DiskCache] = {}


def disk_cache(root: Optional[Path]) -> Optional[DiskCache]:
    """The cache for folder `root` (None: the disk cache is off)."""
    if root is None:
        return None
    cache = _caches.get(root)
    if cache is None:
        cache = _caches[root] = DiskCache(root)
    return cache


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """A fingerprint of torchburn's own source files (path, size and modification time of
    each), part of every cache key: a checkout whose compiler code changed never loads object
    code compiled by the old one. Stat-based rather than a hash of the contents, which would
    cost a warm start ~20 ms; a changed file only hides from it if it keeps its size and its
    nanosecond timestamp."""
    package = Path(__file__).resolve().parent.parent
    h = blake3()
    for dirpath, dirnames, filenames in os.walk(package):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            h.update(f"{os.path.relpath(path, package)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def llvm_version() -> str:
    import llvmlite
    import llvmlite.binding as llvm

    return f"llvmlite={llvmlite.__version__} llvm={'.'.join(map(str, llvm.llvm_version_info))}"
