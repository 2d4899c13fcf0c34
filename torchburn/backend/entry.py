"""The `torch.compile` entry point: `torch.compile(model, backend="torchburn")`.

Dynamo hands us an FX graph; AOTAutograd turns it into functional ATen graphs (forward and,
when training, backward) decomposed with our table. Each graph is partitioned: compilable
subgraphs go through the compiler and are replaced by launchers; the rest stays PyTorch.

A graph compiled before, in this process or another, comes from the FX-graph cache
(`fx_cache.py`) instead: partition replayed, programs loaded, launchers rebuilt from their
stored source. This module imports the compiler proper (IR, lowerings, passes, codegen) only on
a miss, so a warm start pays for none of it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import logging
import threading
import operator
import time
import types
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional, Sequence

import torch
import torch.fx
from torch._dynamo.backends.common import aot_autograd
from functorch.compile import make_boxed_func

from . import fx_cache, inference_path
from . import report as rep
from ..runtime.config import get_config
from ..runtime.frame_stack import run_on_deep_stack
from ..runtime.gc_pause import gc_paused
from .launcher import Launcher
from .output_strides import compile_in_order, report_forward_output_strides, restride_placeholders

if TYPE_CHECKING:  # the compiler proper loads on the first cache miss (see fx_cache.py)
    from .gpu_launcher import GpuLauncher
    from ..runtime.tuner import Tuner
    from ..passes.pipeline import Pipeline

log = logging.getLogger("torchburn")

#: `options={"passes": {...}}` (user passes by insertion point, see `passes/pipeline.py`) and
#: `options={"target": "avx2"}` (the CPU to compile for, as `TORCHBURN_TARGET` names it) and
#: `options={"partitioner": "save-all"}` (how a training graph is split, see `_partition_fn`),
#: `options={"tune": "off"|"cached"|"search", "tune_budget_s": 60}` (the tuner, `TORCHBURN_TUNE`
#: and `TORCHBURN_TUNE_BUDGET` by default; docs/tuning.md).
KNOWN_OPTIONS = ("passes", "target", "partitioner", "tune", "tune_budget_s")
#: `min-cut`: the backward recomputes cheap forward values instead of the forward storing them
#: (AOTAutograd's min-cut rematerialization, as Inductor does); `save-all`: the forward stores
#: every value the backward reads (AOTAutograd's default partition).
PARTITIONERS = ("min-cut", "save-all")


class _Observers(threading.local):
    """Callbacks `observing` installed on this thread."""

    def __init__(self) -> None:
        self.stack: list[Callable[..., None]] = []


_observers = _Observers()


@contextlib.contextmanager
def observing(callback: Callable[..., None]) -> Iterator[None]:
    """Within the block, every Dynamo graph this backend compiles on this thread is reported
    as ``callback(sources, example_inputs, compilations, modules)``: `sources` name each graph
    input as Dynamo does (``L['x']``, ``L['x'].size()[0]``; None when unknown), `modules` are the final
    forward modules (launchers installed). The LLM engine's step cache (`llm/runtime/step_cache.py`)
    learns from it how to call a compiled step without Dynamo."""
    _observers.stack.append(callback)
    try:
        yield
    finally:
        _observers.stack.pop()


def _check_options(options: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    options = dict(options or {})
    unknown = set(options) - set(KNOWN_OPTIONS)
    if unknown:
        raise ValueError(f"torchburn: unknown option(s) {sorted(unknown)}; known: {list(KNOWN_OPTIONS)}")
    if options.get("partitioner", "min-cut") not in PARTITIONERS:
        raise ValueError(f"torchburn: option partitioner={options['partitioner']!r}; expected one of {list(PARTITIONERS)}")
    if "tune" in options:
        from ..runtime.config import TUNE_MODES

        if options["tune"] not in TUNE_MODES:
            raise ValueError(f"torchburn: option tune={options['tune']!r}; expected one of {list(TUNE_MODES)}")
    if "tune_budget_s" in options:
        budget = options["tune_budget_s"]
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 <= budget < float("inf"):
            raise ValueError(f"torchburn: option tune_budget_s={budget!r}; expected a number of seconds >= 0")
    if "target" in options:
        from ..codegen.target_names import check_target_name

        try:
            options["target"] = check_target_name(str(options["target"]))
        except ValueError as err:
            raise ValueError(f"torchburn: option target={options['target']!r}: {err}") from None
    return options


def _pipeline(options: Optional[Mapping[str, Any]]) -> "Pipeline":
    from ..passes.pipeline import Pipeline

    return Pipeline.default(_check_options(options).get("passes"))


def _op_names(gm: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


class _LazyPipeline:
    """The pipeline, built on the first compilation that needs it (a graph found in the
    FX-graph cache needs none, and building it imports every pass)."""

    def __init__(self, options: Optional[Mapping[str, Any]]) -> None:
        checked = _check_options(options)
        self.user_passes = checked.get("passes")
        #: The `target` option (None: `TORCHBURN_TARGET`).
        self.target: Optional[str] = checked.get("target")
        #: The `partitioner` option (see `PARTITIONERS`).
        self.partitioner: str = checked.get("partitioner", "min-cut")
        #: The `tune` and `tune_budget_s` options (None: the configuration's).
        self.tune: Optional[str] = checked.get("tune")
        self.tune_budget_s: Optional[float] = checked.get("tune_budget_s")
        self._pipeline: Optional["Pipeline"] = None
        self._key: Optional[str] = None
        if self.user_passes:  # user passes: build now, so a bad spec fails at torch.compile
            self.get()

    def get(self) -> "Pipeline":
        if self._pipeline is None:
            from ..passes.pipeline import Pipeline

            self._pipeline = Pipeline.default(self.user_passes)
        return self._pipeline

    def key(self) -> str:
        if self._key is None:
            self._key = fx_cache.pipeline_key(self.user_passes) + (f"|target={self.target}" if self.target else "")
            if self.tune is not None or self.tune_budget_s is not None:
                self._key += f"|tune={self.tune}:{self.tune_budget_s}"
        return self._key


def compile_fx_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                     pipeline: "Pipeline | _LazyPipeline", kind: str,
                     modules: Optional[list[torch.fx.GraphModule]] = None) -> Callable[..., Any]:
    """Compile an ATen graph: partition it and replace each compilable part by a launcher. A
    graph compiled before (in any process) comes from the FX-graph cache instead.

    Python's cyclic collector is paused throughout (`gc_paused`, as `compile_graph` pauses it
    over the passes): partition, import, launchers and the disk cache allocate objects that
    would otherwise survive into the old generation and set off a full collection of the
    whole process (torch's and the model's ~500k objects, 0.3 s on the tiny Llama) which
    nothing of ours needs. The young collection of what the compile leaves behind runs before
    returning, in the graph's time (`GraphReport.import_seconds`)."""
    report = rep.GraphReport(kind)
    t0 = time.perf_counter()
    with gc_paused():
        fn = _compile_fx_graph(gm, example_inputs, pipeline, kind, modules, report)
    if gc.isenabled():
        gc.collect(0)
    report.import_seconds = time.perf_counter() - t0
    rep.record(report)
    if report.fallback_ops:
        log.info("torchburn: %d op(s) run in PyTorch: %s", len(report.fallback_ops),
                 ", ".join(sorted(set(report.fallback_ops))))
    return fn


