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
import weakref
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


#: Counts `forget_kept()` calls; a kept key of another count is stale.
_KEPT_EPOCH = [0]


def forget_kept() -> None:
    """Make every compiled program compute its kept temporaries (`Program.kept`: weights
    packed once, `keep-constant-prep`) again on its next call: for a weight written in a way
    its version counter does not see (through `.data`, or by native code)."""
    _KEPT_EPOCH[0] += 1


class _Workspace(threading.local):
    buffer: Optional[torch.Tensor] = None
    #: What the temporaries kept in this thread's workspace were computed from (`_fresh`): the
    #: workspace's address and, per tensor, a weak reference, its data pointer and its version.
    kept_key: Optional[tuple[int, tuple[tuple[Any, int, int], ...], int]] = None


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
            "_fresh": self._fresh,
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

    def _fresh(self, workspace: int, tensors: tuple[torch.Tensor, ...]) -> int:
        """1 when the program must compute its kept temporaries (`Program.kept`) again, else 0:
        they live in this thread's workspace, computed by the last call from `tensors` (its
        `kept_from` inputs); they are stale when the workspace moved or any of those is another
        tensor, has other memory or a moved version counter (an in-place write: an optimizer
        step, `load_state_dict`, `copy_` under `no_grad`). An inference tensor has no version
        counter: nothing is kept for it, every call computes them.

        A write through `.data` (`w.data.mul_(2)`) bypasses the version counter and is not
        seen: write the parameter itself under `torch.no_grad()`, or run
        `torchburn.forget_kept()` after such a write."""
        state = self._ws
        key = state.kept_key
        if key is not None and key[0] == workspace and _KEPT_EPOCH[0] == key[2]:
            for (ref, ptr, version), t in zip(key[1], tensors):
                if ref() is not t or t.data_ptr() != ptr or t._version != version:
                    break
            else:
                return 0
        if any(t.is_inference() for t in tensors):
            state.kept_key = None
        else:
            state.kept_key = (workspace, tuple((weakref.ref(t), t.data_ptr(), t._version) for t in tensors),
                              _KEPT_EPOCH[0])
        return 1

    def _fault(self, *args: Any) -> Any:
        """The native call counted a fault (`runtime/faults.py`). An access out of range
        (bounds mode) raises `OutOfBounds`; otherwise (an integer divisor of 0) PyTorch runs
        the call again and raises eager's own error, and when the fault was another thread's,
        its values are this call's result."""
        self.stats.faults += 1
        self._ws.kept_key = None  # the call stopped short: what it kept may be half written
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
