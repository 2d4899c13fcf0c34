"""A GGUF reader for loading: the metadata as Python values, the tensors as views of the
mapped file.

`gguf.GGUFReader` builds a numpy array for every part of every metadata value: for the
default model's 49152 tokens and 48900 merges that is about 250 000 small arrays, seconds of
a warm start. Loading needs only the values, so this reader decodes them with `struct` from
one memory map, and each tensor's data is a view of that map (no copy; the loader's
importers read the quantized blocks in place). The layout (GGUF v2/v3, little-endian): magic,
version, tensor count, metadata count, the metadata (key, type, value), the tensor
descriptions (name, dims, ggml type, offset), then the data, aligned to
``general.alignment`` (32 by default). `gguf_truncate` and the tests keep using the `gguf`
package's reader, which also gives each field's raw parts.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

MAGIC = b"GGUF"
#: GGUF metadata value types: numbers as `struct` codes, then bool, string, array.
_NUMBERS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 10: "Q", 11: "q", 12: "d"}
_BOOL, _STRING, _ARRAY = 7, 8, 9
_U64 = struct.Struct("<Q")
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
          6: np.float32, 10: np.uint64, 11: np.int64, 12: np.float64}


#: Dimensions of a tensor (ggml has 4).
MAX_DIMS = 4


class GGUFFormatError(ValueError):
    """Bytes that are not a GGUF file this reader understands."""


@dataclass(frozen=True)
class Field:
    """One metadata value (`contents()` as `gguf.ReaderField.contents()` gives it)."""

    name: str
    value: Any

    def contents(self) -> Any:
        return self.value


@dataclass(frozen=True)
class Tensor:
    """One tensor: ``shape`` in ggml's order (fastest dimension first), ``data`` a view of the
    file (the element type for float and integer types, bytes for quantized ones),
    ``data_offset`` where that data starts in the file (as `gguf.ReaderTensor` has it: the
    loader reads tensors with positioned reads, not through the map)."""

    name: str
    tensor_type: Any
    shape: np.ndarray
    data: np.ndarray
    data_offset: int


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        (n,) = struct.unpack_from("<Q", self.buf, self.pos)
        start = self.pos + 8
        if start + n > len(self.buf):
            raise GGUFFormatError("a string runs past the end of the file")
        self.pos = start + n
        return bytes(self.buf[start:self.pos]).decode("utf-8", errors="replace")

    def strings(self, n: int) -> list[str]:
        """``n`` strings in a row (the tokenizer's vocabulary and merges: the hot loop)."""
        buf, pos, size = self.buf, self.pos, len(self.buf)
        length = _U64.unpack_from
        out = []
        append = out.append
        for _ in range(n):
            (k,) = length(buf, pos)
            pos += 8
            if pos + k > size:
                raise GGUFFormatError("a string runs past the end of the file")
            append(str(buf[pos:pos + k], "utf-8", "replace"))
            pos += k
        self.pos = pos
        return out

    def value(self, kind: int) -> Any:
        if kind in _NUMBERS:
            return self.take(_NUMBERS[kind])
        if kind == _BOOL:
            return bool(self.take("B"))
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            sub, n = self.take("I"), self.take("Q")
            if sub in _NUMPY:
                dtype = np.dtype(_NUMPY[sub]).newbyteorder("<")
                end = self.pos + n * dtype.itemsize
                if end > len(self.buf):
                    raise GGUFFormatError("an array runs past the end of the file")
                out = np.frombuffer(self.buf, dtype=dtype, count=n, offset=self.pos).tolist()
                self.pos = end
                return out
            if sub == _STRING:
                return self.strings(n)
            return [self.value(sub) for _ in range(n)]
        raise GGUFFormatError(f"unknown metadata value type {kind}")


class FastGGUFReader:
    """``fields`` (name -> `Field`) and ``tensors`` (list of `Tensor`) of a GGUF file."""

    def __init__(self, path: Path) -> None:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        self.path = Path(path)
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        cur = _Cursor(memoryview(self._map))
        try:
            if bytes(cur.buf[:4]) != MAGIC:
                raise GGUFFormatError("no GGUF magic")
            cur.pos = 4
            version, n_tensors, n_fields = cur.take("I"), cur.take("Q"), cur.take("Q")
            if version not in (2, 3):
                raise GGUFFormatError(f"GGUF version {version} (this reader knows 2 and 3)")
            self.fields: dict[str, Field] = {}
            for _ in range(n_fields):
                name = cur.string()
                if name in self.fields:  # which one would count is a guess: refuse both
                    raise GGUFFormatError(f"the metadata key {name!r} occurs twice")
                self.fields[name] = Field(name, cur.value(cur.take("I")))
            infos = []
            seen: set[str] = set()
            for _ in range(n_tensors):
                name = cur.string()
                if name in seen:
                    raise GGUFFormatError(f"the tensor name {name!r} occurs twice")
                seen.add(name)
                n_dims = cur.take("I")
                if n_dims > MAX_DIMS:
                    raise GGUFFormatError(f"tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})")
                dims = [cur.take("Q") for _ in range(n_dims)]
                infos.append((name, dims, cur.take("I"), cur.take("Q")))
        except struct.error as err:
            raise GGUFFormatError(f"the file ends inside its header ({err})") from None
        align_field = self.fields.get("general.alignment")
        align = align_field.value if align_field is not None else 32
        if type(align) is not int or not 1 <= align <= 1 << 20 or align & (align - 1):
            raise GGUFFormatError(f"general.alignment is {align!r}; it must be a power of two up to 2**20")
        start = -(-cur.pos // align) * align
        self.tensors: list[Tensor] = []
        for name, dims, raw_type, offset in infos:
            try:
                kind = GGMLQuantizationType(raw_type)
            except ValueError:
                raise GGUFFormatError(
                    f"tensor {name!r} has ggml type {raw_type}, which mainline llama.cpp does not define "
                    f"(a type only a fork writes); torchburn does not support it") from None
            block, type_size = GGML_QUANT_SIZES[kind]
            n = math.prod(dims)  # Python ints: numpy's product of uint64 would wrap
            nbytes = n * type_size // block
            if nbytes > len(self._map):
                raise GGUFFormatError(f"tensor {name!r} of shape {dims} needs {nbytes} bytes; "
                                      f"the file has {len(self._map)}")
            first = start + offset
            raw = self._map[first:first + nbytes]
            self.tensors.append(Tensor(name, kind, np.array(dims, dtype=np.uint64),
                                       _typed(raw, kind, dims, block, type_size), first))


def _typed(raw: np.ndarray, kind: Any, dims: list[int], block: int, type_size: int) -> np.ndarray:
    """The tensor's bytes as `gguf.GGUFReader` shapes them: float and integer types as their
    elements (dims reversed), quantized ones as rows of bytes."""
    elements: dict[str, Callable[[], np.dtype]] = {"F32": np.float32, "F16": np.float16, "F64": np.float64,
                                                   "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64}
    shape = tuple(reversed(dims))
    dtype = elements.get(kind.name)
    if dtype is not None:
        if raw.size % np.dtype(dtype).itemsize:
            return raw  # short (a truncated file): the loader reports the size
        out = raw.view(dtype)
        return out.reshape(shape) if out.size == int(np.prod(shape)) else out
    if shape and raw.size == int(np.prod(shape[:-1])) * (shape[-1] // block * type_size):
        return raw.reshape(*shape[:-1], shape[-1] // block * type_size)
    return raw  # short (a truncated file): the loader reports the size
