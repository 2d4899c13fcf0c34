"""Fuzzing in CI (issue 16): hypothesis builds random tensor graphs (ops drawn from a table,
shapes with 0 and 1, broadcasting, transposed and strided inputs, float and integer dtypes),
compiles each with torchburn and compares with eager. Bounded: few examples, each one graph.

A failing example prints its recipe (`Recipe.__repr__`), which replays the graph by hand.
CI runs a fixed set of 15 graphs; `FUZZ_EXAMPLES=500 pytest tests/test_fuzz_graphs.py` draws
that many fresh ones."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import check

Fn = Callable[..., torch.Tensor]

#: Ops on one value, by the kinds of dtype they accept ("f" float, "i" integer).
UNARY: dict[str, tuple[str, Fn]] = {
    "neg": ("fi", torch.neg),
    "abs": ("fi", torch.abs),
    "relu": ("fi", torch.relu),
    "square": ("fi", lambda t: t * t),
    "tanh": ("f", torch.tanh),
    "sigmoid": ("f", torch.sigmoid),
    "exp_clamped": ("f", lambda t: torch.exp(t.clamp(-10, 10))),
    "floor": ("f", torch.floor),
    "not": ("i", torch.bitwise_not),
    "shift": ("i", lambda t: t >> 1),
    "to_float": ("fi", lambda t: t.float() * 0.5),
    "transpose": ("fi", lambda t: t.transpose(0, -1) if t.dim() >= 2 else t),
    "flatten": ("fi", lambda t: t.reshape(-1)),
    "unsqueeze_expand": ("fi", lambda t: t.unsqueeze(0).expand(2, *t.shape)),
    "slice": ("fi", lambda t: t[..., ::2] if t.dim() else t),
    "sum_last": ("fi", lambda t: t.sum(-1, keepdim=True) if t.dim() else t),
    "cumsum": ("fi", lambda t: t.cumsum(-1) if t.dim() else t),
}
#: Ops on two values (broadcasting), by the kinds of dtype they accept.
BINARY: dict[str, tuple[str, Fn]] = {
    "add": ("fi", torch.add),
    "sub": ("fi", torch.sub),
    "mul": ("fi", torch.mul),
    "maximum": ("fi", torch.maximum),
    "minimum": ("fi", torch.minimum),
    "where": ("fi", lambda a, b: torch.where(a > b, a, b)),
    "eq_mask": ("fi", lambda a, b: (a == b).to(a.dtype) + a),
    "div": ("f", lambda a, b: a / (b.abs() + 1)),
    "floordiv": ("i", lambda a, b: a // (b.abs() + 1)),
    "remainder": ("i", lambda a, b: torch.remainder(a, b.abs() + 1)),
    "xor": ("i", torch.bitwise_xor),
}

DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64]


def _kind(t: torch.Tensor) -> str:
    return "f" if t.dtype.is_floating_point else "i"


@dataclass(frozen=True)
class Recipe:
    """A graph: inputs, then steps `(op, operand indices)` each adding a value; returns the
    last value and the first."""

    steps: tuple[tuple[str, tuple[int, ...]], ...]

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = list(inputs)
        for op, args in self.steps:
            fn = (UNARY.get(op) or BINARY[op])[1]
            a = values[args[0] % len(values)]
            if len(args) == 1:
                values.append(fn(a))
                continue
            b = values[args[1] % len(values)]
            if _kind(a) != _kind(b):
                b = b.to(a.dtype)
            values.append(fn(a, b))
        return values[-1], values[len(inputs) - 1] * 1


@st.composite
def shapes(draw: st.DrawFn) -> tuple[int, ...]:
    rank = draw(st.integers(0, 3))
    return tuple(draw(st.sampled_from([0, 1, 1, 2, 3, 5, 8])) for _ in range(rank))


def make(shape: tuple[int, ...], dtype: torch.dtype, layout: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if layout == "transposed" and len(shape) >= 2:
        return make(shape[:-2] + (shape[-1], shape[-2]), dtype, "contiguous", seed).transpose(-1, -2)
    if layout == "strided" and shape:
        return make(shape[:-1] + (shape[-1] * 2,), dtype, "contiguous", seed)[..., ::2]
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    return torch.randint(-20, 20, shape, generator=g).to(dtype)


@st.composite
def graphs(draw: st.DrawFn) -> tuple[Recipe, list[torch.Tensor]]:
    base = draw(shapes())
    dtype = draw(st.sampled_from(DTYPES))
    inputs = []
    for k in range(draw(st.integers(1, 3))):
        drop = draw(st.integers(0, len(base)))
        shape = tuple(1 if draw(st.booleans()) else d for d in base[drop:])  # broadcasts with base
        layout = draw(st.sampled_from(["contiguous", "transposed", "strided"]))
        inputs.append(make(shape, dtype, layout, seed=k))
    steps = []
    kind = _kind(inputs[0])
    for _ in range(draw(st.integers(1, 6))):
        table: dict[str, tuple[str, Fn]] = draw(st.sampled_from([UNARY, BINARY]))
        names = sorted(n for n, (kinds, _) in table.items() if kind in kinds)
        op = draw(st.sampled_from(names))
        n_args = 1 if table is UNARY else 2
        steps.append((op, tuple(draw(st.integers(0, 16)) for _ in range(n_args))))
        if op == "to_float":
            kind = "f"
    return Recipe(tuple(steps)), inputs


def _eager_ok(recipe: Recipe, inputs: list[torch.Tensor]) -> bool:
    try:
        recipe(*inputs)
    except (RuntimeError, IndexError, ValueError):  # a drawn graph eager refuses: not a case
        return False
    return True


EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0"))


@settings(max_examples=EXAMPLES or 15, deadline=None, suppress_health_check=list(HealthCheck),
          derandomize=not EXAMPLES, database=None)
@given(case=graphs())
def test_random_graphs_match_eager(case: tuple[Recipe, list[torch.Tensor]]) -> None:
    recipe, inputs = case
    if not _eager_ok(recipe, inputs):
        return
    kinds = {_kind(t) for t in inputs}
    tol: dict[str, Any] = {"rtol": 1e-4, "atol": 1e-4} if "f" in kinds or any(
        op in ("to_float",) for op, _ in recipe.steps) else {}
    check(recipe, *inputs, **tol)
