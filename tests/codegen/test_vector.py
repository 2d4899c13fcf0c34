"""Vector expressions: ramp loads/stores, gathers and scatters, broadcasts, reductions."""
from __future__ import annotations

import pytest
import torch

from .util import (
    TARGET,
    TORCH_DTYPES,
    Compiled,
    Const,
    Var,
    buf,
    dt,
    elementwise,
    ex,
    load,
    loop,
    program,
    st,
    store,
)

L = 8


def ramp(base, lanes: int = L, stride=1) -> ex.Expr:
    return ex.Ramp(ex.as_expr(base), ex.as_expr(stride), st(dt.index, lanes))


def test_contiguous_vector_load_store_is_one_vector_op() -> None:
    k = elementwise(lambda a, b: ex.add(a, b), dt.f32, dt.f32, lanes=L, n_inputs=2)
    assert f"load <{L} x float>" in k.llvm_ir
    assert f"store <{L} x float>" in k.llvm_ir
    assert "gather" not in k.llvm_ir
    x, y = torch.randn(64), torch.randn(64)
    out = torch.empty(64)
    k(x, y, out, symbols=[64])
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [dt.bool_, dt.i8, dt.u8, dt.i64, dt.f16, dt.bf16, dt.f64], ids=str)
def test_vector_copy_and_compare_every_dtype(dtype) -> None:
    tdt = TORCH_DTYPES[dtype]
    x = (torch.randn(32) * 10).to(tdt)
    k = elementwise(lambda a: a, dtype, dtype, lanes=L)
    out = torch.zeros(32, dtype=tdt)
    k(x, out, symbols=[32])
    assert torch.equal(out, x)
    zero = ex.const(False if dtype.is_bool else 0, dtype, L)
    k2 = elementwise(lambda a: ex.binary("ne", a, zero), dtype, dt.bool_, lanes=L)
    out2 = torch.zeros(32, dtype=torch.bool)
    k2(x, out2, symbols=[32])
    assert torch.equal(out2, x != 0)


def test_vector_math_intrinsic_and_libm() -> None:
    k = elementwise(lambda a: ex.add(ex.call("exp", a), ex.call("erf", a)), dt.f32, dt.f32, lanes=L)
    x = torch.randn(64)
    out = torch.empty(64)
    k(x, out, symbols=[64])
    torch.testing.assert_close(out, torch.exp(x) + torch.erf(x))


def test_vector_int_floordiv_and_pow() -> None:
    k = elementwise(lambda a, b: ex.add(ex.floordiv(a, b), ex.binary("pow", a, ex.const(2, dt.i64, L))),
                    dt.i64, dt.i64, lanes=L, n_inputs=2)
    a = torch.randint(-50, 50, (16,))
    b = torch.randint(1, 9, (16,)) * torch.where(torch.rand(16) > 0.5, 1, -1)
    out = torch.empty(16, dtype=torch.int64)
    k(a, b, out, symbols=[16])
    assert torch.equal(out, torch.floor_divide(a, b) + a * a)


def test_gather_from_transposed_input() -> None:
    """out[i, j:j+L] = x[i, j:j+L] where x's inner dimension has stride s1: a gather."""
    s0, s1 = Var("s0"), Var("s1")
    x = buf("x", dt.f32, (s0, s1), (1, s0))
    out = buf("out", dt.f32, (s0, s1))
    i, j = Var("i"), Var("j")
    body = loop(i, s0, loop(j, ex.floordiv(s1, L),
                            store(out, (i, ramp(ex.mul(j, L))), load(x, i, ramp(ex.mul(j, L)), lanes=L))))
    k = Compiled(program(body, [x], [out], [s0, s1]))
    assert "llvm.masked.gather" in k.llvm_ir
    xt = torch.randn(16, 3).t()  # [3, 16] with strides [1, 3]
    res = torch.empty(3, 16)
    k(xt, res, symbols=[3, 16])
    assert torch.equal(res, xt)


