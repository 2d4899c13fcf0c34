"""Calling compiled programs with torch tensors: guards, output allocation, one native call.

For each compiled subgraph a small Python function is generated (as Inductor does, see
`launcher_gen.py`) that checks the inputs against what the program was compiled for (dtype,
rank, sizes, strides, device), binds the symbols, allocates the outputs with torch, and makes
one native call with the tensors' own memory (`data_ptr()`, zero copy). Generated code is
straight-line Python, which keeps the per-call overhead to a few microseconds.

This module needs only torch and ctypes (no IR): a warm process builds launchers from the
specs stored in the FX-graph cache without importing the compiler.

An input that does not match (for example a transposed tensor where a contiguous one was
compiled) never reaches native code: that call runs the subgraph in PyTorch instead, and the
mismatch is logged and counted.
"""
from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from ..runtime import faults

log = logging.getLogger("torchburn")


@dataclass(frozen=True)
class LauncherSpec:
    """Everything `launcher.Launcher` needs besides the native entry and the eager fallback."""

    #: Python source defining `launch(a0, a1, ...)`.
    source: str
    #: The program's name (for log messages).
    name: str
    #: Global name -> torch dtype name (`"float32"`) the source refers to.
    dtypes: tuple[tuple[str, str], ...]
    #: Number of pointers and of symbols passed to the entry function.
    n_pointers: int
    n_symbols: int
    #: Length of the tuple `launch` returns.
    n_results: int
    #: Where each result comes from: `"new"` (a new contiguous tensor), `"input i"` (argument
    #: `i` itself, written in place) or `"copy i"` (a clone of argument `i`). The strides of a
    #: training forward's outputs are told to AOTAutograd from it (`output_strides.py`).
    results: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "name": self.name, "dtypes": [list(d) for d in self.dtypes],
                "n_pointers": self.n_pointers, "n_symbols": self.n_symbols, "n_results": self.n_results,
                "results": list(self.results)}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "LauncherSpec":
        """Raises KeyError, TypeError or ValueError on a record of the wrong shape (a record
        without `results`, written before they were recorded, describes none)."""
        dtypes = tuple((str(k), str(v)) for k, v in d["dtypes"])
        return LauncherSpec(str(d["source"]), str(d["name"]), dtypes, int(d["n_pointers"]),
                            int(d["n_symbols"]), int(d["n_results"]), tuple(str(r) for r in d.get("results", ())))


@dataclass
class LaunchStats:
    calls: int = 0
    eager_fallbacks: int = 0
    #: Calls whose native code counted a fault (and so ran again in PyTorch).
    faults: int = 0
    mismatches: list[str] = field(default_factory=list)


class _Workspace(threading.local):
    buffer: Optional[torch.Tensor] = None


class Launcher:
    """Callable for one compiled subgraph: `launcher(*args) -> tuple of tensors`."""

    def __init__(self, spec: LauncherSpec, entry: Callable[..., None], eager: Callable[..., Any],
                 keepalive: Any = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.entry = entry
        self.eager = eager
        self.keepalive = keepalive
        self.stats = LaunchStats()
        self._ws = _Workspace()
        self.source = spec.source
        namespace: dict[str, Any] = {}
        exec(compile(self.source, f"<torchburn launcher {spec.name}>", "exec"), self._globals(), namespace)
        #: The generated function; call it directly on hot paths.
        self.launch: Callable[..., tuple[Any, ...]] = namespace["launch"]
        self.launch.n_results = spec.n_results  # type: ignore[attr-defined]  # for backend._direct
        self.launch.launcher = self  # type: ignore[attr-defined]  # for llm/runtime/step_cache.py
        #: The same function taking one list of arguments (AOTAutograd's boxed convention).
        self.launch_boxed: Callable[[list[Any]], tuple[Any, ...]] = namespace["launch_boxed"]
        self.launch_boxed._boxed_call = True  # type: ignore[attr-defined]
        self.launch_boxed.unboxed = self.launch  # type: ignore[attr-defined]  # inference_path.py
        self.launch.boxed = self.launch_boxed  # type: ignore[attr-defined]

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        return self.launch(*args)

    def _globals(self) -> dict[str, Any]:
        dtypes = {}
        for name, dtype in self.spec.dtypes:
            value = getattr(torch, dtype, None)
            if not isinstance(value, torch.dtype):
                raise ValueError(f"launcher {self.name}: {dtype!r} is not a torch dtype")
            dtypes[name] = value
        return {
            "__name__": __name__,
            "_entry": self.entry, "_empty": torch.empty, "_slow": self._slow, "_ws": self._workspace,
            "_faults": faults.counter, "_fault": self._fault,
            "_Ptrs": ctypes.c_void_p * self.spec.n_pointers,
            "_Syms": ctypes.c_int64 * max(self.spec.n_symbols, 1),
            "_NOSYMS": (ctypes.c_int64 * 1)(),  # read by nobody: the program has no symbols
            "min": min, "max": max, "int": int,
            **dtypes,
        }

    # ---- runtime helpers -----------------------------------------------------------------------------
    def _workspace(self, nbytes: int) -> int:
        buf = self._ws.buffer
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(max(nbytes, 64), dtype=torch.uint8)
            self._ws.buffer = buf
        return buf.data_ptr()

    def _fault(self, *args: Any) -> Any:
        """The native call counted a fault (`runtime/faults.py`). An access out of range
        (bounds mode) raises `OutOfBounds`; otherwise (an integer divisor of 0) PyTorch runs
        the call again and raises eager's own error, and when the fault was another thread's,
        its values are this call's result."""
        self.stats.faults += 1
        out_of_bounds = faults.take_out_of_bounds()
        if out_of_bounds is not None:  # TORCHBURN_DEBUG=bounds: a compiler bug, not the user's
            raise out_of_bounds
        log.info("torchburn: %s: the native call counted a fault; running this call in PyTorch", self.name)
        with torch.no_grad():
            out = self.eager(*args)
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)

    def _slow(self, *args: Any, why: str) -> Any:
        self.stats.eager_fallbacks += 1
        if len(self.stats.mismatches) < 16:
            self.stats.mismatches.append(why)
        log.info("torchburn: %s: %s; running this call in PyTorch", self.name, why)
        with torch.no_grad():  # as AOTAutograd runs forwards (see inference_path.py)
            out = self.eager(*args)
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)
