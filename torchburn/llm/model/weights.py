"""Putting weights into a `Decoder` built on the meta device: by name, checked, one tensor at a
time, optionally quantized on the way in.

Loaders (safetensors, GGUF) hand over tensors through `WeightSink`; it checks each one against
the shape the config implies (so a wrong checkpoint fails on its first bad tensor, before
anything large is allocated for the rest), converts floats to float32 and quantizes linear
weights when asked.  Which tensors are quantized, by ``quant``:

* ``None``: nothing (GGUF quantized tensors stay in their quantized form regardless);
* ``"int8"``: every linear of every layer as INT8 with groups of 32 (GGUF Q8_0's layout);
* ``"int4"``: every linear of every layer as asymmetric INT4 with groups of 32 (Q4_1's layout);
* both: the token embedding and the output head as INT8 groups of 32 (a tied head shares the
  embedding's bytes).  The norms, biases and rope tables stay float32.

When all is in, each layer's alike sibling projections become one linear (`fuse.py`: q/k/v as
``qkv_proj``, gate/up as ``gate_up_proj``).  What the sink records for the weight cache is the
model as finished, fused tensors under their fused names, and the sink takes those names back
(`put_quantized`/`put_float` of ``layers.3.self_attn.qkv_proj.weight``), so a warm load maps
the fused tensors without copying them.
"""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import nn

from ...quant import BlockEmbedding, BlockWeight, Int4Weight, Int8Weight, QuantizedLinear
from ...quant.quantize import quantize_weight_int4_grouped, quantize_weight_int8
from . import fuse
from .config import DecoderConfig
from .decoder import Decoder, HalfEmbedding, HalfLinear, QuantizedEmbedding, RMSNorm
from .mapped import release

#: None: float32 weights; "int8"/"int4": quantized on load; "f16": the linears' and the token
#: embedding's weights stored as float16 and multiplied in float32 (`HalfLinear`, the GPU engine).
QUANT_CHOICES = (None, "int8", "int4", "f16")
GROUP = 32
#: A tensor is converted and quantized this many float32 bytes of rows at a time, so loading
#: holds the finished model plus about one chunk (and its quantization temporaries).
CHUNK_BYTES = 1 << 18

#: ``rows(start, stop)``: rows ``start:stop`` (along the first dimension) of a tensor.
RowReader = Callable[[int, int], torch.Tensor]


class WeightError(ValueError):
    """A checkpoint that does not fit its configuration (missing, extra or misshapen tensors)."""


def _split(name: str) -> tuple[str, str]:
    module, _, attr = name.rpartition(".")
    return module, attr