def test_scatter_into_transposed_output() -> None:
    s0 = Var("s0")
    x = buf("x", dt.f64, (s0, L))
    out = buf("out", dt.f64, (s0, L), (1, s0))
    i = Var("i")
    k = Compiled(program(loop(i, s0, store(out, (i, ramp(0)), load(x, i, ramp(0), lanes=L))), [x], [out], [s0]))
    assert "llvm.masked.scatter" in k.llvm_ir
    xv = torch.randn(5, L, dtype=torch.float64)
    res = torch.empty(L, 5, dtype=torch.float64).t()
    k(xv, res, symbols=[5])
    assert torch.equal(res, xv)


def test_ramp_with_stride_two_and_broadcast_index() -> None:
    """out[i, 0:L] = x[0, 2*lane] + x[i, 0] (a strided gather plus a uniform load)."""
    x = buf("x", dt.f32, (4, 2 * L))
    out = buf("out", dt.f32, (4, L))
    i = Var("i")
    value = ex.add(load(x, Const(0), ramp(0, stride=2), lanes=L),
                   load(x, ex.Broadcast(i, st(dt.index, L)), ex.Broadcast(Const(0), st(dt.index, L)), lanes=L))
    k = Compiled(program(loop(i, 4, store(out, (i, ramp(0)), value)), [x], [out]))
    xv = torch.randn(4, 2 * L)
    res = torch.empty(4, L)
    k(xv, res)
    assert torch.equal(res, xv[0, ::2].expand(4, L) + xv[:, :1])


REDUCTIONS = {"add": torch.sum, "mul": torch.prod, "min": torch.amin, "max": torch.amax}