def _compile_fx_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], pipeline: "Pipeline | _LazyPipeline",
                      kind: str, modules: Optional[list[torch.fx.GraphModule]], report: rep.GraphReport) -> Callable[..., Any]:
    """`compile_fx_graph`'s work (its report filled in, but for the time)."""
    from ..frontend.inplace_writes import mark_slot_writes
    from ..frontend.item_fold import fold_item_round_trips
    from ..frontend.size_nodes import sizes_from_inputs
    from ..frontend.symfloat_args import wrap_symfloat_operands
    from ..frontend.view_outputs import views_to_pytorch

    lazy = pipeline if isinstance(pipeline, _LazyPipeline) else None
    t0 = time.perf_counter()
    if kind == "backward":  # saved activations as the compiled forward lays them out
        restride_placeholders(gm, example_inputs)
    fold_item_round_trips(gm)  # before the cache key: the cached plan names the folded nodes
    sizes_from_inputs(gm)  # likewise; sizes no longer cut the graph
    wrap_symfloat_operands(gm)  # likewise; nor do factors computed from sizes (batch norm's n / (n - 1))
    views_to_pytorch(gm)  # likewise; strided views among the outputs keep their strides
    mark_slot_writes(gm)  # a mutated input's few written elements are stored in place
    config = get_config()
    key = None
    disk = None
    if fx_cache.enabled(config) and lazy is not None:  # a Pipeline handed in: program cache only
        from ..runtime.disk_cache import disk_cache

        disk = disk_cache(config.cache_dir)
        key = fx_cache.graph_key(gm, kind, config, lazy.key() if lazy else fx_cache.DEFAULT_PIPELINE_TAG)
        report.stages["graph_key"] = time.perf_counter() - t0
    module = None
    if key is not None and disk is not None and config.dump_dir is None:  # dumping: run every stage
        from ..compiler.driver import load_program

        t1 = time.perf_counter()
        module = fx_cache.replay(gm, key, disk, report, _install, load_program)
        report.stages["graph_cache_load"] = time.perf_counter() - t1
        report.graph_cache_hit = module is not None
    if module is None:
        concrete = lazy.get() if lazy is not None else pipeline
        assert not isinstance(concrete, _LazyPipeline)
        target_name = lazy.target if lazy is not None else None
        tuner = _make_tuner(lazy, target_name)
        module, manifest = _compile_partitioned(gm, concrete, report, target_name, tuner=tuner)
        if key is not None and disk is not None and manifest is not None:
            fx_cache.store(disk, key, manifest)
    if modules is not None:
        modules.append(module)
    if kind == "forward":
        report_forward_output_strides(module, example_inputs)
    fn = _guard_gpu_state(module, _fast_callable(module))
    if not getattr(fn, "_boxed_call", False):
        fn = make_boxed_func(fn)
    return fn


