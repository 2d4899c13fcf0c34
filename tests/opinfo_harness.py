"""Run PyTorch's OpInfo samples through a `torch.compile` backend and judge the results.

One procedure serves the OpInfo test (`tests/test_opinfo.py`), the pass-rate benchmark that
compares us with Inductor (`benchmarks/opinfo_pass_rate.py`) and the coverage report
(`tools/gen_ops_coverage.py`):

- samples come from `op.sample_inputs("cpu", dtype)` in their natural order, after
  `torch.manual_seed(SEED)`, at most `max_samples` of them;
- the op becomes a function of the sample's tensors (everything else is a constant), compiled
  with `fullgraph=True, dynamic=False` after a Dynamo reset, so each sample is one graph;
- eager and compiled runs start from the same RNG seed on their own clones of the inputs;
- results compare with `assert_close` (`equal_nan`), at tolerances that are the larger of
  `assert_close`'s defaults for the dtype and any `toleranceOverride` the OpInfo declares
  (integer and bool samples: each result at its own dtype's defaults, so `sinh(int)` compares
  as float); a sample eager itself rejects is passed over;
  f16/bf16 results may instead match a reference computed in f64 and rounded to the dtype
  (eager rounds every intermediate, a fused kernel does not);
- indices of sort/argsort (unless `stable=True`), topk, kthvalue and mode may differ from
  eager's only in which of equal keys they point at (PyTorch leaves that unspecified);
- for TorchBurn, the compile reports must show no op left to PyTorch, except ops listed in
  `torchburn.frontend.partition.NOT_COMPILED` and tensors of kinds the compiler never takes
  (`is_deliberate` there), which must fall back and still be correct;
- when Dynamo itself cannot capture the sample as one graph (a Python bool result, a sparse
  tensor...), no backend can compile it: the sample is `graph_break`, and it runs again
  without `fullgraph` to check that the result is still right;
- OpInfos that seed the RNG inside the op (`wrapper_set_seed`) call the op directly: the
  harness seeds before both runs instead, so ops left to PyTorch draw the same numbers;
- the results of `empty`-like ops are uninitialized memory: only dtype and shape compare.
"""
from __future__ import annotations

import itertools
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
import torch.utils._pytree as pytree

SEED = 1234
#: Statuses of one sample. The first two count as passing.
PASS, EXPECTED_FALLBACK = "pass", "expected_fallback"
FALLBACK, MISMATCH, ERROR, GRAPH_BREAK = "fallback", "mismatch", "error", "graph_break"
PASSING = (PASS, EXPECTED_FALLBACK)

#: OpInfos whose result is uninitialized memory: compare dtype and shape only.
UNINITIALIZED = frozenset({"empty", "empty_like", "new_empty", "new_empty_strided",
                           "empty_strided", "empty_permuted"})


@dataclass
class SampleResult:
    op: str
    dtype: str
    index: int
    status: str
    detail: str = ""
    #: ATen ops that ran in PyTorch (TorchBurn only): "aten.x.overload: reason".
    fallbacks: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: ATen ops TorchBurn compiled for this sample (empty for other backends).
    compiled_ops: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status in PASSING

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def op_name(op: Any) -> str:
    """The OpInfo's full name: `name` or `name.variant`."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _call_unseeded(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return op(*args, **kwargs)


def op_database() -> list[Any]:
    """PyTorch's OpInfo list, with `wrapper_set_seed` made a plain call (see the module doc)."""
    from torch.testing._internal import common_methods_invocations as cmi

    cmi.wrapper_set_seed = _call_unseeded  # the OpInfo lambdas look it up at call time
    return list(cmi.op_db)


def samples(op: Any, dtype: torch.dtype, max_samples: Optional[int]) -> list[Any]:
    """The first `max_samples` samples (all when None), deterministic for a given torch."""
    torch.manual_seed(SEED)
    gen = op.sample_inputs("cpu", dtype, requires_grad=False)
    return list(gen if max_samples is None else itertools.islice(gen, max_samples))


# ---- tolerances -------------------------------------------------------------------------------

def _default_tol(dtype: torch.dtype) -> tuple[float, float]:
    """assert_close's (rtol, atol) for a dtype (0, 0 for exact dtypes)."""
    table = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
             torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7)}
    return table.get(dtype, (0.0, 0.0))


def tolerances(op: Any, dtype: torch.dtype) -> tuple[Optional[float], Optional[float]]:
    """(rtol, atol): assert_close's defaults, loosened by any `toleranceOverride` of the op.
    For integer and bool samples, (None, None): each result compares at the defaults of its
    own dtype (exact for integers, float ones for `sinh(int)`)."""
    from torch.testing._internal.common_device_type import toleranceOverride

    if not dtype.is_floating_point:
        return None, None
    rtol, atol = _default_tol(dtype)
    for info in getattr(op, "decorators", ()) or ():
        for deco in getattr(info, "decorators", ()) or ():
            if isinstance(deco, toleranceOverride) and dtype in deco.d:
                t = deco.d[dtype]
                rtol, atol = max(rtol, t.rtol), max(atol, t.atol)
    return rtol, atol