@pytest.mark.parametrize("op", sorted(REDUCTIONS))
@pytest.mark.parametrize("dtype", [dt.f32, dt.i32, dt.bf16], ids=str)
def test_vector_reduce(op, dtype) -> None:
    """out[i] = vreduce(x[i, 0:L]) per row."""
    tdt = TORCH_DTYPES[dtype]
    x = buf("x", dtype, (6, L))
    out = buf("out", dtype, (6,))
    i = Var("i")
    red = ex.VectorReduce(op, load(x, i, ramp(0), lanes=L), st(dtype))
    k = Compiled(program(loop(i, 6, store(out, (i,), red)), [x], [out]))
    xv = (torch.rand(6, L) * 2 + 0.5).to(tdt) if dtype.is_float else torch.randint(-3, 4, (6, L), dtype=tdt)
    res = torch.empty(6, dtype=tdt)
    k(xv, res)
    expected = REDUCTIONS[op](xv.float() if dtype == dt.bf16 else xv, dim=1).to(tdt)
    tol = 1e-2 if dtype == dt.bf16 else None
    torch.testing.assert_close(res, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("op", ["min", "max"])
def test_vector_reduce_min_max_propagate_nan(op) -> None:
    x = buf("x", dt.f32, (L,))
    out = buf("out", dt.f32, (1,))
    k = Compiled(program(store(out, (Const(0),), ex.VectorReduce(op, load(x, ramp(0), lanes=L), st(dt.f32))),
                         [x], [out]))
    xv = torch.arange(L, dtype=torch.float32)
    xv[3] = float("nan")
    res = torch.empty(1)
    k(xv, res)
    assert torch.isnan(res).all()


def test_bool_reduce_any_all() -> None:
    x = buf("x", dt.bool_, (2, L))
    out = buf("out", dt.bool_, (2, 2))
    i = Var("i")
    v = load(x, i, ramp(0), lanes=L)
    body = loop(i, 2, lp_block(store(out, (i, Const(0)), ex.VectorReduce("or", v, st(dt.bool_))),
                               store(out, (i, Const(1)), ex.VectorReduce("and", v, st(dt.bool_)))))
    k = Compiled(program(body, [x], [out]))
    xv = torch.zeros(2, L, dtype=torch.bool)
    xv[0, 2] = True
    xv[1] = True
    res = torch.zeros(2, 2, dtype=torch.bool)
    k(xv, res)
    assert res.tolist() == [[True, False], [True, True]]


def lp_block(*stmts):
    from torchburn.ir.loop import block

    return block(*stmts)


def test_select_with_vector_condition_and_scalar_operand() -> None:
    def fn(a):
        zero = ex.const(0.0, dt.f32, L)
        return ex.Select(ex.binary("lt", a, zero), ex.const(0.0, dt.f32, L), a, a.type)
    k = elementwise(fn, dt.f32, dt.f32, lanes=L)
    x = torch.randn(40)
    out = torch.empty(40)
    k(x, out, symbols=[40])
    assert torch.equal(out, torch.relu(x))


def test_float_ramp_and_uniform_store() -> None:
    """out[0] gets the last lane of a vector written to one address; a float ramp."""
    out = buf("out", dt.f32, (L,))
    val = ex.Ramp(ex.const(1.0, dt.f32), ex.const(0.5, dt.f32), st(dt.f32, L))
    k = Compiled(program(store(out, (ramp(0),), val), [], [out]))
    res = torch.zeros(L)
    k(res)
    assert torch.equal(res, 1.0 + 0.5 * torch.arange(L, dtype=torch.float32))
    k2 = Compiled(program(store(out, (ex.Broadcast(Const(2), st(dt.index, L)),), val), [], [out]))
    res2 = torch.zeros(L)
    k2(res2)
    assert res2[2] == 1.0 + 0.5 * (L - 1) and res2.count_nonzero() == 1


def test_target_width_vectors() -> None:
    lanes = TARGET.lanes(dt.f32)
    k = elementwise(lambda a: ex.call("sqrt", a), dt.f32, dt.f32, lanes=lanes)
    x = torch.rand(4 * lanes)
    out = torch.empty_like(x)
    k(x, out, symbols=[len(x)])
    torch.testing.assert_close(out, torch.sqrt(x))


@pytest.mark.parametrize("pattern, expect", [
    (lambda r: ex.binary("mod", r, Const(4)), [0, 1, 2, 3] * 4),                       # one span, repeated
    (lambda r: ex.add(ex.binary("mod", r, Const(4)), ex.mul(ex.binary("floordiv", r, Const(8)), Const(10))),
     [0, 1, 2, 3] * 2 + [10, 11, 12, 13] * 2),                                             # two runs with a gap
])
def test_lane_pattern_load_is_a_load_and_a_shuffle(pattern, expect) -> None:
    """out[i, 0:16] = x[i 16 + p(lane)] with p a constant lane pattern (a row's few bytes read
    several times): contiguous loads of the runs it reads and a `shufflevector`, not a gather."""
    n = 16
    x = buf("x", dt.f32, (4 * n,))
    out = buf("out", dt.f32, (4, n))
    i = Var("i")
    lanes = st(dt.index, n)
    index = ex.Binary("add", ex.Broadcast(ex.mul(i, n), lanes), pattern(ex.Ramp(Const(0), Const(1), lanes)), lanes)
    k = Compiled(program(loop(i, 4, store(out, (i, ramp(0, lanes=n)), ex.Load("x", (index,), st(dt.f32, n)))),
                         [x], [out]))
    assert "gather" not in k.llvm_ir and "shufflevector" in k.llvm_ir
    xv = torch.randn(4 * n)
    res = torch.empty(4, n)
    k(xv, res)
    assert torch.equal(res, xv.view(4, n)[:, expect])


@pytest.mark.parametrize("strides, merged", [(None, True), ((80, 24, 6, 1), False)], ids=["contiguous", "padded"])
def test_delinearized_index_is_one_affine_address(strides, merged) -> None:
    """out[q, 0:4] = x[0:4, q // 20, q // 5 % 4, q % 5] and out2[c, q] = x[c, q // 20, ...]: an
    index through a reshape of `x`'s last three dims. Where they are contiguous the address is
    `c * 60 + q` (no division left, `memory.linear_offset`); with rows padded to 6 elements
    the pieces stay apart. Both read the same elements."""
    x = buf("x", dt.f32, (4, 3, 4, 5), strides)
    out = buf("out", dt.f32, (60, 4))
    out2 = buf("out2", dt.f32, (4, 60))
    q, c = Var("q"), Var("c")
    lanes = ex.Ramp(Const(0), Const(1), st(dt.index, 4))
    pieces = (ex.floordiv(q, 20), ex.mod(ex.floordiv(q, 5), 4), ex.mod(q, 5))
    body = lp_block(
        loop(q, 60, store(out, (q, ramp(0, lanes=4)), ex.Load("x", (lanes, *pieces), st(dt.f32, 4)))),
        loop(c, 4, loop(q, 60, store(out2, (c, q), load(x, c, *pieces)))),
    )
    k = Compiled(program(body, [x], [out, out2]))
    divisions = [line for line in k.llvm_ir.splitlines() if "div " in line or "rem " in line]
    assert (divisions == []) == merged
    storage = torch.randn(4 * 80)
    xv = storage[:240].view(4, 3, 4, 5) if strides is None else storage.as_strided((4, 3, 4, 5), strides)
    res, res2 = torch.empty(60, 4), torch.empty(4, 60)
    k(xv, res, res2)
    assert torch.equal(res, xv.reshape(4, 60).t())
    assert torch.equal(res2, xv.reshape(4, 60))


@pytest.mark.parametrize("width, padded", [(7, False), (12, False), (7, True)])
def test_vector_read_through_a_flattened_view_is_a_vector_load(width: int, padded: bool) -> None:
    """out[r, 0:8] = x[r 8 + lane // W, (r 8 + lane) % W]: eight lanes of a flattened
    `[rows, W]` view, the lanes crossing row ends (W = 7, 12). With contiguous rows the
    pieces merge back into `ramp(r 8, 1, 8)` (`memory.merge_delinearized`): one vector load,
    no gather; with rows padded to W + 1 elements they may not, and the gather reads the same
    elements."""
    n, rows = 8, 6
    total = rows * n
    x = buf("x", dt.f32, (total // width + 1, width), (width + 1, 1) if padded else None)
    out = buf("out", dt.f32, (rows, n))
    r = Var("r")
    flat = ex.Ramp(ex.mul(r, n), Const(1), st(dt.index, n))
    w = ex.Broadcast(Const(width), st(dt.index, n))
    index = (ex.Binary("floordiv", flat, w, flat.type), ex.Binary("mod", flat, w, flat.type))
    k = Compiled(program(loop(r, rows, store(out, (r, ramp(0, lanes=n)), ex.Load("x", index, st(dt.f32, n)))),
                         [x], [out]))
    assert ("gather" in k.llvm_ir) == padded
    shape = (total // width + 1, width)
    storage = torch.randn(shape[0] * (width + 1))
    xv = storage.as_strided(shape, (width + 1, 1)) if padded else storage[:shape[0] * width].view(shape)
    res = torch.empty(rows, n)
    k(xv, res)
    assert torch.equal(res, xv.reshape(-1)[:total].view(rows, n) if not padded
                       else torch.stack([xv[i // width, i % width] for i in range(total)]).view(rows, n))


@pytest.mark.parametrize("dtype, step", [(dt.f32, 2), (dt.f32, 3), (dt.i64, 2), (dt.bool_, 4)])
def test_strided_vector_load_is_one_span_and_a_shuffle(dtype: dt.DType, step: int) -> None:
    """out[r, 0:16] = x[r 16 step + ramp(0, step, 16)]: a constant lane step loads the span
    (15 step + 1 elements, the buffer's last one the last lane's) and shuffles, no gather."""
    n, rows = 16, 3
    size = (rows - 1) * n * step + (n - 1) * step + 1
    x = buf("x", dtype, (size,))
    out = buf("out", dtype, (rows, n))
    r = Var("r")
    index = ex.Ramp(ex.mul(r, n * step), Const(step), st(dt.index, n))
    k = Compiled(program(loop(r, rows, store(out, (r, ramp(0, lanes=n)), ex.Load("x", (index,), st(dtype, n)))),
                         [x], [out]))
    assert "gather" not in k.llvm_ir and "shufflevector" in k.llvm_ir
    tdtype = {dt.f32: torch.float32, dt.i64: torch.int64, dt.bool_: torch.bool}[dtype]
    xv = (torch.randn(size) > 0) if dtype == dt.bool_ else (torch.randn(size) * 100).to(tdtype)
    res = torch.empty(rows, n, dtype=tdtype)
    k(xv, res)
    want = torch.stack([xv[r * n * step + torch.arange(n) * step] for r in range(rows)])
    assert torch.equal(res, want)