def _make_tuner(lazy: Optional[_LazyPipeline], target_name: Optional[str]) -> Optional["Tuner"]:
    """The tuner for one graph, or None where nothing may be tuned: mode off, the reference or
    GPU engine, or a target that does not run here (nothing can be measured)."""
    from ..runtime.tuner import TuneOptions, Tuner, measuring_clock

    config = get_config()
    mode = (lazy.tune if lazy is not None and lazy.tune is not None else config.tune)
    budget = lazy.tune_budget_s if lazy is not None and lazy.tune_budget_s is not None else config.tune_budget_s
    if mode == "off" or config.engine != "llvm" or config.wants_gpu:
        return None
    from ..codegen.target import named_target, runs_here
    from ..runtime.disk_cache import disk_cache, source_digest
    from ..runtime.threads import num_threads

    target = named_target(target_name or config.target)
    if not runs_here(target):
        return None
    context = {"target": fx_cache.host_fingerprint() if target.name == "host" else repr(target),
               "threads": f"{num_threads()}/{torch.get_num_threads()}", "torch": torch.__version__, "torchburn": source_digest()}
    # our kernels run num_threads() threads (0: torch's count), a library call torch's count
    threads = max(num_threads() or torch.get_num_threads(), torch.get_num_threads())
    # an internal compiler error in a candidate (strict mode raises one) must not pass for a
    # candidate that lost
    return Tuner(TuneOptions(mode=mode, budget_s=float(budget)), context, disk_cache(config.cache_dir),
                 fatal=(InternalCompilerError,), measure=measuring_clock(threads))


