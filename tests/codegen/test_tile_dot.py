"""`tile_dot_u8i8` / `tile_dot_i8i8` (16 x 16 byte tile products, `codegen/llvm/tiles.py`):
both lowerings -- AMX where the host has it, the `dot4` rows form on a target without it --
equal the semantics (`ir/semantics.py`, numpy) exactly, extremes included."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from torchburn.codegen.amx import without_tiles
from torchburn.ir import dtypes as dt
from torchburn.ir import expr as ex
from torchburn.ir import semantics as sem
from torchburn.ir.expr import Var

from .util import TARGET, Compiled, buf, load, loop, program, store

NO_TILES = dataclasses.replace(TARGET, features=without_tiles(TARGET.features))


def _ramp(n: int) -> ex.Expr:
    return ex.Ramp(ex.Const(0), ex.Const(1), ex.ScalarType(dt.index, n))


@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("k", [32, 64, 8])
@pytest.mark.parametrize("zero", [False, True])
@pytest.mark.parametrize("tiles", [True, False])
def test_tile_dot_computes_the_semantics(signed: bool, k: int, zero: bool, tiles: bool) -> None:
    if tiles and not TARGET.tile_dot():
        pytest.skip("this CPU (or this process) has no AMX-INT8")
    target = TARGET if tiles else NO_TILES
    rng = np.random.default_rng(k + 2 * signed)
    a_dtype = dt.i8 if signed else dt.u8
    acc = rng.integers(-2**31, 2**31, (3, 256)).astype(np.int32)
    a = (rng.integers(-128, 128, (3, 16 * k)) if signed else rng.integers(0, 256, (3, 16 * k))).astype(
        np.int8 if signed else np.uint8)
    b = rng.integers(-128, 128, (3, 16 * k)).astype(np.int8)
    acc[0, 0] = 2**31 - 1  # wraps
    a[0, :], b[0, :] = (-128 if signed else 255), -128  # extremes: no saturation anywhere
    a[1, :k], b[1, :] = (127 if signed else 255), 127
    s0 = Var("s0")
    ba, bx, bw = buf("acc", dt.i32, (s0, 256)), buf("a", a_dtype, (s0, 16 * k)), buf("b", dt.i8, (s0, 16 * k))
    out = buf("out", dt.i32, (s0, 256))
    i = Var("i")
    name = ex.TILE_DOT_I8I8 if signed else ex.TILE_DOT_U8I8
    first: ex.Expr = ex.const(0, dt.i32, 256) if zero else load(ba, i, _ramp(256), lanes=256)
    value = ex.Call(name, (first, load(bx, i, _ramp(16 * k), lanes=16 * k), load(bw, i, _ramp(16 * k), lanes=16 * k)),
                    ex.ScalarType(dt.i32, 256))
    compiled = Compiled(program(loop(i, s0, store(out, (i, _ramp(256)), value)), [ba, bx, bw], [out], [s0]), target)
    result = torch.zeros(3, 256, dtype=torch.int32)
    compiled(torch.from_numpy(acc), torch.from_numpy(a), torch.from_numpy(b), result, symbols=[3])
    want = sem.evaluate(name, dt.i32, np.zeros_like(acc) if zero else acc, a, b)
    np.testing.assert_array_equal(result.numpy(), want)
    assert ("tdpb" in compiled.llvm_ir) == tiles
    # the semantics itself, against a plain matrix product
    at = a.astype(np.int64).reshape(3, 16, k)
    bt = b.astype(np.int64).reshape(3, k // 4, 16, 4).transpose(0, 1, 3, 2).reshape(3, k, 16)
    ref = ((0 if zero else acc.astype(np.int64)) + (at @ bt).reshape(3, 256)).astype(np.int32)
    np.testing.assert_array_equal(want, ref)
