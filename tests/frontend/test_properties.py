"""Property tests: compiled (LLVM) vs the reference engine vs eager, on random shapes (0 and 1
included), broadcasting, strided and transposed inputs, several dtypes, reductions over random
dim sets. Shapes stay small: the reference engine is an interpreter."""
from __future__ import annotations

from typing import Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import check_engines as check

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
DTYPES = [torch.float32, torch.float64, torch.int64, torch.bool]


@st.composite
def shapes(draw: st.DrawFn, min_rank: int = 0, max_rank: int = 3) -> tuple[int, ...]:
    rank = draw(st.integers(min_rank, max_rank))
    return tuple(draw(st.sampled_from([0, 1, 2, 3, 5, 8])) if draw(st.booleans()) else draw(st.integers(1, 9))
                 for _ in range(rank))


def make(shape: tuple[int, ...], dtype: torch.dtype, layout: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if layout == "transposed" and len(shape) >= 2:
        base = make(shape[:-2] + (shape[-1], shape[-2]), dtype, "contiguous", seed)
        return base.transpose(-1, -2)
    if layout == "strided" and len(shape) >= 1:
        base = make(shape[:-1] + (shape[-1] * 2,), dtype, "contiguous", seed)
        return base[..., ::2]
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    return torch.randint(-20, 20, shape, generator=g).to(dtype)


layouts = st.sampled_from(["contiguous", "transposed", "strided"])


@st.composite
def broadcast_partner(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with `shape`: some dims set to 1, some leading dims dropped."""
    drop = draw(st.integers(0, len(shape)))
    out = [1 if draw(st.booleans()) else d for d in shape[drop:]]
    return tuple(out)


BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum,
    "minimum": torch.minimum, "eq": torch.eq, "lt": torch.lt, "ge": torch.ge,
    "where_gt": lambda a, b: torch.where(a > b, a, b),
}


@SETTINGS
@given(data=st.data(), op=st.sampled_from(sorted(BINARY)), dtype=st.sampled_from(DTYPES[:3]),
       layout=layouts, seed=st.integers(0, 1000))
def test_binary_broadcasting(data: st.DataObject, op: str, dtype: torch.dtype, layout: str, seed: int) -> None:
    shape = data.draw(shapes())
    other = data.draw(broadcast_partner(shape))
    a = make(shape, dtype, layout, seed)
    b = make(other, dtype, "contiguous", seed + 1)
    if op in ("sub",) and dtype == torch.bool:
        return
    check(BINARY[op], a, b)


@SETTINGS
@given(shape=shapes(), dtype=st.sampled_from(DTYPES), other=st.sampled_from(DTYPES), layout=layouts,
       seed=st.integers(0, 1000))
def test_type_promotion_and_casts(shape: tuple[int, ...], dtype: torch.dtype, other: torch.dtype,
                                   layout: str, seed: int) -> None:
    a = make(shape, dtype, layout, seed)
    b = make(shape, other, "contiguous", seed + 1)
    if dtype == torch.bool and other == torch.bool:
        check(lambda x, y: x | y, a, b)
        return
    check(lambda x, y: (x + y, x.to(other), y * 2), a, b)


UNARY = {
    "exp": torch.exp, "log_abs": lambda t: torch.log(t.abs() + 1), "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "erf": torch.erf, "sqrt_abs": lambda t: torch.sqrt(t.abs()),
    "neg": torch.neg, "abs": torch.abs, "relu": torch.relu, "floor": torch.floor,
    "gelu": torch.nn.functional.gelu, "sin": torch.sin,
}


@SETTINGS
@given(shape=shapes(), op=st.sampled_from(sorted(UNARY)), dtype=st.sampled_from([torch.float32, torch.float64]),
       layout=layouts, seed=st.integers(0, 1000))
def test_unary(shape: tuple[int, ...], op: str, dtype: torch.dtype, layout: str, seed: int) -> None:
    check(UNARY[op], make(shape, dtype, layout, seed))


REDUCTIONS = {
    "sum": lambda t, d, k: t.sum(d, keepdim=k),
    "mean": lambda t, d, k: t.mean(d, keepdim=k),
    "amax": lambda t, d, k: t.amax(d, keepdim=k),
    "amin": lambda t, d, k: t.amin(d, keepdim=k),
}


@SETTINGS
@given(data=st.data(), op=st.sampled_from(sorted(REDUCTIONS)), dtype=st.sampled_from([torch.float32, torch.float64, torch.int64]),
       keepdim=st.booleans(), layout=layouts, seed=st.integers(0, 1000))
def test_reductions_over_random_dims(data: st.DataObject, op: str, dtype: torch.dtype, keepdim: bool,
                                     layout: str, seed: int) -> None:
    shape = data.draw(shapes(min_rank=1))
    if op in ("amax", "amin"):
        shape = tuple(max(d, 1) for d in shape)  # torch refuses empty max
    if op == "mean" and not dtype.is_floating_point:
        dtype = torch.float32
    dims = data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape), unique=True))
    x = make(shape, dtype, layout, seed)
    fn = REDUCTIONS[op]
    check(lambda t: fn(t, dims, keepdim), x)


VIEWS = {
    "permute_add": lambda t: t.permute(*reversed(range(t.dim()))) + 1,
    "reshape_flat": lambda t: t.reshape(-1) * 2,
    "unsqueeze_expand": lambda t: t.unsqueeze(0).expand(3, *t.shape) + 0,
    "slice": lambda t: t[..., 1::2] * 3 if t.dim() else t * 3,
    "transpose_sum": lambda t: t.transpose(0, -1).sum(0) if t.dim() else t,
}


@SETTINGS
@given(shape=shapes(min_rank=1), op=st.sampled_from(sorted(VIEWS)), layout=layouts, seed=st.integers(0, 1000))
def test_views(shape: tuple[int, ...], op: str, layout: str, seed: int) -> None:
    check(VIEWS[op], make(shape, torch.float32, layout, seed))


@SETTINGS
@given(m=st.integers(0, 9), k=st.integers(1, 9), n=st.integers(0, 9), batch=st.integers(1, 3),
       transpose=st.booleans(), dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 1000))
def test_matmul_family(m: int, k: int, n: int, batch: int, transpose: bool, dtype: torch.dtype, seed: int) -> None:
    a = make((m, k), dtype, "contiguous", seed)
    b = make((n, k), dtype, "contiguous", seed + 1).t() if transpose else make((k, n), dtype, "contiguous", seed + 1)
    bias = make((n,), dtype, "contiguous", seed + 2)
    check(lambda x, y, z: (x @ y, torch.addmm(z, x, y)), a, b, bias)
    ba = make((batch, m, k), dtype, "contiguous", seed)
    bb = make((batch, k, n), dtype, "contiguous", seed + 1)
    check(torch.bmm, ba, bb)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 3, 4, 12])
def test_matmul_column_major_b_narrow_panels(n: int, dtype: torch.dtype) -> None:
    """B read along k (a transposed, column-major factor) into panels narrower than the packing
    group (4 f64 columns on AVX2): the panel was left unwritten and the product was NaN."""
    a = make((5, 2), dtype, "contiguous", 0)
    b = make((n, 2), dtype, "contiguous", 1).t()
    check(lambda x, y: x @ y, a, b)