class WeightSink:
    """Receives named tensors for a meta-device `Decoder` and materialises it."""

    def __init__(self, model: Decoder, quant: Optional[str],
                 record: Optional[Callable[[str, Union[Int8Weight, Int4Weight, torch.Tensor]], None]] = None,
                 norm_offset: float = 0.0) -> None:
        if quant not in QUANT_CHOICES:
            raise ValueError(f"quant must be one of None, 'int8', 'int4', 'f16'; got {quant!r}")
        self.model = model
        self.quant = quant
        self.expected = {n: tuple(p.shape) for n, p in model.named_parameters()}
        self.done: set[str] = set()
        #: Called by `finish` with each tensor of the finished model (converted, quantized,
        #: fused): what the weight cache stores (`weight_cache.py`).
        self.record = record
        #: The tensors put so far, by name, in order (recorded by `finish`).
        self._put: dict[str, Union[Int8Weight, Int4Weight, torch.Tensor]] = {}
        #: Added to every RMSNorm weight that `put_rows` receives: checkpoints that store a
        #: norm multiplying by ``1 + w`` as ``w`` (Gemma's Hugging Face files) pass 1.
        self.norm_offset = norm_offset

    def _fused_shape(self, name: str) -> Optional[tuple[int, ...]]:
        """The shape of a fused projection's tensor (``layers.0.self_attn.qkv_proj.weight``,
        as Phi-3 checkpoints store it), or None if ``name`` is none."""
        module_name, attr = _split(name)
        parent_name, fused_name = _split(module_name)
        spec = next((f for f in fuse.FUSIONS if f[1] == fused_name and parent_name.endswith("." + f[0])), None)
        if spec is None or attr not in ("weight", "bias"):
            return None
        parts = [f"{parent_name}.{p}.{attr}" for p in spec[2]]
        if any(p not in self.expected for p in parts):
            return None
        rows = sum(self.expected[p][0] for p in parts)
        return (rows,) + self.expected[parts[0]][1:]

    def _check_shape(self, name: str, shape: tuple[int, ...]) -> None:
        expected = self.expected.get(name) or self._fused_shape(name)
        if expected is None:
            return
        if tuple(shape) != expected:
            raise WeightError(
                f"tensor {name!r} has shape {list(shape)}; the config implies {list(expected)}")

    def check(self, name: str, shape: tuple[int, ...]) -> None:
        """Raise `WeightError` now if ``name`` would not fit (call before reading its data)."""
        self._check_shape(name, shape)

    def wants(self, name: str) -> bool:
        return name in self.expected or self._fused_shape(name) is not None

    def keeps(self, name: str) -> bool:
        """Whether a float32 tensor ``name`` goes in as it is (no quantizing, no norm offset):
        then `put` keeps the tensor given, so a view of a mapped file stays one."""
        return self.wants(name) and self._plan(name) == (None, 0.0) and not (self.quant == "f16" and self._halved(name))

    def put(self, name: str, tensor: torch.Tensor) -> None:
        """A float tensor, quantized here if ``quant`` asks for it. A contiguous float32
        tensor that needs no change is kept as it is (`keeps`)."""
        if tensor.dtype == torch.float32 and tensor.is_contiguous() and self.keeps(name):
            self._check_shape(name, tuple(tensor.shape))
            self.put_float(name, tensor)
            return
        self.put_rows(name, tuple(tensor.shape), lambda a, b: tensor[a:b])

    def _plan(self, name: str) -> tuple[Optional[Callable[[torch.Tensor], Union[Int8Weight, Int4Weight]]], float]:
        """(the quantizer ``name`` goes through or None, what is added to it: a norm offset)."""
        module_name, attr = _split(name)
        fused = name not in self.expected
        module = None if fused else self.model.get_submodule(module_name)
        offset = self.norm_offset if attr == "weight" and isinstance(module, RMSNorm) else 0.0
        quantizer: Optional[Callable[[torch.Tensor], Union[Int8Weight, Int4Weight]]] = None
        if attr == "weight" and self.quant in ("int8", "int4") and (module_name == "embed_tokens" or fused
                                                or isinstance(module, nn.Linear)):
            if self.quant == "int8" or module_name in ("lm_head", "embed_tokens"):
                quantizer = _int8
            else:
                quantizer = _int4
        return quantizer, offset

    def _halved(self, name: str) -> bool:
        """Whether `quant="f16"` stores ``name`` as float16: a linear's or the token
        embedding's weight (biases and norms stay float32)."""
        module_name, attr = _split(name)
        if attr != "weight":
            return False
        if name not in self.expected:
            return self._fused_shape(name) is not None
        return isinstance(self.model.get_submodule(module_name), (nn.Linear, nn.Embedding))

    def put_rows(self, name: str, shape: tuple[int, ...], rows: RowReader) -> None:
        """A float tensor of ``shape`` read a chunk of rows at a time through ``rows``: each
        chunk is widened to float32 into the final parameter, or quantized (every group lies
        within one row, so quantizing by rows is exact), and then dropped."""
        if not self.wants(name):
            return
        self._check_shape(name, shape)
        quantizer, offset = self._plan(name)
        width = max(1, _prod(shape[1:]))
        step = max(1, CHUNK_BYTES // (4 * width))
        chunks = [(a, min(a + step, shape[0])) for a in range(0, shape[0], step)] if shape else []
        if quantizer is None:
            value = torch.empty(shape, dtype=torch.float32)
            if not shape:
                value.copy_(rows(0, 1).reshape(()))
            for a, b in chunks:
                value[a:b] = rows(a, b)
            if offset:
                value += offset
            self.put_float(name, value)
            return
        self.put_quantized(name, _concat([quantizer(rows(a, b).to(torch.float32)) for a, b in chunks]))

    def put_float(self, name: str, value: torch.Tensor) -> None:
        """A float32 tensor of the expected shape, kept as it is (no copy, no quantization);
        with `quant="f16"`, a linear's or the embedding's weight is stored as float16."""
        if self.quant == "f16" and self._halved(name):
            value = value.to(torch.float16)
        if self._put_fused(name, value):
            return
        if name not in self.expected:
            return
        self._check_shape(name, tuple(value.shape))
        module_name, attr = _split(name)
        module = self.model.get_submodule(module_name)
        if value.dtype == torch.float16 and attr == "weight":
            _as_half(module)
        setattr(module, attr, nn.Parameter(value, requires_grad=False))
        self.done.add(name)
        self._put[name] = value

    def put_quantized(self, name: str, weight: Union[Int8Weight, Int4Weight, BlockWeight]) -> None:
        """An already quantized weight (from GGUF, or from `put`)."""
        if self._put_fused(name, weight):
            return
        module_name, attr = _split(name)
        self._check_shape(name, (weight.out_features, weight.in_features))
        if attr != "weight":
            raise WeightError(f"tensor {name!r} is quantized; only weights may be")
        if module_name == "embed_tokens":
            if isinstance(weight, BlockWeight):
                self._set_module(module_name, BlockEmbedding(weight))
            elif isinstance(weight, Int8Weight):
                self._set_module(module_name, QuantizedEmbedding(*_int8_parts(weight)))
            else:
                raise WeightError("a quantized token embedding must be INT8 or kept in GGUF blocks; "
                                  "got an INT4 weight")
        else:
            old = self.model.get_submodule(module_name)
            bias = getattr(old, "bias", None)
            layer = QuantizedLinear.from_weight(weight, None)
            if bias is not None:  # keep the meta placeholder; `put` of the bias fills it
                layer.bias = bias
            self._set_module(module_name, layer)
        self.done.add(name)
        self._put[name] = weight

    def _put_fused(self, name: str, value: Union[Int8Weight, Int4Weight, torch.Tensor]) -> bool:
        """A fused projection's tensor as `finish` recorded it (``layers.3.mlp.gate_up_proj.weight``
        or ``.bias``): installed as the fused linear, its parts marked loaded. False for any
        other name."""
        module_name, attr = _split(name)
        parent_name, fused_name = _split(module_name)
        spec = next((f for f in fuse.FUSIONS if f[1] == fused_name and parent_name.endswith("." + f[0])), None)
        if spec is None or attr not in ("weight", "bias"):
            return False
        parent = self.model.get_submodule(parent_name)
        parts = [f"{parent_name}.{p}.{attr}" for p in spec[2]]
        if any(p not in self.expected for p in parts):
            raise WeightError(f"tensor {name!r}: the model has no {attr} for {', '.join(spec[2])}")
        rows = sum(self.expected[p][0] for p in parts)
        if attr == "bias":
            linear = getattr(parent, fused_name, None)
            if linear is None or not isinstance(value, torch.Tensor) or tuple(value.shape) != (rows,):
                raise WeightError(f"tensor {name!r} does not fit its fused linear")
            if isinstance(linear, QuantizedLinear):
                linear._parameters.pop("bias", None)
                linear._buffers["bias"] = value
            else:
                linear.bias = nn.Parameter(value, requires_grad=False)
        else:
            cols = self.expected[parts[0].rpartition(".")[0] + ".weight"][1]
            if isinstance(value, torch.Tensor):
                if tuple(value.shape) != (rows, cols):
                    raise WeightError(f"tensor {name!r} has shape {list(value.shape)}; expected {[rows, cols]}")
                linear = nn.Linear(cols, rows, bias=False, device="meta")
                if value.dtype == torch.float16:
                    _as_half(linear)
                linear.weight = nn.Parameter(value, requires_grad=False)
            else:
                if (value.out_features, value.in_features) != (rows, cols):
                    raise WeightError(f"tensor {name!r} has shape {[value.out_features, value.in_features]}; "
                                      f"expected {[rows, cols]}")
                linear = QuantizedLinear.from_weight(value, None)
            setattr(parent, fused_name, linear)  # its bias, if the parts have one, comes next
            for p in spec[2]:
                setattr(parent, p, None)
        self.done.update(parts)
        self._put[name] = value
        return True

    def _set_module(self, name: str, module: nn.Module) -> None:
        parent_name, attr = _split(name)
        parent = self.model.get_submodule(parent_name) if parent_name else self.model
        setattr(parent, attr, module)

    def finish(self) -> Decoder:
        """Tie the head if the config says so, check completeness, fuse sibling projections,
        record what the model holds, build the rope tables."""
        model = self.model
        if model.config.tie_word_embeddings:
            self._tie()
        missing = sorted(set(self.expected) - self.done)
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise WeightError(f"checkpoint lacks tensors: {', '.join(missing[:5])}{more}")
        for name, param in model.named_parameters():
            if param.is_meta:
                raise WeightError(f"tensor {name!r} was never loaded")
        for i, layer in enumerate(model.layers):
            parts = list(layer.parameters()) + list(layer.buffers())
            for fused in fuse.fuse_layer(layer):
                self._record_fused(f"layers.{i}.{fused}")
            kept = {id(t) for t in list(layer.parameters()) + list(layer.buffers())}
            for t in parts:  # stacked into a fused linear: a mapped part's pages go back
                if id(t) not in kept:
                    release(t)
        if self.record is not None:
            for name, value in self._put.items():
                self.record(name, value)
        model.build_rope_tables()
        return model.eval()

    def _record_fused(self, module_name: str) -> None:
        """Record the fused linear `module_name` in place of its parts."""
        parent_name, fused_name = _split(module_name)
        parts = next(f[2] for f in fuse.FUSIONS if f[1] == fused_name)
        for p in parts:
            for attr in ("weight", "bias"):
                self._put.pop(f"{parent_name}.{p}.{attr}", None)
        linear = self.model.get_submodule(module_name)
        if isinstance(linear, QuantizedLinear):
            self._put[module_name + ".weight"] = linear.quantized_weight()
        else:
            self._put[module_name + ".weight"] = linear.weight.detach()
        if linear.bias is not None:
            self._put[module_name + ".bias"] = linear.bias.detach()

    def _tie(self) -> None:
        if "embed_tokens.weight" not in self.done:
            return
        embed = self.model.embed_tokens
        if isinstance(embed, BlockEmbedding):
            self._set_module("lm_head", QuantizedLinear.from_weight(embed.weight_blocks(), None))
        elif isinstance(embed, QuantizedEmbedding):
            weight = Int8Weight(qweight=embed.qweight, scales=embed.scales)
            self._set_module("lm_head", QuantizedLinear.from_weight(weight, None))
        else:
            assert isinstance(embed, nn.Embedding)
            head = self.model.lm_head
            assert isinstance(head, nn.Linear)
            if embed.weight.dtype == torch.float16:
                _as_half(head)
            head.weight = embed.weight
        self.done.add("lm_head.weight")


def _as_half(module: nn.Module) -> None:
    """Make a float `nn.Linear` or `nn.Embedding` the float16-weight module of the same
    fields (`HalfLinear`, `HalfEmbedding`: the forward converts; no state is added)."""
    if type(module) is nn.Linear:
        module.__class__ = HalfLinear
    elif type(module) is nn.Embedding:
        module.__class__ = HalfEmbedding
    elif not isinstance(module, (HalfLinear, HalfEmbedding)):
        raise WeightError(f"a float16 weight for a {type(module).__name__}; only linears and the token "
                          "embedding store float16")


def _int8(w: torch.Tensor) -> Int8Weight:
    return quantize_weight_int8(w, GROUP, torch.float16)


def _int4(w: torch.Tensor) -> Int4Weight:
    return quantize_weight_int4_grouped(w, GROUP, False, torch.float16)


def _concat(parts: list[Union[Int8Weight, Int4Weight, BlockWeight]]) -> Union[Int8Weight, Int4Weight, BlockWeight]:
    """Quantized row chunks stacked into one weight."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if isinstance(first, Int8Weight):
        return Int8Weight(qweight=torch.cat([p.qweight for p in parts]),  # type: ignore[union-attr]
                          scales=torch.cat([p.scales for p in parts]))
    mins = None if first.mins is None else torch.cat([p.mins for p in parts])  # type: ignore
    return Int4Weight(packed=torch.cat([p.packed for p in parts]),  # type: ignore[union-attr]
                      scales=torch.cat([p.scales for p in parts]), mins=mins,
                      group_size=first.group_size)


def _prod(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _int8_parts(weight: Int8Weight) -> tuple[torch.Tensor, torch.Tensor]:
    return weight.qweight, weight.scales


def meta_decoder(config: DecoderConfig) -> Decoder:
    """A `Decoder` whose parameters take no memory yet. Their random initialisation is
    skipped: every one is replaced on loading, and running `nn.init` on meta tensors loads
    torch's Python reference kernels (seconds of a warm start)."""
    skipped = (nn.Linear, nn.Embedding)
    saved = [(cls, cls.reset_parameters) for cls in skipped]
    try:
        for cls in skipped:
            cls.reset_parameters = _no_init  # type: ignore[method-assign]
        with torch.device("meta"):
            return Decoder(config)
    finally:
        for cls, fn in saved:
            cls.reset_parameters = fn  # type: ignore[method-assign]


def _no_init(self: nn.Module) -> None:
    """`reset_parameters` while a meta decoder is built (see `meta_decoder`)."""
