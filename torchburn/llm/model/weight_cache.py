"""The weight cache: a warm process maps the loaded model's tensors instead of converting them.

Loading a GGUF file decodes about 100 000 metadata strings (the vocabulary and merges) and
converts every Q4_1/Q8_0 tensor into our layouts; a safetensors checkpoint loaded with
``quant="int4"`` quantizes every linear. Both give the same tensors in every process, so the
first load records what it handed to the `WeightSink` (each weight after conversion,
permutation and quantization) and writes it, with the configuration and the tokenizer's
metadata, to one file in the disk cache folder:

    <TORCHBURN_CACHE_DIR>/v1/<key[:2]>/<key>.tbw
    b"TBWEIGHT" | u32 header length | header (JSON) | keyed BLAKE3 digest of all before it
                | zero padding to 64 bytes | the tensors' bytes, each 64-byte aligned

A later load maps the file copy-on-write and builds each tensor as a view of the map (no
read, no copy; pages come in as the first step touches them) and replays the records into a
new sink, so the model is built by the same code as on a miss.

**Views of the source are not copied**: a tensor the loader left as a view of the mapped
source file (`mapped.py`: GGUF blocks the kernels read as they are) is recorded as its offset
in that file (a part spec ``[dtype, shape, offset, nbytes, source]``, ``source`` indexing the
header's ``sources``), and the warm load maps the source again. So an entry holds only what
was converted, the model is mapped from the two files, and nothing is copied into process
memory. The first load, once it has written the entry, rebuilds its model from it the same
way, so the converted tensors it made in anonymous memory are dropped for mapped ones.

**The key** (BLAKE3, ``w`` + hex) covers the source's *metadata*, not its bytes (hashing a
100 MB file would cost a warm start ~0.2 s): the resolved path, then for the file (GGUF) or
for every file of the folder (safetensors) its name, size and modification time in
nanoseconds; plus ``quant``, this format, torch's version and torchburn's source digest (the
converting code). A source rewritten in place changes its mtime, so it misses; only a
rewrite that keeps size and nanosecond mtime would hide (as for `disk_cache.source_digest`).

**Checks**: the header (layout, offsets, configuration) is covered by the keyed digest of
the disk cache (`DiskCache.secret`): a file not written by this user's torchburn, or written
for another key, is deleted and the model is loaded from the source. The tensor bytes are not
hashed (again ~0.2 s): they are data, never executed or used as indices, the file is written
atomically in the private cache folder, and its size must match the header exactly. An
entry larger than half the cache's size bound (`TORCHBURN_CACHE_MAX_GB`) is not written.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
from blake3 import blake3

from ...quant import BlockWeight, Int4Weight, Int8Weight
from ...runtime.config import get_config
from .config import DecoderConfig
from .mapped import MappedFile, locate, trim_heap
from .progress import Step

log = logging.getLogger("torchburn")

MAGIC = b"TBWEIGHT"
SUFFIX = ".tbw"
#: Bump when the file layout or the key's recipe changes.
FORMAT = "weights2"
ALIGN = 64
DIGEST_BYTES = 32

_DTYPES = {str(d): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.uint8,
                               torch.int8, torch.int32, torch.int64)}

#: What a loader hands the sink: an already quantized weight or a float tensor.
Record = tuple[str, Union[Int8Weight, Int4Weight, BlockWeight, torch.Tensor]]


class WeightCacheError(ValueError):
    """A weight cache file that fails its checks (it is deleted and the source loaded)."""


@dataclasses.dataclass
class WeightCacheStats:
    """What the weight cache did in this process (tests and benchmarks read it)."""

    hits: int = 0
    misses: int = 0
    stores: int = 0
    corrupt: int = 0


STATS = WeightCacheStats()


def source_key(path: Path, quant: Optional[str]) -> str:
    """The cache key of loading `path` with `quant` (see the module docstring)."""
    from ...runtime.disk_cache import source_digest

    path = path.resolve()
    h = blake3()
    files = source_files(path)
    for part in (FORMAT, f"torch={torch.__version__}", source_digest(), f"quant={quant}", str(path)):
        h.update(part.encode("utf-8") + b"\0")
    for f in files:
        st = f.stat()
        h.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8"))
    return "w" + h.hexdigest()


def cache_path(key: str) -> Optional[Path]:
    """Where the entry for `key` lives, or None when the disk cache is off."""
    root = get_config().cache_dir
    if root is None:
        return None
    from ...runtime.disk_cache import FORMAT as DISK_FORMAT

    return Path(root) / DISK_FORMAT / key[:2] / f"{key}{SUFFIX}"


def _secret() -> Optional[bytes]:
    from ...runtime.disk_cache import disk_cache

    disk = disk_cache(get_config().cache_dir)
    return None if disk is None else disk.secret()


# ---- config as JSON ---------------------------------------------------------------------------------

def config_to_json(config: DecoderConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)


def config_from_json(d: dict[str, Any]) -> DecoderConfig:
    """The configuration back, tuples as tuples (its repr is part of the step cache key)."""
    values = dict(d)
    for f in dataclasses.fields(DecoderConfig):
        if str(f.type).startswith("tuple") and f.name in values:
            values[f.name] = tuple(values[f.name])
    return DecoderConfig(**values)


# ---- writing ----------------------------------------------------------------------------------------

def _parts(value: Union[Int8Weight, Int4Weight, BlockWeight, torch.Tensor]) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
    if isinstance(value, Int8Weight):
        return "int8", {}, {"qweight": value.qweight, "scales": value.scales}
    if isinstance(value, BlockWeight):
        return "blocks", {"block_type": value.block_type}, {"blocks": value.blocks}
    if isinstance(value, Int4Weight):
        parts = {"packed": value.packed, "scales": value.scales}
        if value.mins is not None:
            parts["mins"] = value.mins
        return "int4", {"group_size": value.group_size}, parts
    return "float", {}, {"value": value}


def source_files(path: Path) -> list[Path]:
    """The files a load of `path` reads (the GGUF file, or a folder's files), resolved."""
    path = path.resolve()
    return [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())


def store(key: str, config: DecoderConfig, records: list[Record], meta: dict[str, Any],
          sources: tuple[Path, ...] = ()) -> Optional[Path]:
    """Write the entry (atomically: a temporary file renamed into place); None when the cache
    is off, untrusted, too small for the model, or not writable (logged). A tensor that is a
    view of a mapped file of ``sources`` is recorded as its place in that file."""
    path, secret = cache_path(key), _secret()
    if path is None or secret is None:
        return None
    entries, blobs, offset = [], [], 0
    names = [str(p) for p in sources]
    for name, value in records:
        kind, attrs, parts = _parts(value)
        layout = {}
        for part, t in parts.items():
            t = t.detach()
            if str(t.dtype) not in _DTYPES:
                return None
            nbytes = t.numel() * t.element_size()
            where = locate(t)
            if where is not None and str(where[0]) in names:
                layout[part] = [str(t.dtype), list(t.shape), where[1], nbytes, names.index(str(where[0]))]
                continue
            t = t.contiguous()
            layout[part] = [str(t.dtype), list(t.shape), offset, nbytes]
            blobs.append((offset, t))
            offset += -(-nbytes // ALIGN) * ALIGN
        entries.append({"name": name, "kind": kind, "attrs": attrs, "parts": layout})
    from ...runtime.disk_cache import disk_cache

    disk = disk_cache(get_config().cache_dir)
    if disk is not None and disk.max_bytes > 0 and offset > disk.max_bytes // 2:
        log.info("torchburn: the converted weights (%d bytes) are too large for the weight cache "
                 "(TORCHBURN_CACHE_MAX_GB)", offset)
        return None
    try:
        # keys in their order, not sorted: a dict of the config (Llama 3's rope_scaling) must
        # read back with the same repr (checked on load; the step cache keys on it)
        header = json.dumps({"key": key, "config": config_to_json(config), "config_repr": repr(config),
                             "entries": entries, "meta": meta, "data_bytes": offset,
                             "sources": names}).encode("utf-8")
    except (TypeError, ValueError) as err:  # metadata that is not plain JSON: not cached
        log.info("torchburn: the weight cache skips this model (%s)", err)
        return None
    head = MAGIC + len(header).to_bytes(4, "little") + header
    head += blake3(head, key=secret).digest()
    start = -(-len(head) // ALIGN) * ALIGN
    tmp = None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key[:16]}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(head.ljust(start, b"\0"))
            for off, t in blobs:
                f.seek(start + off)
                f.write(memoryview(t.view(torch.uint8).reshape(-1).numpy()))
            f.truncate(start + offset)
        os.replace(tmp, path)
    except OSError as err:
        log.warning("torchburn: cannot write weight cache entry %s: %s", path, err)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return None
    if disk is not None and disk.max_bytes > 0:
        disk.prune(disk.max_bytes)
    return path


# ---- reading ----------------------------------------------------------------------------------------

def _read_header(data: Any, key: str, secret: bytes) -> tuple[dict[str, Any], int]:
    """The checked header and where the data starts; raises `WeightCacheError`."""
    if len(data) < len(MAGIC) + 4 or bytes(data[:len(MAGIC)]) != MAGIC:
        raise WeightCacheError("not a torchburn weight cache file")
    n = int.from_bytes(data[len(MAGIC):len(MAGIC) + 4], "little")
    end = len(MAGIC) + 4 + n
    if end + DIGEST_BYTES > len(data):
        raise WeightCacheError("truncated header")
    if blake3(data[:end], key=secret).digest() != bytes(data[end:end + DIGEST_BYTES]):
        raise WeightCacheError("keyed BLAKE3 digest mismatch (corrupt, or not written by this user's torchburn)")
    try:
        header = json.loads(bytes(data[len(MAGIC) + 4:end]).decode("utf-8"))
    except ValueError as err:
        raise WeightCacheError(f"bad header: {err}") from None
    if not isinstance(header, dict) or header.get("key") != key:
        raise WeightCacheError("written for another key")
    start = -(-(end + DIGEST_BYTES) // ALIGN) * ALIGN
    if start + int(header.get("data_bytes", -1)) != len(data):
        raise WeightCacheError("the file's size does not match its header (truncated?)")
    return header, start


def _view(buf: Any, start: int, spec: list[Any], limit: int, sources: list[MappedFile]) -> torch.Tensor:
    if len(spec) == 5:  # a view of a source file
        dtype_name, shape, offset, nbytes, which = spec
        if not 0 <= int(which) < len(sources):
            raise WeightCacheError("a tensor names a source file the entry does not list")
        try:
            return sources[int(which)].tensor(int(offset), int(nbytes), _DTYPES[str(dtype_name)],
                                              tuple(int(s) for s in shape))
        except (ValueError, RuntimeError) as err:
            raise WeightCacheError(f"a view of the source does not fit it ({err})") from None
    dtype_name, shape, offset, nbytes = spec
    dtype = _DTYPES[str(dtype_name)]
    shape = tuple(int(s) for s in shape)
    count = 1
    for s in shape:
        count *= s
    itemsize = torch.empty((), dtype=dtype).element_size()
    if count * itemsize != int(nbytes) or not 0 <= int(offset) <= limit - int(nbytes):
        raise WeightCacheError("a tensor's extent does not match its shape or the file")
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype, count=count, offset=start + int(offset)).view(shape)


def _record(entry: dict[str, Any], buf: Any, start: int, limit: int, sources: list[MappedFile]) -> Record:
    parts = {p: _view(buf, start, spec, limit, sources) for p, spec in entry["parts"].items()}
    kind = entry["kind"]
    if kind == "int8":
        return entry["name"], Int8Weight(qweight=parts["qweight"], scales=parts["scales"])
    if kind == "int4":
        return entry["name"], Int4Weight(packed=parts["packed"], scales=parts["scales"],
                                         mins=parts.get("mins"), group_size=int(entry["attrs"]["group_size"]))
    if kind == "blocks":
        return entry["name"], BlockWeight(blocks=parts["blocks"], block_type=str(entry["attrs"]["block_type"]))
    if kind == "float":
        return entry["name"], parts["value"]
    raise WeightCacheError(f"unknown record kind {kind!r}")


def load(key: str) -> Optional[tuple[DecoderConfig, list[Record], dict[str, Any]]]:
    """(config, records, metadata) of the entry for `key`, tensors as views of the mapped
    file; None when there is none (or it failed its checks: then it is deleted and logged)."""
    path, secret = cache_path(key), _secret()
    if path is None or secret is None:
        return None
    try:
        buf = MappedFile(path).buffer  # registered: `mapped.locate` finds its views
        if buf is None:
            raise WeightCacheError("empty file")
    except FileNotFoundError:
        return None
    except (OSError, WeightCacheError) as err:
        log.warning("torchburn: cannot read weight cache entry %s: %s", path, err)
        return None
    try:
        header, start = _read_header(buf, key, secret)
        config = config_from_json(header["config"])
        if repr(config) != header.get("config_repr"):
            raise WeightCacheError("the configuration does not read back the same")
        limit = int(header["data_bytes"])
        try:
            sources = [MappedFile(Path(p)) for p in header.get("sources", [])]
        except OSError as err:
            raise WeightCacheError(f"cannot map a source file ({err})") from None
        records = [_record(e, buf, start, limit, sources) for e in header["entries"]]
        meta = header.get("meta") or {}
    except (WeightCacheError, KeyError, TypeError, ValueError) as err:
        log.warning("torchburn: weight cache entry %s is corrupt (%s); deleting it and loading "
                    "the source", path, err)
        STATS.corrupt += 1
        path.unlink(missing_ok=True)
        return None
    try:
        os.utime(path)  # least recently used goes first when pruning
    except OSError:
        pass
    return config, records, meta


def replay(config: DecoderConfig, records: list[Record], quant: Optional[str]) -> Any:
    """The model built from cached records, through the same sink as a load from the source."""
    from .weights import WeightSink, meta_decoder

    sink = WeightSink(meta_decoder(config), quant)
    for name, value in records:
        if isinstance(value, torch.Tensor):
            sink.put_float(name, value)
        else:
            sink.put_quantized(name, value)
    return sink.finish()


def cached_load(path: Path, quant: Optional[str],
                build: Callable[[Callable[[str, Any], None]], tuple[Any, dict[str, Any]]]) -> tuple[Any, dict[str, Any]]:
    """(model, metadata) of `path`: from the cache when it holds it, else `build(record)`
    (the loader, with the sink's record hook), then stored for the next process."""
    key = source_key(path, quant) if get_config().cache_dir is not None else None
    if key is not None:
        with Step(f"reading the weights of {path.name} from the disk cache"):
            hit = load(key)
            if hit is not None:
                STATS.hits += 1
                config, records, meta = hit
                return replay(config, records, quant), meta
        STATS.misses += 1
    records: list[Record] = []
    model, meta = build(lambda name, value: records.append((name, value)))
    if key is not None and store(key, model.config, records, meta, tuple(source_files(path))) is not None:
        STATS.stores += 1
        # the converted tensors are in anonymous memory: the same model mapped from the entry
        # just written (and the source) holds none
        del records
        hit = load(key)
        if hit is not None:
            config, cached, _ = hit
            model = replay(config, cached, quant)
    trim_heap()  # the conversion's freed temporaries
    return model, meta
