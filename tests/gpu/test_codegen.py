"""WGSL codegen from loop IR text: what the shaders contain, what is rejected and why, and
programs run on the device from IR text (no torch.compile in between)."""
from __future__ import annotations

import numpy as np
import pytest

from torchburn.codegen.wgsl import Caps, WgslUnsupported, emit_kernel, emit_program
from torchburn.passes.gpu.map import GpuMap
from tests.passes.util import as_program, kernel, matmul_kernel_text, run_pass

ELEMENTWISE = """
    kernel @k0(%x: f32[64, 256] strides [256, 1], %b: f32[256] strides [1], %out: f32[64, 256] strides [256, 1]) {
      for i0 in 0..64 {
        for i1 in 0..256 {
          let x2 = %x[i0, i1]
          let x3 = %b[i1]
          let t4 = x2 + x3
          %out[i0, i1] = erf(t4)
        }
      }
    }
"""

REDUCTION = """
    kernel @k0(%x: f32[s0, 1000] strides [1000, 1], %out: f32[s0] strides [1]) symbols(s0) {
      for i0 in 0..s0 {
        alloc %acc1: f32[1] strides [1] local
        %acc1[0] = -inf:f32
        for r2 in 0..1000 {
          let x3 = %x[i0, r2]
          %acc1[0] = max(%acc1[0], x3)
        }
        let t4 = %acc1[0]
        %out[i0] = t4
      }
    }
"""


def mapped(text: str):  # type: ignore[no-untyped-def]
    return run_pass(GpuMap(), kernel(text))


def test_elementwise_shader_is_vec4_with_table_helpers() -> None:
    k = mapped(ELEMENTWISE)
    shader = emit_kernel(k, k.symbols, Caps())
    src = shader.source
    assert shader.summary == "threads/vec4"
    assert "array<vec4<f32>>" in src and "ld4_x(" in src and "st4_out(" in src
    assert "fn tb_erf_vec4f32" in src  # the helper, instantiated for vec4
    assert "var<storage, read> b_x" in src and "var<storage, read_write> b_out" in src
    assert [b.writable for b in shader.bindings] == [False, False, True]


def test_reduction_shader_has_a_tree_in_workgroup_memory() -> None:
    k = run_pass(GpuMap(rows=False), kernel(REDUCTION))
    shader = emit_kernel(k, k.symbols, Caps())
    assert shader.summary == "groups/tree-max"
    assert "var<workgroup> tb_red_f32: array<f32, 256>;" in shader.source
    assert shader.source.count("workgroupBarrier();") >= 9  # log2(256) steps and more
    assert "tb_u.s_s0" in shader.source  # the symbol comes from the uniform block
    assert "tb_inf()" in shader.source  # -inf is a runtime value, not a constant


@pytest.mark.parametrize("m,n,k,checked", [(256, 128, 64, ""), (250, 128, 64, "a"), (256, 132, 64, "b"),
                                           (256, 128, 60, "k")])
def test_gemm_checks_only_the_extents_the_tile_does_not_divide(m: int, n: int, k: int, checked: str) -> None:
    """A static extent that the tile divides needs no bounds check on its side: the loads and
    stores of that side are unconditional (the edges are tested on the device elsewhere)."""
    km = run_pass(GpuMap(gemm_tile="128x64x16/8x8/w"), kernel(matmul_kernel_text(m, n, k)))
    shader = emit_kernel(km, km.symbols, Caps(max_workgroup_storage=32768))
    src = shader.source
    assert shader.summary.startswith("gemm 128x64x16/8x8/w"), shader.summary
    assert ("< tb_M" in src) == (checked == "a")
    assert ("< tb_N" in src) == (checked == "b")
    assert ("< tb_K" in src) == (checked == "k")


@pytest.mark.parametrize("dtype,why", [("f64", "64-bit floats")])  # i64 is stored as i32
def test_64_bit_buffers_are_rejected(dtype: str, why: str) -> None:
    k = kernel(f"""
        kernel @k0(%x: {dtype}[8] strides [1], %out: {dtype}[8] strides [1]) {{
          for i0 in 0..8 {{
            %out[i0] = %x[i0]
          }}
        }}
    """)
    with pytest.raises(WgslUnsupported, match=why):
        emit_program(as_program(run_pass(GpuMap(), k)), Caps())


def test_too_many_buffers_are_rejected() -> None:
    k = mapped(ELEMENTWISE)
    with pytest.raises(WgslUnsupported, match="storage buffers"):
        emit_kernel(k, k.symbols, Caps(max_storage_buffers=2))


def test_unsupported_function_is_rejected() -> None:
    k = mapped("""
        kernel @k0(%x: f32[8] strides [1], %out: f32[8] strides [1]) {
          for i0 in 0..8 {
            %out[i0] = lgamma(%x[i0])
          }
        }
    """)
    with pytest.raises(WgslUnsupported, match="lgamma"):
        emit_kernel(k, k.symbols, Caps())


