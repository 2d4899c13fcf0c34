"""The on-disk compile cache: a second process loads object code instead of compiling again.

One file per compiled program, `<TORCHBURN_CACHE_DIR>/v1/<key[:2]>/<key>.tbc`, where the key
(`driver.cache_key`) covers everything that changes the code: the graph's structural hash, the
pipeline with every user pass's `uuid()`, the target CPU and features, the torchburn version and
a digest of its source, and the llvmlite and LLVM versions. A file holds:

    b"TBCACHE1" | u32 header length | header (JSON) | program text | object code (one
                object file, or several end to end: their sizes in the header's `object_parts`)
                | shared library (may be empty, see `shared_lib.py`) | BLAKE3 digest

Next to them, one small file per FX graph (`<key>.tbfx`, see `fx_cache.py`): the partition of
the graph, the launcher of each compiled subgraph and the key of its program file, so a warm
process goes from the ATen graph straight to loaded code, without importing the compiler:

    b"TBGRAPH1" | manifest (JSON) | BLAKE3 digest

and one per loaded model (`<key>.tbw`, see `llm/model/weight_cache.py`): its tensors after
conversion and quantization, mapped by a warm process instead of converting them again.

The program text is the final loop IR as printed (`program.tbir`); on load its signature (buffers,
symbols, workspace, calls) is parsed back to rebuild the launcher without running a pass, and the
header names the entry function and the kernels (for reports). The 32-byte BLAKE3 digest covers everything before it;
a file (of either kind) that is truncated, corrupted or written for another key is deleted and
rebuilt, never loaded, and the event is logged on the `torchburn` logger.

**The cache runs no stranger's code.** A loaded entry is executed (its launcher source, its
object code, its shared library), so an entry is trusted only if this user's torchburn wrote it:
- the digest is keyed: BLAKE3 in keyed mode with a per-user secret, 32 random bytes kept in
  `<TORCHBURN_CACHE_DIR>/key` (created 0600 on first use); an entry planted by someone who cannot
  read the key fails its digest and is deleted, never loaded;
- the folder is created private (0700), entries are written 0600, and the folder (with its key)
  is used only when it is owned by the user and not writable by group or others, as ssh treats
  `~/.ssh`; otherwise the cache is skipped for the process with one warning.

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
from typing import Any, Callable, Optional, TypeVar

import secrets
import stat

from blake3 import blake3

from .shared_lib import ObjectCode

log = logging.getLogger("torchburn")
T = TypeVar("T")

MAGIC = b"TBCACHE1"
FORMAT = "v1"
SUFFIX = ".tbc"
GRAPH_MAGIC = b"TBGRAPH1"
GRAPH_SUFFIX = ".tbfx"
#: A loaded model's tensors (`llm/model/weight_cache.py` writes and reads them); pruned and
#: cleared with the rest.
WEIGHT_SUFFIX = ".tbw"
#: A tuning record (`runtime/tuner.py`): which candidate won for a workload on this target,
#: and the times measured; the same keyed-JSON form as an FX-graph manifest.
RECORD_SUFFIX = ".tbtune"
DIGEST_BYTES = 32
#: Default bound on the cache folder's size.
DEFAULT_MAX_BYTES = 16 << 30
#: Temporary files older than this are leftovers of a writer that died.
STALE_TEMP_SECONDS = 3600


KEY_FILE = "key"
KEY_BYTES = 32


class CorruptEntry(ValueError):
    """A cache file that fails its checks (it is deleted and rebuilt)."""


class UntrustedFolder(OSError):
    """A cache folder (or key file) that others could write: it is not used."""


def _digest(body: bytes, secret: bytes) -> bytes:
    return blake3(body, key=secret).digest()


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
    graph_hits: int = 0
    graph_misses: int = 0


def encode(entry: CacheEntry, secret: bytes) -> bytes:
    """The bytes of a cache file for `entry` (keyed digest included)."""
    program = entry.program_text.encode("utf-8")
    header = json.dumps({
        "key": entry.key, "triple": entry.object.triple, "cpu": entry.object.cpu,
        "features": entry.object.features, "program_bytes": len(program),
        "object_bytes": len(entry.object.data), "shared_bytes": len(entry.object.shared),
        "object_parts": list(entry.object.part_sizes), "entry": entry.entry_name,
        "kernels": [list(k) for k in entry.kernels],
    }, sort_keys=True).encode("utf-8")
    body = b"".join([MAGIC, len(header).to_bytes(4, "little"), header, program, entry.object.data,
                     entry.object.shared])
    return body + _digest(body, secret)


def decode(data: bytes, key: str, secret: bytes) -> CacheEntry:
    """Parse and check a cache file's bytes; raises `CorruptEntry` saying what is wrong."""
    if len(data) < len(MAGIC) + 4 + DIGEST_BYTES:
        raise CorruptEntry(f"truncated ({len(data)} bytes)")
    body, digest = data[:-DIGEST_BYTES], data[-DIGEST_BYTES:]
    if _digest(body, secret) != digest:
        raise CorruptEntry("keyed BLAKE3 digest mismatch (corrupt, or not written by this user's torchburn)")
    if not body.startswith(MAGIC):
        raise CorruptEntry("not a torchburn cache file")
    pos = len(MAGIC)
    header_len = int.from_bytes(body[pos:pos + 4], "little")
    pos += 4
    try:
        header = json.loads(body[pos:pos + header_len].decode("utf-8"))
        pos += header_len
        n_prog, n_obj = int(header["program_bytes"]), int(header["object_bytes"])
        n_shared = int(header.get("shared_bytes", 0))
        part_sizes = tuple(int(n) for n in header.get("object_parts", ()))
        entry_name = str(header["entry"])
        kernels = tuple((str(name), str(origin)) for name, origin in header.get("kernels", ()))
    except (ValueError, KeyError, TypeError) as err:
        raise CorruptEntry(f"bad header: {err}") from None
    if header.get("key") != key:
        raise CorruptEntry(f"written for key {str(header.get('key'))[:16]}...")
    if pos + n_prog + n_obj + n_shared != len(body) or (part_sizes and sum(part_sizes) != n_obj):
        raise CorruptEntry("sizes in the header do not match the file")
    program = body[pos:pos + n_prog].decode("utf-8")
    start = pos + n_prog
    obj = ObjectCode(bytes(body[start:start + n_obj]), header["triple"], header["cpu"], header["features"],
                     bytes(body[start + n_obj:]), part_sizes)
    return CacheEntry(key, program, obj, entry_name, kernels)


