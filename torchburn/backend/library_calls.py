"""Library calls the tuner may choose over our kernels: ATen's convolutions.

For each convolution node of a graph (`aten.convolution`, and `aten.convolution_backward` in
training), these candidates go to the tuner (`runtime/tuner.py`):

- ``ours``: the node alone, compiled by our whole pipeline (partition, import, passes, LLVM)
  and run through its launcher;
- ``ours-gemm`` (ungrouped forward convolutions of static sizes): the same, lowered as im2col
  and our GEMM instead of the direct kernel (chosen: `node.meta[CONV_FORM] = "gemm"` for the
  lowering);
- ``aten``: the ATen operator itself (oneDNN's convolution on CPU), as Inductor's extern
  kernels call it.

Both run on random tensors of the node's real shapes, strides and dtypes. A symbolic size
(Dynamo's dynamic batch, after a second batch size) is measured at its hint, the size of the
call being compiled, without a guard: the choice then holds for every size the graph takes, as
Inductor's autotuning of dynamic shapes does. `ours` is compiled for the hinted sizes there; the
graph's own kernel is the same lowering with the size a loop bound, but for choices the lowering
makes by size (a weight gradient's GEMM form assumes a symbolic batch of 8:
`nn.SYMBOLIC_BATCH_HINT`), so at a small hint the two can differ. Where ``aten`` wins, the node
is marked to stay a library call: the partitioner leaves it out of the compiled subgraphs, so
it runs between our native segments (the exception to one native call per graph that
DESIGN.md allows), and `explain()` lists it with the times measured. Convolutions too small to
be worth a measurement (`MIN_MACS`), with a size that has no hint, or outside what our lowering
takes are left to our kernels without asking the tuner; so are grouped forward convolutions
(`library_ruled_out`), where only ours is left to propose.

The tuner's budget is spent on the largest convolutions first (by multiply-adds): each
candidate of ours costs a compile (0.3-0.5 s of CPU time), and a budget that runs out should
leave only the small layers unmeasured, where ours (the default) is also the better guess.
"""
from __future__ import annotations

import logging
import math
import operator
from typing import Any, Callable, Optional

import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..frontend.dtypes import to_ir
from ..frontend.lowerings.nn import CONV_FORM
from ..frontend.meta_keys import CONSTANT_META
from ..runtime.tuner import Candidate, Choice, Tuner

log = logging.getLogger("torchburn")

aten = torch.ops.aten
#: The nodes with a library candidate, by target.
TUNABLE = {aten.convolution.default: "convolution", aten.convolution_backward.default: "convolution_backward"}
#: Below this many multiply-adds a convolution is ours without measuring: the launch of a
#: separate library call and the cut in the fused graph would cost more than either kernel.
MIN_MACS = 1 << 21
#: What a library call costs beyond its own run (`Candidate.overhead_s`): a fixed part (the
#: graph runs as one more native call, the call itself goes through the FX module, its result
#: is allocated, and inference loses batch norm folded into our kernel's weights) and a part
#: per byte of its results, which are written to memory and read back by the next subgraph
#: instead of staying in the fused epilogue (at about 8 GB/s, one core's streaming rate).
#: Measured on ResNet-20 (32x32, batch 1, one thread): six library calls each measured ~0.05 ms
#: faster alone made the step 0.12 ms slower per call (inference) and 1.4x slower (training)
#: with a 15 us fixed part; 100 us keeps those layers ours and is noise beside the
#: milliseconds of the layers where oneDNN wins (ResNet-18's, the U-Net's).
CUT_FIXED_S = 100e-6
CUT_SECONDS_PER_BYTE = 2 / 8e9


def _hint(size: Any) -> Optional[int]:
    """`size` as an int: a SymInt by its hint, read without a guard (int() would specialize the
    graph to it); None for one with no hint (an unbacked size)."""
    if not isinstance(size, torch.SymInt):
        return int(size)
    from torch.fx.experimental.symbolic_shapes import optimization_hint

    try:
        return int(optimization_hint(size))
    except Exception:  # noqa: BLE001 - no hint: the node is not measured
        return None