# ---- running ------------------------------------------------------------------------------------

def _as_function(op: Any, sample: Any) -> tuple[Callable[..., Any], list[torch.Tensor]]:
    """`fn(*tensors)` calling the op on the sample, whose other arguments are constants."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    tensors = [leaves[i] for i in positions]
    const = list(leaves)
    fn_op = op.op

    def fn(*ts: torch.Tensor) -> Any:
        vals = list(const)
        for i, t in zip(positions, ts):
            vals[i] = t
        inp, args, kwargs = pytree.tree_unflatten(vals, spec)
        return fn_op(inp, *args, **kwargs)

    return fn, tensors


def _clone(tensors: Sequence[torch.Tensor], dtype: Optional[torch.dtype] = None) -> list[torch.Tensor]:
    out = []
    for t in tensors:
        c = t.detach().clone()
        if dtype is not None and c.is_floating_point():
            c = c.to(dtype)
        out.append(c)
    return out


def _close(actual: Any, expected: Any, rtol: Optional[float], atol: Optional[float]) -> Optional[str]:
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True,
                                   check_device=True, check_stride=False)
    except (AssertionError, TypeError, ValueError, RuntimeError) as err:
        return str(err).strip().splitlines()[0] + " " + " ".join(str(err).strip().splitlines()[1:4])
    return None


def _to_dtype(x: Any, dtype: torch.dtype) -> Any:
    return pytree.tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, x)


def _compare(fn: Callable[..., Any], tensors: list[torch.Tensor], actual: Any, expected: Any,
             dtype: torch.dtype, rtol: Optional[float], atol: Optional[float]) -> Optional[str]:
    problem = _close(actual, expected, rtol, atol)
    if problem is None or dtype not in (torch.float16, torch.bfloat16):
        return problem
    # Low precision: a result as good as the f64 computation rounded to the dtype also passes.
    try:
        torch.manual_seed(SEED)
        ref = _to_dtype(fn(*_clone(tensors, torch.float64)), dtype)
    except Exception:  # noqa: BLE001 - the op may not support f64: keep the first verdict
        return problem
    return problem if _close(actual, ref, rtol, atol) is not None else None


#: OpInfos whose indices PyTorch leaves unspecified among equal keys (its sort is not stable
#: unless asked; topk, kthvalue and mode pick any of the tied positions): name -> position of
#: `dim` among the sample's args.
TIED_INDICES: dict[str, int] = {"sort": 0, "argsort": 0, "topk": 1, "kthvalue": 1, "mode": 0}


def _equal_keys(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all()) if a.shape == b.shape else False


def _ties_resolved(name: str, sample: Any, actual: Any, expected: Any) -> Any:
    """`actual` with its indices replaced by eager's where they differ only in which of equal
    keys they point at, so the comparison that follows judges the values (and anything else)
    as usual. They must point at keys equal to those eager's point at, one position each
    (a permutation along the dim for sort and argsort): an index that is merely in range does
    not pass. A sort asked to be stable keeps the exact comparison."""
    if name not in TIED_INDICES or sample.kwargs.get("stable") or not isinstance(sample.input, torch.Tensor):
        return actual
    single = isinstance(expected, torch.Tensor)
    got, want = (actual, expected) if single else (actual[1], expected[1])
    if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)) or got.shape != want.shape \
            or got.dtype != want.dtype or torch.equal(got, want):
        return actual
    dim_pos = TIED_INDICES[name]
    dim = sample.kwargs.get("dim", sample.args[dim_pos] if len(sample.args) > dim_pos else -1)
    x = sample.input if sample.input.dim() else sample.input.reshape(1)
    dim = dim % x.dim()
    # kthvalue and mode drop the dim unless keepdim
    g, w = (got, want) if got.dim() == x.dim() else (got.unsqueeze(dim), want.unsqueeze(dim))
    if bool(((g < 0) | (g >= x.shape[dim])).any()) or not _equal_keys(x.gather(dim, g), x.gather(dim, w)):
        return actual
    order = torch.sort(g, dim).values
    if name in ("sort", "argsort") and not torch.equal(order, torch.arange(x.shape[dim]).expand_as(order)):
        return actual
    if g.shape[dim] > 1 and bool((order.diff(dim=dim) == 0).any()):
        return actual  # a position picked twice
    return want if single else type(actual)((actual[0], want, *actual[2:]))


def _backend_fn(backend: str) -> Any:
    if backend == "torchburn":
        from torchburn.backend.entry import torchburn_backend

        return torchburn_backend
    return backend


def _shape_only(x: Any) -> Any:
    """Tensors replaced by zeros of their dtype and shape, so only those compare."""
    return pytree.tree_map(lambda t: torch.zeros(t.shape, dtype=t.dtype) if isinstance(t, torch.Tensor) else t, x)


def _is_capture_error(err: BaseException) -> bool:
    """Dynamo could not make one graph of the sample (before any backend saw it)."""
    from torch._dynamo import exc

    return isinstance(err, (exc.Unsupported, exc.UserError)) and not isinstance(err, exc.BackendCompilerFailed)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"[:400]


def _compile_and_run(fn: Callable[..., Any], tensors: list[torch.Tensor], backend: str,
                     fullgraph: bool) -> tuple[Any, list[Any]]:
    from torchburn.backend import report as rep

    torch._dynamo.reset()
    records = rep.start_recording()
    try:
        with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True):
            compiled = torch.compile(fn, backend=_backend_fn(backend), fullgraph=fullgraph, dynamic=False)
            torch.manual_seed(SEED)
            return compiled(*_clone(tensors)), list(records) if backend == "torchburn" else []
    finally:
        rep.stop_recording()


def run_sample(op: Any, sample: Any, index: int, dtype: torch.dtype, backend: str = "torchburn") -> SampleResult:
    """Compile one sample with `backend`, run it, and judge it against eager."""
    name, dname = op_name(op), str(dtype).replace("torch.", "")
    fn, tensors = _as_function(op, sample)
    rtol, atol = tolerances(op, dtype)
    t0 = time.perf_counter()
    try:
        torch.manual_seed(SEED)
        expected = fn(*_clone(tensors))
    except Exception as err:  # noqa: BLE001 - a sample eager rejects says nothing about us
        return SampleResult(name, dname, index, PASS, f"eager raised {type(err).__name__}; skipped")
    capture_problem = None
    try:
        actual, records = _compile_and_run(fn, tensors, backend, fullgraph=True)
    except Exception as err:  # noqa: BLE001 - any failure to compile or run is the verdict
        if not _is_capture_error(err):
            return SampleResult(name, dname, index, ERROR, _first_line(err), seconds=time.perf_counter() - t0)
        capture_problem = _first_line(err)
        try:
            actual, records = _compile_and_run(fn, tensors, backend, fullgraph=False)
        except Exception as err2:  # noqa: BLE001
            return SampleResult(name, dname, index, ERROR, f"{capture_problem}; then {_first_line(err2)}",
                                seconds=time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    if op.name in UNINITIALIZED:
        actual, expected = _shape_only(actual), _shape_only(expected)
    actual = _ties_resolved(name, sample, actual, expected)
    problem = _compare(fn, tensors, actual, expected, dtype, rtol, atol)
    if problem is not None:
        return SampleResult(name, dname, index, MISMATCH, problem[:400], seconds=seconds)
    fallbacks, expected_only = _fallbacks(records)
    compiled = sorted({o for r in records for sg in r.subgraphs if sg.compiled for o in sg.ops})
    if fallbacks and not expected_only:
        status, detail = FALLBACK, capture_problem or ""
    elif capture_problem is not None:
        status, detail = GRAPH_BREAK, capture_problem
    else:
        status, detail = (EXPECTED_FALLBACK if fallbacks else PASS), ""
    return SampleResult(name, dname, index, status, detail, fallbacks, seconds, compiled)


def _fallbacks(records: Iterable[Any]) -> tuple[list[str], bool]:
    """("op: reason" for every op left to PyTorch, whether all of them stay there by design)."""
    from torchburn.frontend.partition import is_deliberate

    out: list[str] = []
    expected_only = True
    for r in records:
        for target, why in r.fallbacks:
            out.append(f"{target}: {why}")
            expected_only &= is_deliberate(target, why)
        for s in r.subgraphs:
            if not s.compiled:
                out.extend(f"{o}: {s.reason}" for o in s.ops)
                expected_only = False
    return sorted(set(out)), expected_only


def run_op(op: Any, dtype: torch.dtype, max_samples: Optional[int], backend: str = "torchburn") -> list[SampleResult]:
    """Every selected sample of one op; a failure to make samples is one ERROR result."""
    try:
        chosen = samples(op, dtype, max_samples)
    except Exception as err:  # noqa: BLE001
        return [SampleResult(op_name(op), str(dtype).replace("torch.", ""), -1, ERROR,
                             f"sample_inputs raised {type(err).__name__}: {err}"[:400])]
    results = []
    for i, s in enumerate(chosen):
        try:
            results.append(run_sample(op, s, i, dtype, backend))
        except Exception:  # noqa: BLE001 - a harness bug must not hide the other samples
            results.append(SampleResult(op_name(op), str(dtype).replace("torch.", ""), i, ERROR,
                                        traceback.format_exc(limit=3)[-400:]))
    return results
