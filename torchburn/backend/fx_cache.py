"""The FX-graph cache: an ATen graph seen before goes straight to loaded native code.

The program cache (`driver.py`) is keyed by the tensor IR's structural hash, so even a hit
needs the partitioner, the lowerings and the IR: ~100 ms of imports and work in a new process.
This cache sits in front of it, as Inductor's FX graph cache does: its key is a stable hash of
the ATen graph AOTAutograd hands us (its code, and the dtype, shape (symbolic ones included),
strides, device and layout of every node's value, and the contents of its constant tensors),
plus everything else that shapes the result (torchburn's version and source digest, torch's
version, llvmlite and LLVM, the host CPU, the engine configuration, the pipeline with every user
pass's `uuid()`, lowerings registered outside torchburn). The entry is a manifest:

- the partition, as the node names of each fused part (replayed with torch.fx's fuser);
- the fallbacks, as `explain()` reports them;
- for each compiled subgraph, the key of its program file and its launcher's source
  (`launcher_gen.LauncherSpec`); for each subgraph left to PyTorch, why.

A hit therefore imports neither the IR nor a pass, lowering or code generator. A manifest whose
program file is missing or corrupt is a miss: the graph is compiled as usual, which rebuilds both.
Manifests live in the disk cache's folder (`<key>.tbfx`), written atomically and checked with
BLAKE3 like program files; there is no FX-level cache when the disk cache is off.
"""
from __future__ import annotations

import functools
import logging
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
import torch.fx
from blake3 import blake3

from . import report as rep
from ..frontend.meta_keys import CONSTANT_META
from ..runtime.config import Config
from .launcher import Launcher, LauncherSpec
from ..runtime.disk_cache import DiskCache, source_digest

if TYPE_CHECKING:
    from ..compiler.driver import CompiledProgram

log = logging.getLogger("torchburn")

#: Bump when the manifest's layout or the key's recipe changes.
FORMAT = "fx2"
#: Constant tensors up to this size are hashed into the key; a graph holding a larger one is
#: not cached at this level (hashing it would cost more than the cache saves).
MAX_CONSTANT_BYTES = 1 << 20
#: The key's pipeline part for the default pipeline of built-in passes (whose code the source
#: digest covers).
DEFAULT_PIPELINE_TAG = "default-pipeline"

Install = Callable[[torch.fx.GraphModule, str, torch.fx.GraphModule, Launcher], None]


def enabled(config: Config) -> bool:
    """Whether the FX-graph cache is used: the disk cache is on and the CPU engine runs."""
    return config.cache_dir is not None and config.device == "cpu" and config.engine == "llvm"


# ---- the key --------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def host_fingerprint() -> str:
    """The machine the code is for, without loading LLVM: on Linux the CPU's model name, flags
    and architecture (what LLVM's host CPU name and features are derived from); elsewhere LLVM's
    own description."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    first = text.split("\n\n", 1)[0]
    keep = [ln.strip() for ln in first.splitlines()
            if ln.split(":", 1)[0].strip() in ("vendor_id", "cpu family", "model", "model name", "flags",
                                               "Features", "CPU implementer", "CPU part", "isa")]
    if any(ln.startswith(("flags", "Features", "isa")) for ln in keep):
        return f"{platform.machine()}|{sys.platform}|" + "|".join(keep)
    from ..codegen.target import host_target

    target = host_target()
    return f"{target.triple}|{target.cpu}|{target.features}"


def _llvmlite_version() -> str:
    """llvmlite's version (its LLVM comes with it) without importing its bindings."""
    import llvmlite

    return f"llvmlite={llvmlite.__version__}"


def _describe(val: Any) -> str:
    """A node's value as text for the key: a tensor's dtype, sizes, strides, device, layout."""
    if isinstance(val, torch.Tensor):
        return (f"T({val.dtype},{tuple(str(s) for s in val.shape)},{tuple(str(s) for s in val.stride())},"
                f"{val.device},{val.layout},{val.requires_grad})")
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"S({type(val).__name__}:{val})"
    if isinstance(val, (list, tuple)):
        return "(" + ",".join(_describe(v) for v in val) + ")"
    if val is None or isinstance(val, (bool, int, float, str)):
        return repr(val)
    return f"?{type(val).__module__}.{type(val).__qualname__}"