def _hints(sizes: Any) -> Optional[tuple[int, ...]]:
    out = tuple(_hint(s) for s in sizes)
    return None if None in out else out  # type: ignore[return-value]


def _concrete_shape(val: Any) -> Optional[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]:
    if not isinstance(val, torch.Tensor):
        return None
    shape, stride = _hints(val.shape), _hints(val.stride())
    if shape is None or stride is None:
        return None
    return shape, stride, val.dtype


def _symbolic(val: Any) -> bool:
    return isinstance(val, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride()))


def _macs(node: torch.fx.Node) -> int:
    """Multiply-adds of the forward convolution the node is (or differentiates), at the hints."""
    if node.target is aten.convolution.default:
        out = node.meta["val"]
        w = node.args[1].meta["val"]
    else:
        out = node.args[0].meta["val"]  # grad_output has the forward output's shape
        w = node.args[2].meta["val"]
    return math.prod(_hints(out.shape) or (0,)) * math.prod(_hints(w.shape[1:]) or (0,))


def workload(node: torch.fx.Node) -> Optional[dict[str, Any]]:
    """The node as a tuning workload (op, each tensor's shape/stride/dtype, the other
    arguments), or None when a size has no hint. A symbolic node's sizes are its hints, marked
    `symbolic`: its candidates (no `ours-gemm`) and its own lowering differ from a static
    node's of the same sizes, so the two keep separate records."""
    tensors = []
    symbolic = any(_symbolic(arg.meta.get("val")) for arg in node.all_input_nodes)
    for arg in node.all_input_nodes:
        desc = _concrete_shape(arg.meta.get("val"))
        if desc is None:
            return None
        shape, stride, dtype = desc
        tensors.append([list(shape), list(stride), str(dtype).replace("torch.", "")])
    others = [a for a in node.args if not isinstance(a, torch.fx.Node)]
    work = {"op": TUNABLE[node.target], "tensors": tensors, "args": repr(others)}
    if symbolic:
        work["symbolic"] = True
    # inputs that are parameters in inference: our candidate keeps what it computes from them
    # alone (its packed weight) between the runs measured, as the compiled graph will
    constant = [k for k, arg in enumerate(node.all_input_nodes) if _constant(arg)]
    if constant:
        work["constant"] = constant
    return work


def _constant(arg: torch.fx.Node) -> bool:
    return arg.op == "placeholder" and bool(arg.meta.get(CONSTANT_META))


def describe(node: torch.fx.Node) -> str:
    """'f32[8,64,56,56] * f32[64,64,3,3] stride 1 pad 1' style, for explain()."""
    def t(v: Any) -> str:  # a symbolic size by its hint, marked `~`
        dims = [("~" if isinstance(s, torch.SymInt) else "") + str(_hint(s)) for s in v.shape]
        return f"{to_ir(v.dtype)}[{','.join(dims)}]"

    if node.target is aten.convolution.default:
        x, w = node.args[0], node.args[1]
        stride, padding, groups = node.args[3], node.args[4], node.args[8]
    else:
        x, w = node.args[1], node.args[2]
        stride, padding, groups = node.args[4], node.args[5], node.args[9]
    text = f"{t(x.meta['val'])} * {t(w.meta['val'])} stride {list(stride)} pad {list(padding)}"
    return text + (f" groups {groups}" if groups != 1 else "")


