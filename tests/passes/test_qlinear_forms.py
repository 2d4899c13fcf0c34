"""Batch invariance of the quantized linears (`passes/quant/qlinear_forms.py`): with the form
"rows" (what TORCHBURN_QLINEAR_INVARIANT writes into every `qlinear`), a row of x gives the same
bits whatever the number of rows and whatever row it is in, for int8, int4 and every ggml
block type, static and dynamic M, and M large enough that x is quantized a block of rows at
a time. (The panel, tile and dequantize + GEMM forms add the same terms in another order;
docs/quantization.md, "Batch invariance".)"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pytest

from tests.passes.test_qlinear import Compiled, qlinear_graph, weights
from tests.quant.test_block_types import blocks_graph, random_blocks
from torchburn.ir.qblocks import BLOCK_TYPES

#: Rows of x: the GEMV, the multi-row form's partial and whole tiles, and the rows from which
#: the "auto" form would take the panel (or dequantize + GEMM) kernel.
ROWS = (1, 2, 7, 16, 33, 64)
# (kind, group, symmetric): int8 grouped and per channel, int4 symmetric and asymmetric (Q4_1's layout)
INT_LAYOUTS = [("int8", 32, True), ("int8", None, True), ("int4", 32, True), ("int4", 32, False),
               ("int4", 128, False)]


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "off")


def _int_case(m: "int | str", n: int, k: int, layout: tuple[str, Optional[int], bool],
              form: str = "rows") -> tuple[Compiled, dict[str, np.ndarray]]:
    kind, group, symmetric = layout
    arrays, _ = weights(n, k, kind, group, symmetric, seed=k)
    arrays = {key: v.astype(np.float16) if key in ("s", "mn") else v for key, v in arrays.items()}
    text = qlinear_graph(m, n, k, kind, group, symmetric, scale_dtype="f16", activations="auto", form=form)
    return Compiled(text), arrays


def _blocks_case(m: "int | str", n: int, k: int, name: str) -> tuple[Compiled, dict[str, np.ndarray]]:
    bt = BLOCK_TYPES[name]
    raw = random_blocks(name, n, k // bt.block, 7)
    text = blocks_graph(m, n, k, name).replace("symmetric = true}", 'symmetric = true, form = "rows"}')
    return Compiled(text), {"q": np.ascontiguousarray(raw)}


def _run(c: Compiled, arrays: dict[str, np.ndarray], x: np.ndarray, n: int, dynamic: bool = False) -> np.ndarray:
    out = np.zeros((x.shape[0], n), np.float32)
    b = np.linspace(-1, 1, n).astype(np.float32)
    c({**arrays, "x": np.ascontiguousarray(x), "b": b, "out0": out}, [x.shape[0]] if dynamic else [])
    return out


def _x(m: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32) * rng.uniform(0.1, 10, (m, 1)).astype(np.float32)
    x[m // 2, :32] = 0.0  # an all-zero group (scale 0) in one row
    return x


def _assert_invariant(make, arrays: dict[str, np.ndarray], n: int, k: int, rows=ROWS) -> None:  # type: ignore[no-untyped-def]
    """Every row of an M-row product equals the same row computed alone (M = 1), bit for bit,
    and M copies of one row give M equal rows."""
    alone = make(1)
    plans = []
    for m in rows:
        c = make(m) if m != 1 else alone
        plans.append(dict(c.program.kernels[0].attrs).get("qlinear"))
        x = _x(m, k, seed=m)
        got = _run(c, arrays, x, n)
        for r in range(m):
            single = _run(alone, arrays, x[r:r + 1], n)
            assert np.array_equal(got[r], single[0]), (m, r, plans[-1], np.abs(got[r] - single[0]).max())
        same = _run(c, arrays, np.repeat(x[:1], m, axis=0), n)
        assert all(np.array_equal(same[r], same[0]) for r in range(m)), (m, plans[-1])
    assert all(p is not None and not p.startswith(("qgemm", "tiles")) for p in plans), plans


@pytest.mark.parametrize("layout", INT_LAYOUTS, ids=lambda c: f"{c[0]}-g{c[1]}-{'sym' if c[2] else 'asym'}")
def test_int_rows_are_invariant(layout: tuple[str, Optional[int], bool]) -> None:
    n, k = 24, 256
    _assert_invariant(lambda m: _int_case(m, n, k, layout)[0], _int_case(1, n, k, layout)[1], n, k)


@pytest.mark.parametrize("name", list(BLOCK_TYPES))
def test_block_rows_are_invariant(name: str) -> None:
    bt = BLOCK_TYPES[name]
    n, k = 20, 2 * max(bt.block, 128)
    _assert_invariant(lambda m: _blocks_case(m, n, k, name)[0], _blocks_case(1, n, k, name)[1], n, k)


@pytest.mark.parametrize("case", [("int4", 4096), ("Q4_K", 1024)], ids=lambda c: f"{c[0]}-K{c[1]}")
def test_rows_in_blocks_of_x_are_invariant(case: tuple[str, int]) -> None:
    """M x K bytes beyond the quantized x's stack buffer: x is quantized and multiplied a block
    of rows at a time (`Q8Builder.build`), still int8 activations, still the same bits."""
    kind, k = case
    n = 16
    if kind == "int4":
        make = lambda m: _int_case(m, n, k, ("int4", 32, False))[0]  # noqa: E731
        arrays = _int_case(1, n, k, ("int4", 32, False))[1]
    else:
        make = lambda m: _blocks_case(m, n, k, kind)[0]  # noqa: E731
        arrays = _blocks_case(1, n, k, kind)[1]
    big = make(100)
    assert "act=int8" in dict(big.program.kernels[0].attrs)["qlinear"]
    _assert_invariant(make, arrays, n, k, rows=(1, 100))


@pytest.mark.parametrize("kind", ["int4", "Q6_K"])
def test_dynamic_rows_are_invariant(kind: str) -> None:
    """A symbolic M (GEMV branch at M = 1, the multi-row branch beyond): form "rows" keeps int8
    activations in both, so every row equals the same row of a one-row call."""
    n = 24
    if kind == "int4":
        k = 256
        c, arrays = _int_case("s0", n, k, ("int4", 32, False))
    else:
        k = 512
        c, arrays = _blocks_case("s0", n, k, kind)
    x = _x(70, k, seed=3)
    whole = _run(c, arrays, x, n, dynamic=True)
    for m in (1, 2, 7, 33):
        part = _run(c, arrays, x[:m], n, dynamic=True)
        assert np.array_equal(part, whole[:m]), m
    for r in (0, 35, 69):
        assert np.array_equal(_run(c, arrays, x[r:r + 1], n, dynamic=True)[0], whole[r]), r