def _constant_digest(gm: torch.fx.GraphModule, target: str) -> Optional[str]:
    """The contents of constant tensor `target`, or None when it cannot be keyed."""
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    if not isinstance(obj, torch.Tensor) or obj.device.type != "cpu" or obj.layout != torch.strided:
        return None
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    if isinstance(obj, FakeTensor):
        return None
    # The backend may run under AOTAutograd's fake mode: read the real constant outside it.
    with unset_fake_temporarily():
        t = obj.detach()
        if t.numel() * t.element_size() > MAX_CONSTANT_BYTES or t.is_quantized or t.dtype.is_complex:
            return None
        raw = t.contiguous().reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
        return f"{_describe(t)}:{blake3(raw.numpy().tobytes()).hexdigest()}"


def _extra_lowerings() -> str:
    """Lowerings registered from outside torchburn change what compiles; built-in ones are
    covered by the source digest. Nothing to add while the registry is not loaded."""
    registry = sys.modules.get("torchburn.frontend.registry")
    if registry is None:
        return ""
    extra = sorted(f"{op}={_code_digest(lw.fn)}" for op, lw in registry.LOWERINGS.items()
                   if not str(getattr(lw.fn, "__module__", "")).startswith("torchburn."))
    return ";".join(extra)


def _code_digest(fn: Any) -> str:
    """A function's name and source (its bytecode where the source cannot be read)."""
    name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    try:
        import inspect

        code = inspect.getsource(fn).encode("utf-8")
    except (OSError, TypeError):
        inner = getattr(fn, "__code__", None)
        code = inner.co_code + repr(inner.co_consts).encode("utf-8") if inner is not None else repr(fn).encode()
    return f"{name}:{blake3(code).hexdigest()[:32]}"


def pipeline_key(user_passes: Any) -> str:
    """The pipeline's part of the key without building the pipeline when it is the default:
    then the built-in passes are covered by the source digest. Once the pass registry is loaded
    a user may have registered a class under a built-in pass's name; then the pipeline is built
    and its key used."""
    if not user_passes:
        base = sys.modules.get("torchburn.passes.base")
        if base is None:
            return DEFAULT_PIPELINE_TAG
        from ..passes import pipeline as pl

        names = (*pl.DEFAULT_TENSOR, "lower-to-loops", *pl.DEFAULT_LOOP, *pl.DEFAULT_FINAL)
        classes = [base.PASSES.get(n) for n in names]
        if all(c is None or c.__module__.startswith("torchburn.passes.") for c in classes):
            return DEFAULT_PIPELINE_TAG
    from ..passes.pipeline import Pipeline

    return Pipeline.default(user_passes).key()


#: Configuration fields that do not change compiled code; every other field (including ones
#: added later) is part of the key.
RUNTIME_ONLY_CONFIG = frozenset({"cache_dir", "cache_size", "debug", "dump_dir", "num_threads"})


def _config_part(config: Config) -> str:
    import dataclasses

    return repr(sorted((f.name, getattr(config, f.name)) for f in dataclasses.fields(config)
                       if f.name not in RUNTIME_ONLY_CONFIG))


def graph_key(gm: torch.fx.GraphModule, kind: str, config: Config, pipeline: str) -> Optional[str]:
    """The FX-graph cache key of `gm`, or None when the graph cannot be keyed (a submodule call,
    a large or unusual constant)."""
    h = blake3()
    for part in (FORMAT, kind, f"torch={torch.__version__}", source_digest(), _llvmlite_version(),
                 host_fingerprint(), _config_part(config), pipeline, _extra_lowerings(), gm.code):
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    for node in gm.graph.nodes:
        if node.op == "call_module":
            return None
        if node.op == "get_attr":
            digest = _constant_digest(gm, str(node.target))
            if digest is None:
                return None
            h.update(f"{node.name}={digest}\n".encode("utf-8"))
        h.update(f"{node.name}:{_describe(node.meta.get('val'))}\n".encode("utf-8"))
        if node.op == "placeholder" and node.meta.get(CONSTANT_META):
            h.update(b"const\n")
    return "fx" + h.hexdigest()


# ---- the manifest ----------------------------------------------------------------------------------

