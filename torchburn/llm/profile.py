"""Where a decode step's time goes, per kernel (``benchmark --profile``, ``TORCHBURN_PROFILE=1``).

A compiled step is one native call that runs its kernels in order.  To time them one by one,
each kernel call of the step's program is built again as a program of its own (same
buffers, symbols and workspace layout, one call), and the launcher's native entry is swapped
for a function that calls those one-kernel programs in turn with the same pointers, timing
each.  The results are the same (the kernels are the same code, run in the same order on the
same memory); only the ~2 us of a ctypes call per kernel is added, and it is counted in
each kernel's time.  Each kernel gets its wall time and the calling thread's CPU time
(`time.thread_time`): on a shared machine the second leaves out the time the thread waited
descheduled, but counts the time it spun at a parallel loop's closing barrier waiting for
the other threads.  Each kernel is named by its origin (the ATen ops and the model module it
came from, with the module's ``forward`` as ``file:line``); quantized linears, whose origin is
empty, by their weight's shape and kind.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
import time
from collections import defaultdict
from typing import Any, Callable, Iterator

import torch
from torch import nn


@dataclasses.dataclass
class KernelTime:
    """One kernel call of the step: what it is, where it came from, its seconds per step."""

    index: int
    kernel: str
    what: str
    where: str
    seconds: float = 0.0
    cpu_seconds: float = 0.0


@contextlib.contextmanager
def capture_launchers() -> Iterator[list[Any]]:
    """The launchers built while the block runs (the graphs compiled or loaded in it)."""
    from ..backend.launcher import Launcher

    made: list[Any] = []
    init = Launcher.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    Launcher.__init__ = spy  # type: ignore[method-assign]
    try:
        yield made
    finally:
        Launcher.__init__ = init  # type: ignore[method-assign]


def _one_call_programs(program: Any) -> list[Any]:
    """For each call of ``program``, the program doing only that call."""
    return [dataclasses.replace(program, name=f"{program.name}_prof{i}", calls=(call,),
                                kernels=(program.kernel(call.kernel),))
            for i, call in enumerate(program.calls)]


def _build(programs: list[Any]) -> list[Callable[..., None]]:
    from ..codegen.llvm.module import entry_name
    from ..compiler.driver import configured_target
    from ..compiler.engines import engine_for

    target = configured_target()
    engine = engine_for(target)
    entries = []
    for p in programs:
        built = engine.build(p, target, None, shared=False)
        entries.append(built.native.entry(entry_name(p)))  # keeps its module alive
    return entries


class StepProfiler:
    """Swaps the native entry of a compiled step for per-kernel timed calls."""

    def __init__(self, launcher: Any, model: nn.Module) -> None:
        compiled = launcher.keepalive
        self.launcher = launcher
        self.program = compiled.full_program()
        self.entries = _build(_one_call_programs(self.program))
        origins = dict(compiled.kernels)
        self.kernels = [KernelTime(i, c.kernel, *_describe(self.program, c, origins.get(c.kernel, ""), model))
                        for i, c in enumerate(self.program.calls)]
        self.calls = 0

    def _entry(self, buffers: Any, symbols: Any, workspace: Any) -> None:
        clock, cpu = time.perf_counter, time.thread_time
        for k, entry in zip(self.kernels, self.entries):
            t0, c0 = clock(), cpu()
            entry(buffers, symbols, workspace)
            k.seconds += clock() - t0
            k.cpu_seconds += cpu() - c0
        self.calls += 1

    @contextlib.contextmanager
    def active(self) -> Iterator["StepProfiler"]:
        g = self.launcher.launch.__globals__
        native = g["_entry"]
        g["_entry"] = self._entry
        try:
            yield self
        finally:
            g["_entry"] = native

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
    if "qlinear" in attrs:  # quantized linears carry no origin of their own: name the weight
        weight = next((p for p in kernel.params[1:] if p.dtype.name in ("u8", "i8")), None)
        if weight is not None:
            rows, cols = (int(d.value) for d in weight.shape)
            kind = "int4" if weight.dtype.name == "u8" else "int8"
            in_features = cols * 2 if kind == "int4" else cols
            block = re.search(r"block=(\w+)", attrs["qlinear"])
            if block is not None:  # ggml blocks (`ir/qblocks.py`): the type names the layout
                from ..ir.qblocks import BLOCK_TYPES

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
    from ..quant import QuantizedLinear

    names = sorted({_generic("model." + n).split(".")[-1] for n, m in model.named_modules()
                    if isinstance(m, QuantizedLinear) and m.out_features == rows
                    and m.in_features == in_features})
    return "/".join(names) + " (torchburn/quant/linear.py QuantizedLinear.forward)" if names else ""


def profile_decode(llm: Any, steps: int = 32, filled: int = 64) -> StepProfiler:
    """Compile a fresh decode step of ``llm`` (cache hits make this quick), then time
    ``steps`` decode steps kernel by kernel at ``filled`` cached slots."""
    if not llm.compiled:
        raise ValueError("--profile needs the compiled engine (not --eager)")
    cache = llm.cache_for(1)
    starts = torch.zeros(1, dtype=torch.long)
    ids = torch.tensor([[100]])
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