def _random_like(val: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    shape, stride, _ = _concrete_shape(val)  # type: ignore[misc]
    out = torch.empty_strided(shape, stride, dtype=val.dtype)
    if out.is_floating_point():
        out.copy_(torch.randn(shape, generator=gen).to(val.dtype))
    else:
        out.zero_()
    return out


def _single_node_graph(node: torch.fx.Node, meta: Optional[dict[str, Any]] = None) -> torch.fx.GraphModule:
    """A graph of `node` alone (with `meta` added to its metadata): its tensor inputs as
    placeholders, its results as outputs."""
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    inputs = [arg.meta["val"] for arg in node.all_input_nodes]
    val = node.meta["val"]
    if any(_symbolic(v) for v in inputs):  # measured at the hints: a graph of static sizes
        inputs, val = _at_hints(node, inputs)
    for i, arg in enumerate(node.all_input_nodes):
        p = g.placeholder(f"arg{i}")
        p.meta["val"] = inputs[i]
        if _constant(arg):
            p.meta[CONSTANT_META] = True
        env[arg] = p
    new = g.node_copy(node, lambda n: env[n])
    new.meta = {**node.meta, **(meta or {}), "val": val}
    if isinstance(val, (tuple, list)):
        outs = []
        for i, v in enumerate(val):
            if v is None:
                continue
            item = g.call_function(operator.getitem, (new, i))
            item.meta["val"] = v
            outs.append(item)
        g.output(tuple(outs))
    else:
        g.output(new)
    return torch.fx.GraphModule(torch.nn.Module(), g)


def _at_hints(node: torch.fx.Node, inputs: list[Any]) -> tuple[list[Any], Any]:
    """The node's input and result values with every symbolic size at its hint (fake tensors
    of a fresh mode; the result by running the node on them)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        static = []
        for v in inputs:
            if isinstance(v, torch.Tensor):
                shape, stride, dtype = _concrete_shape(v)  # type: ignore[misc]
                v = torch.empty_strided(shape, stride, dtype=dtype)  # a fake tensor of `mode`
            static.append(v)
        env = dict(zip(node.all_input_nodes, static))
        args = torch.fx.node.map_arg(node.args, lambda n: env[n])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
        return static, node.target(*args, **kwargs)  # type: ignore[operator]


class _Inputs:
    """The node's inputs as random tensors, made once, on the first candidate's `prepare`."""

    def __init__(self, node: torch.fx.Node, gen: torch.Generator) -> None:
        self.node, self.gen = node, gen
        self._tensors: Optional[list[torch.Tensor]] = None

    def get(self) -> list[torch.Tensor]:
        if self._tensors is None:
            self._tensors = [_random_like(a.meta["val"], self.gen) for a in self.node.all_input_nodes]
        return self._tensors

    def runner(self, fn: Callable[..., Any]) -> Callable[[], Any]:
        """`fn` on these inputs, as a tuner's runner (with `fn`'s `code_key`, if it has one)."""
        args = self.get()
        run = lambda: fn(*args)  # noqa: E731
        run.code_key = getattr(fn, "code_key", None)  # type: ignore[attr-defined]
        return run


#: Compiles a graph by our whole pipeline and returns it as a function (`entry.compile_alone`):
#: handed in, so that this module does not import the entry point that imports it.
CompileAlone = Callable[[torch.fx.GraphModule], Callable[..., Any]]


def candidates(node: torch.fx.Node, gen: torch.Generator, compile_alone: CompileAlone) -> list[Candidate]:
    """`ours` (the direct kernel: the default, what the compiler does without a tuner and what
    a spent budget uses), for an ungrouped forward convolution `ours-gemm` (im2col and our
    GEMM, `nn._conv_gemm`), and `aten` unless `library_ruled_out`."""
    inputs = _Inputs(node, gen)

    def ours(meta: Optional[dict[str, Any]] = None) -> Callable[[], Callable[[], Any]]:
        def prepare() -> Callable[[], Any]:
            return inputs.runner(compile_alone(_single_node_graph(node, meta)))
        return prepare

    def library() -> Callable[[], Any]:
        env = dict(zip(node.all_input_nodes, inputs.get()))
        args = torch.fx.node.map_arg(node.args, lambda n: env[n])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
        op = node.target
        return lambda: op(*args, **kwargs)

    out = [Candidate("ours", "generated", ours(), default=True)]
    if _gemm_form_plausible(node):
        out.append(Candidate("ours-gemm", "generated", ours({CONV_FORM: "gemm"})))
    if not library_ruled_out(node):
        out.append(Candidate("aten", "library", library, overhead_s=cut_overhead(node)))
    return out


def _groups(node: torch.fx.Node) -> int:
    return int(node.args[8] if node.target is aten.convolution.default else node.args[9])


def library_ruled_out(node: torch.fx.Node) -> bool:
    """Whether the library call cannot win for `node` and is not worth a measurement: a grouped
    forward convolution. ATen's (oneDNN's) grouped kernel on NCHW lost to ours by 1.4-2.7x
    before the cut's charge on every depthwise layer of EfficientNet-B0 at batch 1, one thread
    (32 channels at 112x112: ours 0.71 ms, ATen 1.89 ms; 672 channels 5x5 at 14x14: 0.21 ms
    and 0.31 ms); its gradients (`convolution_backward`) are still measured."""
    return node.target is aten.convolution.default and _groups(node) != 1


def cut_overhead(node: torch.fx.Node) -> float:
    """`CUT_FIXED_S` plus `CUT_SECONDS_PER_BYTE` for every byte of the node's results."""
    vals = node.meta["val"] if isinstance(node.meta["val"], (tuple, list)) else [node.meta["val"]]
    nbytes = sum(math.prod(_hints(v.shape) or (0,)) * v.element_size() for v in vals if isinstance(v, torch.Tensor))
    return CUT_FIXED_S + CUT_SECONDS_PER_BYTE * nbytes


