"""Where a decode step's time goes, per kernel (``benchmark --profile``, ``TORCHBURN_PROFILE=1``).

The step's launcher is timed kernel by kernel (`backend/kernel_timing.py`: each kernel call
built again as a program of its own, called in turn with the same pointers; each call includes
the ~2 us of ctypes). Each kernel gets its wall time and the calling thread's CPU time
(`time.thread_time`): on a shared machine the second leaves out the time the thread waited
descheduled, but counts the time it spun at a parallel loop's closing barrier waiting for
the other threads.  Each kernel is named by its origin (the ATen ops and the model module it
came from, with the module's ``forward`` as ``file:line``); quantized linears, whose origin is
empty, by their weight's shape and kind.
"""
from __future__ import annotations

import inspect
import re
from collections import defaultdict
from typing import Any

import torch
from torch import nn

from ...backend.kernel_timing import KernelTime, KernelTimer, capture_launchers
from ...compiler.engines import QUANTIZED_LINEAR_OPS

__all__ = ["KernelTime", "StepProfiler", "capture_launchers", "profile_decode"]


class StepProfiler(KernelTimer):
    """A step's `KernelTimer`, its kernels described by what they compute and where from."""

    def __init__(self, launcher: Any, model: nn.Module) -> None:
        super().__init__(launcher)
        origins = dict(launcher.keepalive.kernels)
        for k, c in zip(self.kernels, self.program.calls):
            k.what, k.where = _describe(self.program, c, origins.get(c.kernel, ""), model)

    def table(self, top: int = 25) -> str:
        n = max(self.calls, 1)
        total = sum(k.seconds for k in self.kernels) / n
        total_cpu = sum(k.cpu_seconds for k in self.kernels) / n
        rows = sorted(self.kernels, key=lambda k: -k.seconds)
        lines = [f"decode step: {total * 1e3:.3f} ms ({total_cpu * 1e3:.3f} ms CPU of the calling thread) in "
                 f"{len(self.kernels)} kernel calls (mean of {n} steps; each call includes ~2 us of ctypes)",
                 "| kernel | us/step | CPU us/step | share | what | model source |", "|---|---:|---:|---:|---|---|"]
        for k in rows[:top]:
            lines.append(f"| {k.kernel} | {k.seconds / n * 1e6:.1f} | {k.cpu_seconds / n * 1e6:.1f} | "
                         f"{100 * k.seconds / n / total:.1f}% | {k.what} | {k.where} |")
        if len(rows) > top:
            rest = sum(k.seconds for k in rows[top:]) / n
            rest_cpu = sum(k.cpu_seconds for k in rows[top:]) / n
            lines.append(f"| ({len(rows) - top} more) | {rest * 1e6:.1f} | {rest_cpu * 1e6:.1f} | "
                         f"{100 * rest / total:.1f}% | | |")
        by_place: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
        for k in self.kernels:
            entry = by_place[k.where]
            entry[0] += k.seconds / n
            entry[1] += k.cpu_seconds / n
            entry[2] += 1
        lines.append("by model source (wall us, CPU us, calls per step): " + "; ".join(
            f"{w or '?'} {s[0] * 1e6:.0f} / {s[1] * 1e6:.0f} us in {s[2]:.0f}"
            for w, s in sorted(by_place.items(), key=lambda x: -x[1][0])[:10]))
        return "\n".join(lines)


_MODULE = re.compile(r"@ (\S+) \((\w+)\)")
#: ATen ops that only view or reorder their input (``_describe`` names a kernel by the others).
_VIEW_OPS = frozenset({"view", "_unsafe_view", "reshape", "permute", "transpose.int", "t", "expand",
                       "unsqueeze", "squeeze.dim", "select.int", "slice.Tensor", "split.Tensor",
                       "split_with_sizes", "chunk", "unbind.int", "alias"})


def _op_name(entry: str) -> str:
    """``aten.split_with_sizes.default @ model.layers.0...`` -> ``split_with_sizes``."""
    return entry.split(" @ ")[0].replace("aten.", "").replace(".default", "")