def encode_graph(key: str, manifest: dict[str, Any], secret: bytes) -> bytes:
    """The bytes of an FX-graph file: the manifest as JSON (its key included) and a keyed digest."""
    body = GRAPH_MAGIC + json.dumps({"key": key, "manifest": manifest}, sort_keys=True).encode("utf-8")
    return body + _digest(body, secret)


def decode_graph(data: bytes, key: str, secret: bytes) -> dict[str, Any]:
    """Parse and check an FX-graph file's bytes; raises `CorruptEntry` saying what is wrong."""
    if len(data) < len(GRAPH_MAGIC) + DIGEST_BYTES:
        raise CorruptEntry(f"truncated ({len(data)} bytes)")
    body, digest = data[:-DIGEST_BYTES], data[-DIGEST_BYTES:]
    if _digest(body, secret) != digest:
        raise CorruptEntry("keyed BLAKE3 digest mismatch (corrupt, or not written by this user's torchburn)")
    if not body.startswith(GRAPH_MAGIC):
        raise CorruptEntry("not a torchburn graph cache file")
    try:
        doc = json.loads(body[len(GRAPH_MAGIC):].decode("utf-8"))
    except ValueError as err:
        raise CorruptEntry(f"bad manifest: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("manifest"), dict):
        raise CorruptEntry("bad manifest: not an object")
    if doc.get("key") != key:
        raise CorruptEntry(f"written for key {str(doc.get('key'))[:16]}...")
    return doc["manifest"]


class DiskCache:
    """Compiled programs in a folder, keyed by `driver.cache_key`."""

    def __init__(self, root: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.root = Path(root)
        self.folder = self.root / FORMAT
        self.max_bytes = max_bytes
        self.stats = DiskCacheStats()
        #: The per-user secret once the folder passed its checks; False once it failed them.
        self._secret: bytes | bool | None = None

    # ---- trust ----------------------------------------------------------------------------------
    def secret(self) -> Optional[bytes]:
        """The folder's key, creating the folder (0700) and the key (0600) on first use; None
        (after one warning) when the folder cannot be trusted or created."""
        if self._secret is None:
            try:
                self._secret = _open_secret(self.root)
            except OSError as err:
                log.warning("torchburn: not using the disk cache at %s: %s", self.root, err)
                self._secret = False
        return self._secret or None

    def path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}{SUFFIX}"

    def graph_path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}{GRAPH_SUFFIX}"

    def record_path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}{RECORD_SUFFIX}"

    # ---- load and store -------------------------------------------------------------------------
    def load(self, key: str) -> Optional[CacheEntry]:
        """The entry for `key`, or None (missing, or corrupt: then it is deleted and logged)."""
        secret = self.secret()
        entry = None if secret is None else self._load(self.path(key), lambda data: decode(data, key, secret))
        if entry is None:
            self.stats.misses += 1
        else:
            self.stats.hits += 1
        return entry

    def load_graph(self, key: str, count: bool = True) -> Optional[dict[str, Any]]:
        """The FX-graph manifest for `key`, or None (missing, or corrupt: deleted and logged).
        Other keyed-JSON records of a compiled graph (a pinned launcher's build) are kept in
        the same form, not counted in the FX-graph cache's `stats` (``count=False``)."""
        secret = self.secret()
        manifest = None if secret is None else self._load(self.graph_path(key), lambda data: decode_graph(data, key, secret))
        if not count:
            return manifest
        if manifest is None:
            self.stats.graph_misses += 1
        else:
            self.stats.graph_hits += 1
        return manifest

    def store(self, entry: CacheEntry) -> Optional[Path]:
        """Write `entry` atomically; returns its path, or None when the folder is not writable
        (logged: a cache that cannot be written never fails a compilation)."""
        secret = self.secret()
        return None if secret is None else self._store(self.path(entry.key), entry.key, encode(entry, secret))

    def store_graph(self, key: str, manifest: dict[str, Any]) -> Optional[Path]:
        """Write an FX-graph manifest atomically (see `store`)."""
        secret = self.secret()
        return None if secret is None else self._store(self.graph_path(key), key, encode_graph(key, manifest, secret))

    def load_record(self, key: str) -> Optional[dict[str, Any]]:
        """The tuning record for `key`, or None (missing, or corrupt: deleted and logged)."""
        secret = self.secret()
        return None if secret is None else self._load(self.record_path(key), lambda data: decode_graph(data, key, secret))

    def store_record(self, key: str, record: dict[str, Any]) -> Optional[Path]:
        """Write a tuning record atomically (see `store`)."""
        secret = self.secret()
        return None if secret is None else self._store(self.record_path(key), key, encode_graph(key, record, secret))

    def _load(self, path: Path, decoder: Callable[[bytes], T]) -> Optional[T]:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            log.warning("torchburn: cannot read disk cache entry %s: %s", path, err)
            return None
        try:
            value = decoder(data)
        except CorruptEntry as err:
            self.stats.corrupt += 1
            log.warning("torchburn: disk cache entry %s is corrupt (%s); deleting it and compiling again",
                        path, err)
            self._unlink(path)
            return None
        try:
            os.utime(path)  # least recently used goes first when pruning
        except OSError:
            pass
        return value

    def _store(self, path: Path, key: str, data: bytes) -> Optional[Path]:
        tmp = None
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key[:16]}.", suffix=".tmp")  # 0600
            with os.fdopen(fd, "wb") as f:
                f.write(data)
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
        """The program files (object code)."""
        if not self.folder.is_dir():
            return []
        return sorted(self.folder.glob(f"*/*{SUFFIX}"))

    def graph_files(self) -> list[Path]:
        """The FX-graph manifests."""
        if not self.folder.is_dir():
            return []
        return sorted(self.folder.glob(f"*/*{GRAPH_SUFFIX}"))

    def record_files(self) -> list[Path]:
        """The tuning records."""
        if not self.folder.is_dir():
            return []
        return sorted(self.folder.glob(f"*/*{RECORD_SUFFIX}"))

    def weight_files(self) -> list[Path]:
        """The weight caches of loaded models."""
        if not self.folder.is_dir():
            return []
        return sorted(self.folder.glob(f"*/*{WEIGHT_SUFFIX}"))

    def info(self) -> dict[str, object]:
        files, graphs, weights = self.files(), self.graph_files(), self.weight_files()
        tuning = self.record_files()
        sizes = [_size(p) for p in files + graphs + weights + tuning]
        return {"location": str(self.folder), "entries": len(files), "graphs": len(graphs),
                "weights": len(weights), "tuning_records": len(tuning), "bytes": sum(sizes), "max_bytes": self.max_bytes}

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
        for p in self.files() + self.graph_files() + self.weight_files() + self.record_files():
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
        """Delete every entry (programs and graphs) and temporary file; returns how many
        program entries were deleted."""
        files = self.files()
        for p in files + self.graph_files() + self.weight_files() + self.record_files():
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