def _compile_alone(gm: torch.fx.GraphModule, pipeline: "Pipeline", target_name: Optional[str]) -> Callable[..., Any]:
    """`gm` compiled whole by our pipeline, untuned, as a plain function (a tuner's candidate)
    whose `code_key` names the code it runs; raises when any of it would run in PyTorch."""
    sub_report = rep.GraphReport("tuning")
    code_keys: list[str] = []
    module, _ = _compile_partitioned(gm, pipeline, sub_report, target_name, tuner=None, code_keys=code_keys)
    if not sub_report.subgraphs or sub_report.fallbacks or not all(s.compiled for s in sub_report.subgraphs):
        reason = sub_report.subgraphs[0].reason if sub_report.subgraphs else "nothing compiled"
        raise RuntimeError(f"not compiled: {reason}")
    fn = _fast_callable(module)
    if getattr(fn, "_boxed_call", False):  # a boxed launcher takes (and empties) a list
        boxed = fn
        fn = lambda *args: boxed(list(args))  # noqa: E731
    else:
        fn = functools.partial(fn)  # its own object: the attribute below is this candidate's
    from ..ir.hashing import hash_key  # here: the warm path imports no torchburn.ir

    # the programs' code (the tuner measures candidates with the same code once)
    fn.code_key = hash_key(*code_keys)  # type: ignore[attr-defined]
    return fn


@dataclasses.dataclass
class _Outcome:
    """One subgraph's compile (`_compile_partitioned`): its report, its launcher (CPU or GPU;
    none: it runs in PyTorch), its manifest entry, and whether an internal error spoils the
    manifest."""

    report: rep.SubgraphReport
    launcher: Optional[Launcher] = None
    gpu_launcher: Optional["GpuLauncher"] = None
    entry: Optional[dict[str, Any]] = None
    internal_error: bool = False


