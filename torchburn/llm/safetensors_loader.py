"""Loading a Hugging Face folder: ``config.json`` and ``*.safetensors`` (single or sharded).

Tensors are read one at a time from memory-mapped files (``safe_open``), their shapes checked
from the header before the data is touched, so a wrong checkpoint fails before anything large
is allocated, and peak memory stays near the final model's size.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from .config import ConfigError, DecoderConfig, from_hf_dict
from .model import Decoder
from .progress import progress
from .weights import WeightError, WeightSink, meta_decoder


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None
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
        files = sorted({str(v) for v in weight_map.values()})
        paths = [folder / f for f in files]
        for p in paths:
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


def load_safetensors_model(folder: Path, quant: Optional[str]) -> Decoder:
    from safetensors import safe_open

    config = read_config(folder)
    sink = WeightSink(meta_decoder(config), quant)
    files = shard_files(folder)
    opened = []
    try:
        for path in files:
            try:
                handle = safe_open(str(path), framework="pt")
            except Exception as e:  # the library raises its own error types
                raise WeightError(f"{path} is not a readable safetensors file: {e}") from None
            opened.append(handle)
        names = [(h, k) for h in opened for k in h.keys()]
        # Check every shape from the headers first: nothing is read when one is wrong.
        for handle, key in names:
            shape = tuple(handle.get_slice(key).get_shape())
            sink.check(our_name(key), shape)
        label = "quantizing" if quant else "loading"
        for handle, key in progress(names, desc=f"{label} {folder.name}"):
            name = our_name(key)
            if sink.wants(name):
                sink.put(name, handle.get_tensor(key))
    finally:
        opened.clear()
    return sink.finish()