def _describe(program: Any, call: Any, origin: str, model: nn.Module) -> tuple[str, str]:
    """(what the kernel computes, the model source it came from)."""
    kernel = program.kernel(call.kernel)
    attrs = dict(kernel.attrs)
    ops = [_op_name(o) for o in origin.split("; ") if o]
    fused = ", ".join(dict.fromkeys(ops))
    if "qlinear" in attrs:  # named by the weight (its origin is the custom op, which says less)
        fused = ", ".join(dict.fromkeys(o for o in ops if o.split(".")[-1] not in QUANTIZED_LINEAR_OPS))
        weight = next((p for p in kernel.params[1:] if p.dtype.name in ("u8", "i8")), None)
        if weight is not None:
            rows, cols = (int(d.value) for d in weight.shape)
            kind = "int4" if weight.dtype.name == "u8" else "int8"
            in_features = cols * 2 if kind == "int4" else cols
            block = re.search(r"block=(\w+)", attrs["qlinear"])
            if block is not None:  # ggml blocks (`ir/qblocks.py`): the type names the layout
                from ...ir.qblocks import BLOCK_TYPES

                kind = block.group(1)
                in_features = cols // BLOCK_TYPES[kind].nbytes * BLOCK_TYPES[kind].block
            what = f"quantized linear {kind} [{rows} x {in_features}]" + (f" + {fused}" if fused else "")
            return what, _linear_source(model, rows, in_features)
    entries = [o for o in origin.split("; ") if o]
    # views and layout changes (a fused linear's output split into q, k, v) name no kernel
    # (when there are other ops): the deepest module of the ops that compute names it
    computing = [o for o in entries if _op_name(o) not in _VIEW_OPS]
    modules = _MODULE.findall("; ".join(computing or entries))
    where = ""
    if modules:
        path, cls = max(modules, key=lambda m: m[0].count("."))
        where = f"{_generic(path)} {_source_line(model, path, cls)}"
    return fused or attrs.get("gemm", "") or kernel.name, where


def _generic(path: str) -> str:
    return re.sub(r"\.layers\.\d+\.", ".layers.*.", path)


def _source_line(model: nn.Module, path: str, cls: str) -> str:
    sub = path[len("model."):] if path.startswith("model.") else ""
    try:
        module = model.get_submodule(sub) if sub else model
        fn = type(module).forward
        file = inspect.getsourcefile(fn) or "?"
        line = inspect.getsourcelines(fn)[1]
        short = file.split("torchburn/", 1)[-1]
        return f"({short}:{line} {cls}.forward)"
    except (AttributeError, OSError, TypeError):
        return f"({cls})"


def _linear_source(model: nn.Module, rows: int, in_features: int) -> str:
    from ...quant import QuantizedLinear

    names = sorted({_generic("model." + n).split(".")[-1] for n, m in model.named_modules()
                    if isinstance(m, QuantizedLinear) and m.out_features == rows
                    and m.in_features == in_features})
    return "/".join(names) + " (torchburn/quant/linear.py QuantizedLinear.forward)" if names else ""


def profile_decode(llm: Any, steps: int = 32, filled: int = 64, batch: int = 1) -> StepProfiler:
    """Compile a fresh decode step of ``llm`` for ``batch`` rows (cache hits make this quick),
    then time ``steps`` decode steps kernel by kernel at ``filled`` cached slots per row."""
    if not llm.compiled:
        raise ValueError("--profile needs the compiled engine (not --eager)")
    cache = llm.cache_for(batch)
    starts = torch.zeros(batch, dtype=torch.long)
    ids = torch.full((batch, 1), 100, dtype=torch.long)
    torch._dynamo.reset()
    if getattr(llm, "steps", None) is not None:  # the step cache would reuse the launcher it has
        llm.steps.entries.clear()
    with torch.no_grad(), capture_launchers() as made:
        llm.run_step(cache, ids, filled, starts)
    if not made:
        raise RuntimeError("the decode step built no native launcher to profile")
    prof = StepProfiler(made[-1], llm.model)
    with torch.no_grad(), prof.active():
        for _ in range(steps):
            llm.run_step(cache, ids, filled, starts)
    return prof