def _compile_partitioned(gm: torch.fx.GraphModule, pipeline: "Pipeline", report: rep.GraphReport,
                         target_name: Optional[str] = None,
                         tuner: Optional["Tuner"] = None,
                         code_keys: Optional[list[str]] = None) -> tuple[torch.fx.GraphModule, Optional[fx_cache.Manifest]]:
    """The full path: the tuner's library calls (when a `tuner` is given), partition, then
    compile each subgraph (program cache first) for the CPU `target_name` names (None:
    `TORCHBURN_TARGET`); each compiled program's `code_key()` goes to `code_keys` when given. Returns the module and what the FX-graph cache should keep (None when
    a subgraph hit an internal error, which must not be remembered)."""
    from ..codegen.target import named_target
    from ..compiler.driver import compile_graph
    from ..frontend.importer import import_graph
    from ..frontend.partition import partition
    from .launcher_gen import launcher_spec

    capability = capability_misses()
    library: dict[torch.fx.Node, str] = {}
    if tuner is not None:
        from .library_calls import choose_library_calls

        t_tune = time.perf_counter()
        alone = functools.partial(_compile_alone, pipeline=pipeline, target_name=target_name)
        chosen = choose_library_calls(gm, tuner, alone)
        from .qlinear_tuning import choose_qlinear_forms

        choose_qlinear_forms(gm, tuner, alone)
        library = {node: choice.line() for node, choice in chosen.items()}
        report.tuning = [c.line() for c in tuner.choices]
        report.tuning_seconds = time.perf_counter() - t_tune
        report.stages["tuning"] = report.tuning_seconds
    t0 = time.perf_counter()
    result = partition(gm, library)
    report.stages["partition"] = time.perf_counter() - t0
    report.fallbacks = result.fallbacks
    report.library_calls = list(result.library_calls)
    manifest: Optional[fx_cache.Manifest] = fx_cache.Manifest(result.plan, list(result.fallbacks),
                                                             library_calls=list(result.library_calls),
                                                             tuning=list(report.tuning))
    module = result.module
    use_gpu = False
    if get_config().wants_gpu:  # the GPU engine's modules load only when it may be used
        from .gpu_launcher import compile_subgraph, gpu_requested

        use_gpu = gpu_requested()
    target = named_target(target_name) if target_name is not None else None
    outcomes: dict[str, _Outcome] = {}

    def compile_one(name: str, args: Optional[Sequence[Any]] = None) -> Optional[Launcher]:
        """Compile subgraph `name` (for the strides of `args`, fake tensors, where given)."""
        sub: torch.fx.GraphModule = getattr(module, name)
        if args is not None:
            restride_placeholders(sub, args)
        outcome = outcomes[name] = _Outcome(rep.SubgraphReport(name, _op_names(sub)))
        sub_report = outcome.report
        if use_gpu:  # the wgpu engine; what it cannot run goes on to the CPU engine below
            outcome.gpu_launcher = compile_subgraph(sub, name, pipeline, sub_report)
            if outcome.gpu_launcher is not None:
                return None
        _mark_constants(module, name, sub)
        try:
            graph = import_graph(sub, name=name)
            compiled, hit = compile_graph(graph, pipeline, fx_source=functools.partial(_fx_source, sub), target=target)
            spec = launcher_spec(graph, compiled.signature())
            launcher = Launcher(spec, compiled.entry, sub.forward, keepalive=compiled)
        except capability as err:
            sub_report.compiled = False
            sub_report.reason = str(err)
            log.info("torchburn: %s stays in PyTorch: %s", name, err)
            outcome.entry = {"name": name, "ops": sub_report.ops, "reason": sub_report.reason}
            return None
        except Exception as err:  # noqa: BLE001 - a compiler bug must not break the user's model
            outcome.internal_error = True
            _internal_error(name, sub_report, err)
            return None
        sub_report.cache_hit = hit
        if compiled.engine == "reference":  # TORCHBURN_ENGINE=reference: interpreted, no native code
            sub_report.engine = "reference"
        if code_keys is not None:
            code_keys.append(compiled.code_key())
        sub_report.kernels = compiled.kernel_summary()
        sub_report.kept = compiled.kept_summary()
        sub_report.timings = dict(compiled.timings)
        sub_report.pass_times = list(compiled.pass_times)
        outcome.entry = {"name": name, "ops": sub_report.ops, "program": compiled.key, "launcher": spec.as_dict()}
        if sub_report.kept:  # the FX-graph cache's warm path reports it without parsing the program
            outcome.entry["kept"] = sub_report.kept
        outcome.launcher = launcher
        return launcher

    if len(result.subgraphs) > 1 and not use_gpu:
        # Library calls or PyTorch ops between subgraphs: each is compiled for the strides its
        # inputs will really have (`output_strides.compile_in_order`).
        compile_in_order(module, result.subgraphs, compile_one)
    for name in result.subgraphs:
        outcome = outcomes.get(name)
        if outcome is None:
            compile_one(name)
            outcome = outcomes[name]
        report.subgraphs.append(outcome.report)
        sub = getattr(module, name)
        if outcome.gpu_launcher is not None:
            _install(module, name, sub, outcome.gpu_launcher)
            module.meta.setdefault("torchburn_gpu_launchers", []).append(outcome.gpu_launcher)
            manifest = None
            continue
        if outcome.internal_error:
            manifest = None
            continue
        if manifest is not None and outcome.entry is not None:
            manifest.subgraphs.append(outcome.entry)
        if outcome.launcher is not None:
            _install(module, name, sub, outcome.launcher)
    report.stages["subgraphs"] = time.perf_counter() - t0 - report.stages["partition"]
    return module, manifest


def _mark_constants(module: torch.fx.GraphModule, name: str, sub: torch.fx.GraphModule) -> None:
    """Mark the placeholders of subgraph `name` that receive a constant input of the whole
    graph (`CONSTANT_META`, set by `torchburn_backend`), so its import marks them `const`."""
    from ..frontend.meta_keys import CONSTANT_META

    call = next((n for n in module.graph.nodes if n.op == "call_module" and n.target == name), None)
    if call is None:
        return
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(call.args):
        return
    for ph, arg in zip(placeholders, call.args):
        if isinstance(arg, torch.fx.Node) and arg.op == "placeholder" and arg.meta.get(CONSTANT_META):
            ph.meta[CONSTANT_META] = True


