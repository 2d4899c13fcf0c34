"""A GGUF file cut down to its first ``layers`` decoder blocks, for tests and benchmarks.

Compiling and timing the 30-layer default model takes long on a small machine; a copy with
two or four of its blocks keeps everything else real (tokenizer, embedding, output head,
quantization types, the exact bytes of the kept blocks), so our engine, llama.cpp and
transformers can all load it and be compared on it.  Not a user option: the model it makes
answers nonsense.
"""
from __future__ import annotations

from pathlib import Path
from typing import Union

from .gguf_loader import GGUFError, field, open_gguf


def truncate_gguf(src: Union[str, Path], dst: Union[str, Path], layers: int) -> Path:
    """Write ``dst``: ``src`` with only blocks ``0 .. layers-1`` and ``block_count = layers``.

    Metadata and the kept tensors are copied byte for byte (``general.name`` gains a
    ``-<layers>L`` suffix).  Returns ``dst``.
    """
    import gguf

    src, dst = Path(src), Path(dst)
    reader = open_gguf(src)
    arch = field(reader, "general.architecture")
    total = field(reader, f"{arch}.block_count")
    if not isinstance(total, int) or not 1 <= layers <= total:
        raise GGUFError(f"{src.name} has {total} blocks; cannot keep {layers}")
    writer = gguf.GGUFWriter(str(dst), arch)
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = f.contents()
        if key == f"{arch}.block_count":
            value = layers
        elif key == "general.name":
            value = f"{value}-{layers}L"
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, vtype, sub_type=sub)
    kept = [t for t in reader.tensors if not _dropped(t.name, layers)]
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data)
    writer.close()
    return dst


def _dropped(name: str, layers: int) -> bool:
    parts = name.split(".")
    return parts[0] == "blk" and int(parts[1]) >= layers
