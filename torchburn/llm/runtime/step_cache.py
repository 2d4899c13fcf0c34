"""The step cache: a compiled LLM step called without Dynamo, in this process and the next.

`torch.compile` pays on every new process for Dynamo's bytecode analysis and AOTAutograd's
trace of the decoder (seconds for a 30-layer model) before the FX-graph cache
(`backend/fx_cache.py`) can even be asked. But the step graph of our own `Decoder` is fixed
by what this key covers: the model's configuration, every parameter's and buffer's name,
dtype, shape and stride (the quantization layout) and which ones share storage (tied
weights), each module's class and plain attributes, the step's argument signature (batch,
tokens, dtypes, whether a logit index is given), the KV cache's size, grad mode, and
everything the FX-graph cache keys on besides the graph (torchburn's source digest and
version, torch, llvmlite, the host CPU, the engine configuration).

When Dynamo compiles a step into a graph that is one native call (one launcher, no op left
to PyTorch, no wrapper work for AOTAutograd), `backend.entry.observing` shows us that
graph's inputs (each a parameter or buffer of the model, a step argument, or a size or
stride of one) and the launcher's arguments and results. That record (a `StepPlan`) is
checked once by running it on the same arguments and comparing with Dynamo's result; then

- in this process, later calls of that signature run the plan directly (no Dynamo guards);
- with the disk cache on, it is stored (``st<key>.tbfx``, BLAKE3-keyed and checked like the
  FX-graph manifests) with the program's key and the launcher's source, so a later process
  binds the loaded program to its own parameters without Dynamo, AOTAutograd or the compiler.

Anything else is a miss that takes the usual `torch.compile` path: no entry, a malformed
one, a program no longer on disk, a graph that is not one native call. An argument the
launcher's own guards reject at run time (a shape or dtype the program was not compiled for)
raises `StaleStep`; the engine then drops the plan and runs the call through Dynamo.
"""
from __future__ import annotations

import dataclasses
import logging
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from blake3 import blake3

from ...runtime.config import get_config

log = logging.getLogger("torchburn")

#: Bump when the record's layout or the key's recipe changes.
FORMAT = "step1"
#: The step's argument names, in order (`LLM._eager_step`).
ARGS = ("ids", "positions", "slots", "starts", "past", "logit_index")
#: Dynamo's source names of a step argument, and of one of its sizes or strides.
_ARG = re.compile(r"^L\['(\w+)'\]$")
_DIM = re.compile(r"^L\['(\w+)'\]\.(size|stride)\(\)\[(\d+)\]$")


class StaleStep(RuntimeError):
    """A cached step's program refused its arguments: take the `torch.compile` path."""


# ---- the key --------------------------------------------------------------------------------------

def _plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def model_fingerprint(model: torch.nn.Module) -> str:
    """The decoder's layout: configuration, module classes and plain attributes, and every
    tensor's name, dtype, shape, stride and storage group (tied weights share one). Values
    are not part of it: they are the compiled step's inputs."""
    h = blake3()
    h.update(repr(getattr(model, "config", None)).encode("utf-8"))
    for name, module in model.named_modules(remove_duplicate=False):
        attrs = sorted((k, v) for k, v in vars(module).items()
                       if not k.startswith("_") and k != "training" and _plain(v))
        h.update(f"M {name} {type(module).__module__}.{type(module).__qualname__} {attrs!r}\n".encode())
    storages: dict[int, int] = {}
    tensors = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    for name, t in tensors:
        group = storages.setdefault(t.untyped_storage().data_ptr(), len(storages))
        h.update(f"T {name} {t.dtype} {tuple(t.shape)} {t.stride()} {t.storage_offset()} "
                 f"{t.device} {group} {type(t).__name__}\n".encode())
    return h.hexdigest()