@dataclass
class Manifest:
    """What a compilation of one FX graph produced, as stored."""

    plan: list[list[tuple[str, Optional[int]]]] = field(default_factory=list)
    fallbacks: list[tuple[str, str]] = field(default_factory=list)
    #: Per subgraph, in order: name, ops, and either program key + launcher + kernels, or reason.
    subgraphs: list[dict[str, Any]] = field(default_factory=list)
    #: Nodes the tuner left as library calls: (op, the tuner's line).
    library_calls: list[tuple[str, str]] = field(default_factory=list)
    #: The tuner's lines for the graph's kernels (`GraphReport.tuning`), shown again on a hit.
    tuning: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"plan": [[list(p) for p in part] for part in self.plan],
                "fallbacks": [list(f) for f in self.fallbacks], "subgraphs": self.subgraphs,
                "library_calls": [list(c) for c in self.library_calls], "tuning": list(self.tuning)}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Manifest":
        """Raises KeyError, TypeError or ValueError on a manifest of the wrong shape."""
        plan = [[(str(name), None if order is None else int(order)) for name, order in part] for part in d["plan"]]
        fallbacks = [(str(op), str(why)) for op, why in d["fallbacks"]]
        subgraphs = list(d["subgraphs"])
        for s in subgraphs:
            if not isinstance(s, dict) or not isinstance(s["name"], str) or not isinstance(s["ops"], list):
                raise ValueError("bad subgraph record")
            if ("program" in s) == ("reason" in s):
                raise ValueError("a subgraph is either compiled or left to PyTorch")
            if not isinstance(s.get("kept", ""), str):
                raise ValueError("bad kept-temporaries line")
        if len(plan) != len(subgraphs):
            raise ValueError("the plan and the subgraphs differ in number")
        calls = [(str(op), str(why)) for op, why in d.get("library_calls", [])]
        return Manifest(plan, fallbacks, subgraphs, calls, [str(line) for line in d.get("tuning", [])])


def store(disk: DiskCache, key: str, manifest: Manifest) -> None:
    """Write the manifest, once every program it names is on disk (else a later hit would only
    miss on the program)."""
    for s in manifest.subgraphs:
        if "program" in s and not disk.path(s["program"]).is_file():
            log.debug("torchburn: program %s is not on disk; FX graph %s not cached", s["program"][:16], key[:16])
            return
    disk.store_graph(key, manifest.as_dict())


def replay(gm: torch.fx.GraphModule, key: str, disk: DiskCache, report: rep.GraphReport,
           install: Install, load_program: Callable[[str], Optional["CompiledProgram"]]) -> Optional[torch.fx.GraphModule]:
    """`gm` partitioned and with launchers installed as the manifest of `key` says, or None on a
    miss (no manifest, or a program it names is not in the cache); `gm` is untouched then."""
    raw = disk.load_graph(key)
    if raw is None:
        return None
    try:
        manifest = Manifest.from_dict(raw)
    except (KeyError, TypeError, ValueError) as err:
        log.warning("torchburn: FX graph cache entry %s is malformed (%s); compiling again", key[:16], err)
        return None
    nodes = {n.name: n for n in gm.graph.nodes}
    if any(name not in nodes for part in manifest.plan for name, _ in part):
        log.warning("torchburn: FX graph cache entry %s names nodes the graph lacks; compiling again", key[:16])
        return None
    loaded: list[Optional[tuple["CompiledProgram", float]]] = []
    for s in manifest.subgraphs:  # everything is loaded before the graph is touched
        if "reason" in s:
            loaded.append(None)
            continue
        t0 = time.perf_counter()
        compiled = load_program(s["program"])
        if compiled is None:
            return None
        loaded.append((compiled, time.perf_counter() - t0))
    from ..frontend.fuse_parts import fuse_parts

    parts = [{nodes[name]: order for name, order in part} for part in manifest.plan]
    module = fuse_parts(gm, parts)
    names = [n.target for n in module.graph.nodes if n.op == "call_module" and str(n.target).startswith("fused_")]
    if len(names) != len(manifest.subgraphs):
        raise RuntimeError(f"FX graph cache entry {key[:16]}: the plan gave {len(names)} subgraphs, "
                           f"the manifest lists {len(manifest.subgraphs)}")
    report.fallbacks = list(manifest.fallbacks)
    report.library_calls = list(manifest.library_calls)
    report.tuning = list(manifest.tuning)
    for name, record, item in zip(names, manifest.subgraphs, loaded):
        sub: torch.fx.GraphModule = getattr(module, name)
        sub_report = rep.SubgraphReport(name, list(record["ops"]))
        report.subgraphs.append(sub_report)
        if item is None:
            sub_report.compiled = False
            sub_report.reason = str(record["reason"])
            continue
        compiled, seconds = item
        launcher = Launcher(LauncherSpec.from_dict(record["launcher"]), compiled.entry, sub.forward,
                            keepalive=compiled)
        sub_report.cache_hit = True
        sub_report.kernels = compiled.kernel_summary()
        sub_report.kept = record.get("kept")  # written at compile time: the warm path parses no IR
        sub_report.timings = {"graph_cache_load": seconds}
        install(module, name, sub, launcher)
    return module