def constant_inputs(example_inputs: Sequence[Any], sources: Sequence[Optional[str]], grad_enabled: bool) -> list[int]:
    """Positions of the Dynamo graph's inputs that are a module's parameters or buffers, when
    the graph is an inference graph (grad mode off, or no input requiring grad): what a
    compiled program computes from them alone may be kept across calls (`keep-constant-prep`),
    its launcher checking each call that they are the same tensors at the same version. A
    training graph marks none (its weights change every step)."""
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    if grad_enabled and any(x.requires_grad for x in tensors):
        return []
    return [k for k, x in enumerate(example_inputs)
            if isinstance(x, torch.nn.Parameter)
            or (isinstance(x, torch.Tensor) and k < len(sources) and "._buffers[" in (sources[k] or ""))]


def _mark_graph_constants(g: torch.fx.GraphModule, example_inputs: Sequence[Any], positions: Sequence[int]) -> None:
    """Mark AOTAutograd's forward placeholders at the Dynamo inputs' `positions` constant,
    where its inputs are Dynamo's, one for one (same count, and shape and dtype agree)."""
    from ..frontend.meta_keys import CONSTANT_META

    placeholders = [n for n in g.graph.nodes if n.op == "placeholder"]
    if not positions or len(placeholders) != len(example_inputs):
        return
    for k in positions:
        val, x = placeholders[k].meta.get("val"), example_inputs[k]
        if not (isinstance(val, torch.Tensor) and val.shape == x.shape and val.dtype == x.dtype):
            return
    for k in positions:
        placeholders[k].meta[CONSTANT_META] = True


class InternalCompilerError(RuntimeError):
    """A compiler bug met while compiling a subgraph, raised in strict mode
    (`TORCHBURN_STRICT=1`, or `TORCHBURN_DEBUG=1`); the original error is its `__cause__`.
    Without strict mode the subgraph runs in PyTorch and `explain()` shows the error."""


def capability_misses() -> tuple[type[BaseException], ...]:
    """The errors that mean "torchburn cannot compile this (yet)": no lowering for an op, a
    dtype it has no type for, a symbolic size its index arithmetic cannot express. The
    subgraph runs in PyTorch, in every mode. Any other error in the compile path is a bug."""
    from ..frontend.dtypes import UnsupportedDType
    from ..frontend.registry import Unsupported
    from ..frontend.symbols import UnsupportedSymbolic

    return (Unsupported, UnsupportedDType, UnsupportedSymbolic)


def _where(err: BaseException) -> Optional[str]:
    """The innermost frame of the traceback inside torchburn, as "path:line in function"."""
    import os
    import traceback

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the torchburn package
    frames = [f for f in traceback.extract_tb(err.__traceback__) if os.path.abspath(f.filename).startswith(root)]
    if not frames:
        return None
    f = frames[-1]
    return f"{os.path.relpath(f.filename, os.path.dirname(root))}:{f.lineno} in {f.name}"


def _internal_error(name: str, sub_report: rep.SubgraphReport, err: Exception) -> None:
    """Record an internal compiler error on the subgraph's report; in strict mode, raise it."""
    sub_report.compiled = False
    sub_report.internal_error = f"{type(err).__name__}: {err}"
    sub_report.error_where = _where(err)
    sub_report.reason = f"internal compiler error ({sub_report.internal_error})"
    config = get_config()
    if config.strict or config.debug:
        raise InternalCompilerError(
            f"torchburn: internal compiler error in {name} ({len(sub_report.ops)} ops) at "
            f"{sub_report.error_where}: {sub_report.internal_error}") from err
    log.warning("torchburn: %s stays in PyTorch after an internal compiler error: %s (at %s; "
                "TORCHBURN_STRICT=1 raises it)", name, sub_report.internal_error, sub_report.error_where)


def _fx_source(sub: torch.fx.GraphModule) -> str:
    """The ATen subgraph as Python, with each node's source line (for `00_fx_graph.py`)."""
    return sub.print_readable(print_output=False, include_stride=True, include_device=True)