def _arg_signature(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"{value.dtype}{tuple(value.shape)}{value.device}"
    return f"?{type(value).__name__}"


def signature(args: Sequence[Any]) -> str:
    """What of a call's arguments selects a step graph: each tensor's dtype and shape, the
    past's length aside (it is a dynamic dimension, bound per call)."""
    parts = []
    for name, value in zip(ARGS, args):
        if name == "past" and isinstance(value, torch.Tensor):
            shape = list(value.shape)
            shape[3] = -1
            parts.append(f"{value.dtype}{tuple(shape)}{value.stride()[:3]}")
        else:
            parts.append(_arg_signature(value))
    return "|".join(parts) + f"|grad={torch.is_grad_enabled()}"


def step_key(model_part: str, context: int, sig: str) -> Optional[str]:
    """The disk key of a step, or None when the disk cache (or the CPU engine) is off."""
    from ...backend import fx_cache
    from ...runtime.disk_cache import source_digest

    config = get_config()
    if not fx_cache.enabled(config):
        return None
    h = blake3()
    for part in (FORMAT, f"torch={torch.__version__}", source_digest(), fx_cache._llvmlite_version(),
                 fx_cache.host_fingerprint(), fx_cache._config_part(config),
                 fx_cache.pipeline_key(None), model_part, f"context={context}", sig):
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    return "st" + h.hexdigest()


# ---- the plan --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepPlan:
    """How to call a compiled step without Dynamo.

    `inputs` are the graph's inputs, each ``("param", name)``, ``("arg", index)`` or
    ``("size" | "stride", arg index, dim)``; `launch_args` pick the launcher's arguments
    among them, `outputs` the step's results among the launcher's. `writes` are the graph's
    own input mutations (AOTAutograd's ``copy_(input, result)``, the KV-cache slots): pairs
    (input index, launcher result index); a program that stored into the input itself returns
    the input, and the copy is then skipped. `single`: the step returns its one result
    itself, not a tuple (as the model's function does)."""

    inputs: tuple[tuple[Any, ...], ...]
    launch_args: tuple[int, ...]
    outputs: tuple[int, ...]
    writes: tuple[tuple[int, int], ...] = ()
    single: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"inputs": [list(i) for i in self.inputs], "launch_args": list(self.launch_args),
                "outputs": list(self.outputs), "writes": [list(w) for w in self.writes],
                "single": self.single}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "StepPlan":
        """Raises KeyError, TypeError or ValueError on a record of the wrong shape."""
        inputs = []
        for item in d["inputs"]:
            kind = item[0]
            if kind == "param" and len(item) == 2:
                inputs.append(("param", str(item[1])))
            elif kind == "arg" and len(item) == 2:
                inputs.append(("arg", int(item[1])))
            elif kind in ("size", "stride") and len(item) == 3:
                inputs.append((str(kind), int(item[1]), int(item[2])))
            else:
                raise ValueError(f"bad step input {item!r}")
        writes = tuple((int(w[0]), int(w[1])) for w in d.get("writes", ()))
        plan = StepPlan(tuple(inputs), tuple(int(i) for i in d["launch_args"]),
                        tuple(int(i) for i in d["outputs"]), writes, bool(d.get("single", False)))
        if plan.single and len(plan.outputs) != 1:
            raise ValueError("a single-result step with several outputs")
        if any(not 0 <= i < len(plan.inputs) for i in plan.launch_args):
            raise ValueError("a launcher argument out of range")
        if any(not 0 <= i < len(plan.inputs) or plan.inputs[i][0] != "arg" for i, _ in writes):
            raise ValueError("a written input that is not a step argument")
        return plan