def test_f16_without_shader_f16_is_stored_as_f32() -> None:
    k = mapped("""
        kernel @k0(%x: f16[8] strides [1], %out: f16[8] strides [1]) {
          for i0 in 0..8 {
            let x1 = %x[i0]
            let t2 = cast<f32>(x1)
            %out[i0] = cast<f16>(t2 * 3.0:f32)
          }
        }
    """)
    src = emit_kernel(k, k.symbols, Caps(f16=False)).source
    assert "enable f16" not in src and "pack2x16float" in src
    native = emit_kernel(k, k.symbols, Caps(f16=True)).source
    assert "enable f16;" in native and "array<vec4<f16>>" in native


# ---- on the device ---------------------------------------------------------------------------------

def run_on_device(k, arrays: dict[str, np.ndarray], outputs: tuple[str, ...] = ("out",),  # type: ignore[no-untyped-def]
                  symbols: dict[str, int] = {}) -> list[np.ndarray]:
    """Run kernel `k` on the device; each input array is converted to what the device stores
    for its dtype (`host_dtype` of the program's caps: i16 widened to i32, u8/i8 packed as is)."""
    from torchburn.codegen.wgsl import host_dtype, program_caps
    from torchburn.ir import semantics as sem
    from torchburn.runtime.gpu import GpuProgram, get_device

    dev = get_device()
    prog = as_program(k, outputs)
    gp = GpuProgram(dev, prog, emit_program(prog, dev.caps))
    caps = program_caps(prog, dev.caps)
    host = {b.name: sem.storage(host_dtype(b.dtype, caps)) for b in prog.inputs}
    specs = [(None, None, lambda a=arrays[b.name], t=host[b.name]: np.ascontiguousarray(a.astype(t)).tobytes())
             for b in prog.inputs]
    views = gp.run_copy(dict(symbols), specs)
    return [np.frombuffer(v, dtype=np.float32)[:int(np.prod(arrays[b.name].shape))].reshape(arrays[b.name].shape)
            for v, b in zip(views, prog.outputs)]


def test_reduction_from_ir_text_on_the_device(gpu) -> None:  # type: ignore[no-untyped-def]
    x = np.random.default_rng(0).standard_normal((5, 1000)).astype(np.float32)
    (out,) = run_on_device(mapped(REDUCTION), {"x": x, "out": np.zeros(5, np.float32)}, symbols={"s0": 5})
    np.testing.assert_allclose(out, x.max(1))


def test_unmapped_kernel_runs_in_one_invocation(gpu) -> None:  # type: ignore[no-untyped-def]
    """Without gpu-map, a kernel still runs (in one invocation): slow but right."""
    k = kernel("""
        kernel @k0(%x: f32[16] strides [1], %out: f32[1] strides [1]) {
          %out[0] = 0.0:f32
          for i0 in 0..16 {
            %out[0] = %out[0] + %x[i0]
          }
        }
    """)
    x = np.arange(16, dtype=np.float32)
    (out,) = run_on_device(k, {"x": x, "out": np.zeros(1, np.float32)})
    assert out[0] == x.sum()


NARROW_CASES = [(op, d) for d in ("i8", "i16", "u8") for op in ("add", "sub", "mul", "floordiv", "shl", "shr")] \
    + [("shl", "i32"), ("shr", "i32")]


@pytest.mark.parametrize("op,d", NARROW_CASES)
def test_integer_ops_wrap_as_the_semantics_on_the_device(gpu, op: str, d: str) -> None:  # type: ignore[no-untyped-def]
    """i8/i16/u8 values live in i32 on the device (i16 stored widened, u8/i8 packed four to a
    word: this program writes no 8-bit buffer); results wrap back as `ir/semantics.py` says
    (i8 `100 + 100` is -56), and shifts past the width give 0 or the sign, not WGSL's modulo."""
    from torchburn.ir import dtypes as dt
    from torchburn.ir import semantics as sem
    from torchburn.ir.expr import INFIX_OPS

    dtype = dt.dtype_from_name(d)
    lo, hi = (0, 255) if d == "u8" else (-(1 << (dtype.bits - 1)), (1 << (dtype.bits - 1)) - 1)
    if op in ("shl", "shr"):
        a = np.array([1, -8, 3, lo, hi, 100, -1, 7] if d != "u8" else [1, 8, 3, 0, 255, 100, 128, 7])
        b = np.array([dtype.bits - 1, dtype.bits, 40, 1, 1, 3, 33, 0])
    else:
        a = np.array([100, lo, hi, 7, -7 if d != "u8" else 250, hi, lo, 77])
        b = np.array([100, -1 if d != "u8" else 255, 2, -2 if d != "u8" else 3, 2, hi, 1, 13])
    a, b = a.astype(sem.storage(dtype)), b.astype(sem.storage(dtype))
    k = kernel(f"""
        kernel @k0(%x: {d}[8] strides [1], %y: {d}[8] strides [1], %out: f32[8] strides [1]) {{
          for i0 in 0..8 {{
            %out[i0] = cast<f32>(%x[i0] {INFIX_OPS[op]} %y[i0])
          }}
        }}
    """)
    (out,) = run_on_device(k, {"x": a, "y": b, "out": np.zeros(8, np.float32)})
    np.testing.assert_array_equal(out, sem.evaluate(op, dtype, a, b).astype(np.float32))