#: The GEMM form is proposed for 1x1 kernels and for outputs of at most this many positions
#: per image (deep layers of small images); elsewhere its im2col costs more than the direct
#: kernel's short tiles (measured on ResNet-18's layers: it lost every 3x3 layer above 7x7).
GEMM_FORM_MAX_POSITIONS = 64


def _gemm_form_plausible(node: torch.fx.Node) -> bool:
    """Whether `ours-gemm` is worth measuring for `node` (a prune, as Triton's
    `prune_configs_by`: a candidate that cannot win costs a compile and its rounds)."""
    from ..passes.loopgen.conv import POINTWISE_GEMM_MIN_CIN, POINTWISE_GEMM_MIN_COUT

    if node.target is not aten.convolution.default or node.args[8] != 1 or node.args[6]:
        return False
    w, out = node.args[1].meta["val"], node.meta["val"]
    if _symbolic(node.args[0].meta["val"]) or _symbolic(out):
        return False  # the lowering's GEMM form (`nn._conv_gemm`) takes static sizes only
    pointwise = math.prod(int(k) for k in w.shape[2:]) == 1
    if (pointwise and not any(node.args[4]) and int(w.shape[0]) >= POINTWISE_GEMM_MIN_COUT
            and int(w.shape[1]) >= POINTWISE_GEMM_MIN_CIN):
        return False  # `ours` is this product already, with its epilogue (`loopgen/conv_pointwise.py`)
    return pointwise or math.prod(int(o) for o in out.shape[2:]) <= GEMM_FORM_MAX_POSITIONS


def choose_library_calls(gm: torch.fx.GraphModule, tuner: Tuner,
                         compile_alone: CompileAlone) -> dict[torch.fx.Node, Choice]:
    """The convolution nodes of `gm` the tuner gave to ATen, with the choice that decided it.
    A node whose GEMM form won is marked for the lowering (`node.meta[CONV_FORM] = "gemm"`).
    Every tunable node the tuner was asked about is in `tuner.choices`."""
    from ..frontend.partition import unsupported_reason

    chosen: dict[torch.fx.Node, Choice] = {}
    gen = torch.Generator().manual_seed(0)
    tunable: list[tuple[torch.fx.Node, dict[str, Any], list[Candidate]]] = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in TUNABLE:
            continue
        work = workload(node)
        if work is None or unsupported_reason(node) is not None or _macs(node) < MIN_MACS:
            continue
        proposed = candidates(node, gen, compile_alone)
        if len(proposed) > 1:
            tunable.append((node, work, proposed))
    # the largest first: a budget spent leaves the smallest to the default (sorted is stable:
    # equal sizes keep the graph's order)
    for node, work, proposed in sorted(tunable, key=lambda t: -_macs(t[0])):
        with unset_fake_temporarily():  # AOTAutograd compiles under a fake mode: measure real tensors
            choice = tuner.choose(TUNABLE[node.target], work, describe(node), proposed)
        if choice.chosen == "aten":
            chosen[node] = choice
        elif choice.chosen == "ours-gemm":
            node.meta[CONV_FORM] = "gemm"
    return chosen