def _launcher_of(module: torch.fx.GraphModule
                 ) -> Optional[tuple[Any, list[int], list[int], list[tuple[int, int]]]]:
    """(launcher, its arguments as placeholder indices, the outputs as result indices, the
    input writes as (placeholder index, result index)) when the module is one launcher call,
    and the `copy_` of its results into inputs, and nothing else."""
    nodes = list(module.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    calls = [n for n in nodes if n.op == "call_function"
             and (hasattr(n.target, "launcher") or hasattr(n.target, "gpu_launcher"))]
    if len(calls) != 1 or calls[0].kwargs:
        return None
    call = calls[0]
    index = {n: i for i, n in enumerate(placeholders)}
    if any(not isinstance(a, torch.fx.Node) or a not in index for a in call.args):
        return None
    picks: dict[torch.fx.Node, int] = {}
    writes: list[tuple[int, int]] = []
    for n in nodes:
        if n.op in ("placeholder", "output") or n is call:
            continue
        if n.op == "call_function" and n.target is operator.getitem and n.args[0] is call \
                and isinstance(n.args[1], int):
            picks[n] = n.args[1]
            continue
        if (n.op == "call_function" and n.target is torch.ops.aten.copy_.default and not n.users
                and n.args[0] in index and n.args[1] in picks and len(n.args) == 2 and not n.kwargs):
            writes.append((index[n.args[0]], picks[n.args[1]]))
            continue
        return None  # an op left to PyTorch
    out = nodes[-1].args[0]
    if not isinstance(out, (tuple, list)) or any(o not in picks for o in out):
        return None
    launcher = getattr(call.target, "launcher", None) or call.target.gpu_launcher
    return launcher, [index[a] for a in call.args], [picks[o] for o in out], writes


def _trivial(compilations: Any) -> bool:
    """One forward, no backward, nothing for AOTAutograd's runtime wrapper to do."""
    from ...backend import inference_path

    if compilations.backward or len(compilations.forward) != 1:
        return False
    meta = compilations.forward[0][2]
    return meta is not None and inference_path._meta_is_trivial(meta, False, graph_mutations_ok=True)


def plan_from(sources: Sequence[Optional[str]], example_inputs: Sequence[Any], compilations: Any,
              modules: Optional[list[torch.fx.GraphModule]], model: torch.nn.Module,
              args: Sequence[Any]) -> Optional[tuple[StepPlan, Any]]:
    """The plan and launcher of a compiled step, or None when it is not one native call whose
    inputs are all the model's tensors, the step's arguments or their sizes."""
    if not modules or len(modules) != 1 or not _trivial(compilations):
        return None
    found = _launcher_of(modules[0])
    aten_inputs = [n for n in compilations.forward[0][0].graph.nodes if n.op == "placeholder"]
    if found is None or len(aten_inputs) != len(example_inputs):
        return None
    launcher, launch_args, outputs, writes = found
    names = {id(t): n for n, t in (list(model.named_parameters(remove_duplicate=False))
                                   + list(model.named_buffers(remove_duplicate=False)))}
    arg_ids = {id(a): i for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    inputs: list[tuple[Any, ...]] = []
    if len(sources) != len(example_inputs):
        return None
    for source, value in zip(sources, example_inputs):
        if isinstance(value, torch.Tensor):
            if id(value) in arg_ids and _ARG.match(str(source)):
                inputs.append(("arg", arg_ids[id(value)]))
            elif id(value) in names:
                inputs.append(("param", names[id(value)]))
            else:
                return None
            continue
        m = _DIM.match(str(source))
        if m is None or m.group(1) not in ARGS:
            return None
        inputs.append((m.group(2), ARGS.index(m.group(1)), int(m.group(3))))
    if any(inputs[i][0] != "arg" for i, _ in writes):
        return None  # a graph that writes a parameter or buffer: not a step
    return StepPlan(tuple(inputs), tuple(launch_args), tuple(outputs), tuple(writes)), launcher


# ---- running a plan ---------------------------------------------------------------------------------

def _getters(plan: StepPlan, model: torch.nn.Module) -> list[Callable[[Sequence[Any]], Any]]:
    """One getter per plan input, from the step's arguments: a model tensor (bound now), an
    argument, or an argument's size or stride."""
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    getters: list[Callable[[Sequence[Any]], Any]] = []
    for item in plan.inputs:
        if item[0] == "param":
            if item[1] not in tensors:
                raise KeyError(item[1])
            t = tensors[item[1]].detach()
            getters.append(lambda a, t=t: t)
        elif item[0] == "arg":
            getters.append(operator.itemgetter(item[1]))
        elif item[0] == "size":
            getters.append(lambda a, i=item[1], d=item[2]: a[i].size(d))
        else:
            getters.append(lambda a, i=item[1], d=item[2]: a[i].stride(d))
    return getters


def bind(plan: StepPlan, launch: Callable[..., Any], model: torch.nn.Module) -> Callable[..., tuple[Any, ...]]:
    """The step as a function of the step's arguments: the model's tensors bound now, the
    arguments and their sizes per call. A GPU engine's launcher (`launch.gpu_launcher`) is
    called as it is (`bind_gpu`)."""
    gpu = getattr(launch, "gpu_launcher", None)
    if gpu is not None:
        return bind_gpu(plan, gpu, model)
    getters = _getters(plan, model)
    pick = [getters[i] for i in plan.launch_args]
    outputs = plan.outputs
    writes = [(getters[i], k) for i, k in plan.writes]
    single = plan.single
    # the model's tensors guarded and addressed once (`pinned_launch.py`), from the first call
    fixed = {j: pick[j](()) for j, i in enumerate(plan.launch_args) if plan.inputs[i][0] == "param"}
    rest = [pick[j] for j in range(len(pick)) if j not in fixed]
    fast: list[Optional[Callable[..., Any]]] = []

    def step(*args: Any) -> tuple[Any, ...]:
        if fast and fast[0] is not None:
            out = fast[0](*[g(args) for g in rest])
        else:
            full = [g(args) for g in pick]
            if not fast:
                from ...runtime.gc_pause import gc_paused
                from .pinned_launch import pin

                with gc_paused():  # parsing the launcher's source: ~100k AST nodes
                    fast.append(pin(launch, fixed, full))
            out = launch(*full)
        for target, k in writes:
            t = target(args)
            if out[k] is not t:
                t.copy_(out[k])
        if single:
            return out[outputs[0]]
        return tuple(out[k] for k in outputs)

    step.pinned = fast  # type: ignore[attr-defined]  # [the pinned launcher or None] once tried
    return step


def bind_gpu(plan: StepPlan, launcher: Any, model: torch.nn.Module) -> Callable[..., tuple[Any, ...]]:
    """`bind` for the GPU engine's launcher (`backend/gpu_launcher.py`): the model's tensors
    bound now and pinned in the launcher (`GpuLauncher.pin`: checked once, then only their
    identity and version), the arguments per call; the launcher checks every other input itself
    (a call it does not fit runs in PyTorch, as under Dynamo). Where AOTAutograd's write-back was taken out
    (`launcher.aot_bumps_written`), the version bump AOTAutograd makes on an input the graph
    writes, before the graph runs, is made here (`gpu_resident.bind` expects it)."""
    getters = _getters(plan, model)
    pick = [getters[i] for i in plan.launch_args]
    bumped = [inp.position for inp in launcher.written] if launcher.aot_bumps_written else []
    outputs, single, call = plan.outputs, plan.single, launcher.launch
    writes = [(getters[i], k) for i, k in plan.writes]
    increment = torch.autograd.graph.increment_version
    # the model's tensors: the same objects every call, placed once and pinned in the launcher
    fixed = [j for j, i in enumerate(plan.launch_args) if plan.inputs[i][0] == "param"]
    template = [pick[j](()) if j in fixed else None for j in range(len(pick))]
    rest = [(j, pick[j]) for j in range(len(pick)) if j not in set(fixed)]
    launcher.pin(set(fixed))

    def arguments(args: Sequence[Any]) -> list[Any]:
        full = list(template)
        for j, g in rest:
            full[j] = g(args)
        for i in bumped:
            increment(full[i])
        return full

    def finish(args: Sequence[Any], out: tuple[Any, ...]) -> Any:
        for target, k in writes:
            t = target(args)
            if out[k] is not t:
                t.copy_(out[k])
        if single:
            return out[outputs[0]]
        return tuple(out[k] for k in outputs)

    def step(*args: Any) -> tuple[Any, ...]:
        return finish(args, call(*arguments(args)))

    fed_places: dict[int, int] = {}

    def submit(*args: Any, feed: int) -> Callable[[], Any]:
        """Submit the step without waiting (`GpuLauncher.submit`), its one result also copied
        on the device into step argument `feed` (a tensor the GPU owns); returns the function
        that waits for the step's result."""
        if len(outputs) != 1:
            raise StaleStep("a step fed on the device has one result")
        place = fed_places.get(feed)
        if place is None:  # once per fed argument, not a scan of ~280 arguments per step
            found = [j for j, i in enumerate(plan.launch_args) if plan.inputs[i] == ("arg", feed)]
            if len(found) != 1:
                raise StaleStep(f"step argument {feed} is not one launcher argument")
            place = fed_places[feed] = found[0]
        pending = launcher.submit(*arguments(args), feed=(outputs[0], place))
        return lambda: finish(args, pending.result())

    step.submit = submit  # type: ignore[attr-defined]
    return step


def _refuse(*_args: Any) -> Any:
    raise StaleStep("the cached step's program does not take these arguments")


def load(key: str, model: torch.nn.Module) -> Optional[Callable[..., tuple[Any, ...]]]:
    """The step stored under `key`, bound to `model`, or None (missing, malformed, its program
    gone)."""
    from ...backend.launcher import Launcher, LauncherSpec
    from ...runtime.disk_cache import disk_cache

    disk = disk_cache(get_config().cache_dir)
    raw = None if disk is None else disk.load_graph(key)
    if raw is None:
        return None
    try:
        plan = StepPlan.from_dict(raw["plan"])
        spec = LauncherSpec.from_dict(raw["launcher"])
        program = str(raw["program"])
    except (KeyError, TypeError, ValueError, IndexError) as err:
        log.warning("torchburn: step cache entry %s is malformed (%s); compiling again", key[:16], err)
        return None
    from ...compiler.driver import load_program

    compiled = load_program(program)
    if compiled is None:
        return None
    launcher = Launcher(spec, compiled.entry, _refuse, keepalive=compiled)
    try:
        return bind(plan, launcher.launch, model)
    except KeyError as err:
        log.warning("torchburn: step cache entry %s names tensor %s the model lacks", key[:16], err)
        return None


def store(key: str, plan: StepPlan, launcher: Any) -> bool:
    """Write the step's record when its program is on disk (else a later hit would miss)."""
    from ...runtime.disk_cache import disk_cache

    disk = disk_cache(get_config().cache_dir)
    program = getattr(getattr(launcher, "keepalive", None), "key", None)
    if disk is None or not isinstance(program, str) or not disk.path(program).is_file():
        return False
    disk.store_graph(key, {"plan": plan.as_dict(), "launcher": launcher.spec.as_dict(), "program": program})
    return True


def same_results(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two step results are the same values (the plan's check against Dynamo's run)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            return False
        if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
            return False
    return True


@dataclass
class StepCacheStats:
    """What the step cache did (for tests and `--profile`)."""

    disk_hits: int = 0
    recorded: int = 0
    stored: int = 0
    stale: int = 0
    unplannable: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)