def _check_private(path: Path, what: str) -> None:
    """Raise `UntrustedFolder` unless `path` is owned by this user and not writable by others."""
    st = path.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise UntrustedFolder(f"{what} {path} is owned by uid {st.st_uid}, not by this user")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedFolder(f"{what} {path} is writable by group or others (mode {stat.filemode(st.st_mode)}); "
                              f"`chmod go-w {path}` to use it")


def _open_secret(root: Path) -> bytes:
    """The per-user key of cache folder `root`, creating folder and key privately if absent."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_private(root, "cache folder")
    folder = root / FORMAT
    folder.mkdir(mode=0o700, exist_ok=True)
    _check_private(folder, "cache folder")
    path = root / KEY_FILE
    for _ in range(2):
        try:  # write to a private temporary, then link: readers never see a partial key
            fd, tmp = tempfile.mkstemp(dir=root, prefix=".key.", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(KEY_BYTES))
            try:
                os.link(tmp, path)  # fails if another process made the key first: keep theirs
            except FileExistsError:
                pass
        finally:
            Path(tmp).unlink(missing_ok=True)
        _check_private(path, "cache key")
        if path.stat().st_mode & (stat.S_IRGRP | stat.S_IROTH):
            raise UntrustedFolder(f"cache key {path} is readable by others; `chmod 600 {path}` to use it")
        key = path.read_bytes()
        if len(key) == KEY_BYTES:
            return key
        path.unlink()  # not a key this code wrote: make a new one
    raise UntrustedFolder(f"cache key {path} could not be created")


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
    from .config import get_config

    cache = _caches.get(root)
    if cache is None:
        cache = _caches[root] = DiskCache(root)
    cache.max_bytes = get_config().cache_max_bytes  # TORCHBURN_CACHE_MAX_GB
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
