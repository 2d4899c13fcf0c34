"""Loading a Hugging Face folder: ``config.json`` and ``*.safetensors`` (single or sharded).

Every file is opened with ``safe_open`` first (which validates it) and every shape checked from
the headers before any data is touched, so a wrong checkpoint fails before anything large is
allocated.  The data is then read a chunk of rows at a time with positioned reads straight from
the file (`TensorFile`), each chunk widened or quantized into the final model and dropped.  Not
through a memory map: pages of a mapped file count in the process's resident memory until it
is unmapped, so a mapped checkpoint being quantized peaks at the whole float file plus the
quantized model; read in chunks, the peak stays near the final model's size plus one chunk
(tests/llm/test_load_memory.py measures it).
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, BinaryIO, Callable, Optional

import torch

from .config import ConfigError, DecoderConfig, from_hf_dict
from .decoder import Decoder
from .mapped import MappedFile
from .progress import progress
from .validate import check_layers_present, loads_bounded
from .weights import WeightError, WeightSink, meta_decoder


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path`` (nesting bounded, `validate.loads_bounded`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not UTF-8 text: {e}") from None
    data = loads_bounded(text, str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return data


def read_config(folder: Path) -> DecoderConfig:
    path = folder / "config.json"
    if not path.is_file():
        raise ConfigError(f"{folder} has no config.json")
    return from_hf_dict(read_json(path), str(path))


def shard_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise WeightError(f"{index} has no weight_map")
        if not all(isinstance(v, str) for v in weight_map.values()):
            raise WeightError(f"{index}: every weight_map value must be a file name")
        files = sorted(set(weight_map.values()))
        root = folder.resolve()
        paths = [folder / f for f in files]
        for f, p in zip(files, paths):
            if Path(f).is_absolute() or not p.resolve().is_relative_to(root):
                raise WeightError(f"{index} names {f!r}, which is outside the model folder")
            if not p.is_file():
                raise WeightError(f"{index} names {p.name}, which is missing")
        return paths
    paths = sorted(folder.glob("*.safetensors"))
    if not paths:
        raise WeightError(f"{folder} has no *.safetensors files")
    return paths


def our_name(hf_name: str) -> str:
    """``model.layers.0.mlp.up_proj.weight`` -> ``layers.0.mlp.up_proj.weight``."""
    return hf_name.removeprefix("model.")


#: safetensors dtype names we read (floats are widened to float32 by the sink).
DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "F64": torch.float64}


class TensorFile:
    """Reads row ranges of the tensors of one safetensors file by their header offsets."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        self.base = 8 + size
        self.entries = {k: v for k, v in header.items() if k != "__metadata__"}
        self._file: Optional[BinaryIO] = None
        self._map: Optional[MappedFile] = None

    def view(self, key: str) -> Optional[torch.Tensor]:
        """Tensor ``key`` as a view of the mapped file when it is float32 and aligned, else
        None (`rows` reads it)."""
        entry = self.entries[key]
        begin, end = (int(x) for x in entry["data_offsets"])
        shape = self.shape(key)
        n = 1
        for d in shape:
            n *= d
        if entry["dtype"] != "F32" or (self.base + begin) % 4 or end - begin != 4 * n:
            return None
        if self._map is None:
            self._map = MappedFile(self.path)
        return self._map.tensor(self.base + begin, end - begin, torch.float32, shape)

    def __enter__(self) -> "TensorFile":
        self._file = self.path.open("rb", buffering=0)
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._file is not None
        self._file.close()

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self.entries[key]["shape"])

    def rows(self, key: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` of tensor ``key`` (a fresh tensor in the file's dtype)."""
        entry = self.entries[key]
        dtype = DTYPES.get(entry["dtype"])
        if dtype is None:
            raise WeightError(f"{self.path.name}: tensor {key!r} has dtype {entry['dtype']}; "
                              f"only {', '.join(DTYPES)} are read")
        shape = self.shape(key)
        row = 1
        for d in shape[1:]:
            row *= d
        item = torch.empty((), dtype=dtype).element_size()
        begin, end = (int(x) for x in entry["data_offsets"])
        if not shape:
            start, stop = 0, 1
        out = torch.empty((stop - start, *shape[1:]), dtype=dtype)
        count = (stop - start) * row * item
        first = begin + start * row * item
        if first + count > end:
            raise WeightError(f"{self.path.name}: tensor {key!r} overruns its data")
        assert self._file is not None, "use TensorFile as a context manager to read"
        self._file.seek(self.base + first)
        view = memoryview(out.reshape(-1).view(torch.uint8).numpy())
        got = 0
        while got < count:
            n = self._file.readinto(view[got:])
            if not n:
                raise WeightError(f"{self.path.name} ends inside tensor {key!r} (truncated)")
            got += n
        return out if shape else out.reshape(())


def load_safetensors_model(folder: Path, quant: Optional[str],
                           record: Optional[Callable[[str, Any], None]] = None) -> Decoder:
    from safetensors import safe_open

    config = read_config(folder)
    files = shard_files(folder)
    tables = []
    for path in files:
        try:
            with safe_open(str(path), framework="pt"):  # validates the header and offsets
                pass
        except Exception as e:  # the library raises its own error types
            raise WeightError(f"{path} is not a readable safetensors file: {e}") from None
        tables.append(TensorFile(path))
    owner: dict[str, Path] = {}
    for table in tables:
        for key in table.entries:
            if key in owner:  # which copy would load is a guess: refuse
                raise WeightError(f"tensor {key!r} is in two shards: {owner[key].name} and {table.path.name}")
            owner[key] = table.path
    check_layers_present(config.num_hidden_layers, owner, "num_hidden_layers", str(folder / "config.json"))
    sink = WeightSink(meta_decoder(config), quant, record, norm_offset=config.family.hf_norm_offset)
    # Check every shape from the headers first: nothing is read when one is wrong.
    for table in tables:
        for key in table.entries:
            sink.check(our_name(key), table.shape(key))
    names = [(t, k) for t in tables for k in t.entries if sink.wants(our_name(k))]
    label = "quantizing" if quant else "loading"
    def nbytes(item: tuple[TensorFile, str]) -> int:
        begin, end = item[0].entries[item[1]]["data_offsets"]
        return int(end) - int(begin)

    bar = iter(progress(names, desc=f"{label} {folder.name}",
                        total=sum(nbytes(n) for n in names), size=nbytes))
    for table in tables:
        with table:
            for key in table.entries:
                name = our_name(key)
                if sink.wants(name):
                    next(bar, None)
                    view = table.view(key) if sink.keeps(name) else None
                    if view is not None:
                        sink.put(name, view)
                        continue
                    sink.put_rows(name, table.shape(key),
                                  lambda a, b, t=table, k=key: t.rows(k, a, b))
    next(bar, None)
    return sink.finish()