def _install(module: torch.fx.GraphModule, name: str, sub: torch.fx.GraphModule,
             launcher: "Launcher | GpuLauncher") -> None:
    """Replace the call of submodule `name` by a direct call of the launcher's function, so a
    call costs no nn.Module dispatch."""
    out_node = next(n for n in sub.graph.nodes if n.op == "output")
    single = not isinstance(out_node.args[0], (tuple, list))
    graph = module.graph
    for node in list(graph.nodes):
        if node.op == "call_module" and node.target == name:
            with graph.inserting_before(node):
                call = graph.call_function(launcher.launch, node.args, node.kwargs)
                call.meta = dict(node.meta)
                replacement = call
                if single:
                    with graph.inserting_after(call):
                        replacement = graph.call_function(operator.getitem, (call, 0))
                        replacement.meta = dict(node.meta)
            node.replace_all_uses_with(replacement)
            graph.erase_node(node)
            if _drop_writebacks(graph, call, single, getattr(launcher, "inplace_results", {})):
                launcher.aot_bumps_written = True  # type: ignore[union-attr]
    delattr(module, name)


def _drop_writebacks(graph: torch.fx.Graph, call: torch.fx.Node, single: bool, inplace: dict[int, int]) -> bool:
    """Erase AOTAutograd's `copy_(input, result)` for the results the launcher wrote into the
    input itself (`GpuLauncher.inplace_results`; its fallback writes them back): on the GPU
    engine the copy would move the input's version counter and so upload it again. Returns
    whether any was erased (AOTAutograd's wrapper then bumps those inputs' versions once per
    call itself, before the graph runs: `gpu_resident.bind` expects that)."""
    erased = False
    for k, pos in inplace.items():
        picks = [call] if single and k == 0 else []
        picks += [u for u in call.users if u.target is operator.getitem and u.args[1] == k]
        for pick in picks:
            for user in list(pick.users):
                if (user.target is torch.ops.aten.copy_.default and user.args[1] is pick
                        and user.args[0] is call.args[pos]):
                    user.replace_all_uses_with(call.args[pos])
                    graph.erase_node(user)
                    erased = True
    return erased


def _guard_gpu_state(module: torch.fx.GraphModule, fn: Callable[..., Any]) -> Callable[..., Any]:
    """On the GPU engine, a graph that runs anything besides GPU subgraphs (a CPU-engine
    subgraph, a PyTorch op; or no GPU subgraph at all) must not read a tensor whose values the
    GPU owns (`gpu_resident.keep_on_gpu`) from its stale host copy: stale arguments are brought
    to the host before it runs, and its GPU launchers write back what they write in place. A
    graph all on the GPU needs neither."""
    gpu = module.meta.get("torchburn_gpu_launchers", []) if hasattr(module, "meta") else []
    cfg = get_config()
    if not gpu and not cfg.wants_gpu:
        return fn  # the CPU engine only
    launches = {id(g.launch) for g in gpu}
    mixed = not gpu or any(n.op == "call_function" and n.target is not operator.getitem
                           and id(n.target) not in launches for n in module.graph.nodes)
    if not mixed:
        return fn
    from . import gpu_resident

    for g in gpu:
        g.write_back_always = True

    def guarded(args: Any) -> Any:
        gpu_resident.to_host_all(args)
        return fn(args)

    guarded._boxed_call = True  # type: ignore[attr-defined]
    return guarded if getattr(fn, "_boxed_call", False) else _unboxed_guard(fn)


def _unboxed_guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    from . import gpu_resident

    def guarded(*args: Any) -> Any:
        gpu_resident.to_host_all(args)
        return fn(*args)

    return guarded


def _fast_callable(module: torch.fx.GraphModule) -> Callable[..., Any]:
    """The graph as a plain function. When the whole graph is one launcher call taking the
    graph's inputs in order, that launcher's function itself."""
    module.graph.lint()
    nodes = list(module.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    # the `getitem`s picking the launcher's results are part of the direct call
    calls = [n for n in nodes if n.op == "call_function"
             and not (n.target is operator.getitem and isinstance(n.args[0], torch.fx.Node)
                      and n.args[0].op == "call_function" and getattr(n.args[0].target, "__name__", "") == "launch")]
    output = nodes[-1]
    if (len(calls) == 1 and isinstance(calls[0].target, types.FunctionType)
            and calls[0].target.__name__ == "launch" and list(calls[0].args) == placeholders
            and not calls[0].kwargs and isinstance(output.args[0], (tuple, list))
            and all(isinstance(o, torch.fx.Node) for o in output.args[0])):
        # outputs are `getitem(call, k)` nodes or the call itself in order
        return _direct(calls[0].target, output.args[0], calls[0])
    plain = torch.fx.GraphModule(module, module.graph)
    return plain.forward


def _direct(launch: Callable[..., Any], outputs: Sequence[torch.fx.Node], call: torch.fx.Node) -> Callable[..., Any]:
    picks = []
    for o in outputs:
        if o.op == "call_function" and o.target is operator.getitem and o.args[0] is call:
            picks.append(o.args[1])
        else:
            return torch.fx.GraphModule(torch.nn.Module(), call.graph).forward
    if picks == list(range(len(picks))) and getattr(launch, "n_results", None) == len(picks):
        return getattr(launch, "boxed", launch)

    def pick(*args: Any) -> Any:
        out = launch(*args)
        return tuple(out[k] for k in picks)

    return pick


def _input_sources(gm: torch.fx.GraphModule) -> list[Optional[str]]:
    """Dynamo's name of the source of each graph input (read before AOTAutograd runs)."""
    out: list[Optional[str]] = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            source = getattr(node.meta.get("grapharg"), "source", None)
            name = getattr(source, "name", None)
            out.append(str(name() if callable(name) else name) if name is not None else None)
    return out


def _partition_fn(name: str) -> Callable[..., Any]:
    """AOTAutograd's partitioner of the joint training graph that `name` picks."""
    from torch._functorch import partitioners

    if name == "save-all":
        return partitioners.default_partition
    return functools.partial(partitioners.min_cut_rematerialization_partition, compiler="inductor")


def torchburn_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Callable[..., Any]:
    """The backend Dynamo calls (registered as "torchburn" through an entry point)."""
    t0 = time.perf_counter()
    config = get_config()  # fail early on a bad TORCHBURN_* variable
    pipeline = _LazyPipeline(kwargs.get("options"))
    from .decomp_cache import decomposition_table

    decompositions = decomposition_table(config)
    rep.add_backend_setup(time.perf_counter() - t0)

    compilations = inference_path.Compilations()
    grad_enabled = torch.is_grad_enabled()
    observers = list(_observers.stack)
    modules: Optional[list[torch.fx.GraphModule]] = [] if observers else None
    sources = _input_sources(gm)
    constants = constant_inputs(example_inputs, sources, grad_enabled)

    def fw(g: torch.fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
        _mark_graph_constants(g, example_inputs, constants)
        fn = compile_fx_graph(g, inputs, pipeline=pipeline, kind="forward", modules=modules)
        compilations.forward.append((g, fn, inference_path.fw_metadata()))
        return fn

    def bw(g: torch.fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
        compilations.backward += 1
        return compile_fx_graph(g, inputs, pipeline=pipeline, kind="backward")

    compile_with_aot = aot_autograd(fw_compiler=fw, bw_compiler=bw, decompositions=decompositions,
                                    partition_fn=_partition_fn(pipeline.partitioner),
                                    keep_inference_input_mutations=True)
    # AOTAutograd's tracing, our partition, import and compile recurse deeply below Dynamo's
    # frames: run them on one large frame-stack chunk (runtime/frame_stack.py)
    wrapped = run_on_deep_stack(compile_with_aot, gm, example_inputs)
    for callback in observers:
        callback(sources, example_inputs, compilations, modules)
    return inference_path.direct_callable(compilations, example_inputs, grad_enabled) or wrapped
