"""The `qlinear` IR op and its kernels (`passes/quant/qlinear.py`): text round trip and type
rules, results of the SIMD and the plain (GPU-form) kernels against a float64 reference on
the layouts of `torchburn/quant/layouts.py`, the fused epilogue, and no access outside any
buffer (guard pages)."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.passes import test_matmul
from torchburn.ir.ops import OpError
from torchburn.ir.parser import parse_graph
from torchburn.ir.printer import print_ir
from torchburn.ir.verifier import verify
from torchburn.quant import (dequantize_int4, dequantize_int8, quantize_weight_int4_grouped,
                             quantize_weight_int8)


class Compiled(test_matmul.Compiled):
    """A tensor graph through the default pipeline, with `lowering` as its loop lowering
    (`lower-to-loops-gpu` writes the plain per-element nest), callable on numpy arrays."""

    def __init__(self, text: str, lowering: str = "lower-to-loops") -> None:
        from torchburn.codegen import emit_program, entry_name, host_target
        from torchburn.passes.base import PassManager, get_pass
        from torchburn.passes.pipeline import Pipeline
        from torchburn.runtime import jit

        pipeline = Pipeline.default()
        pipeline.lowering = get_pass(lowering)()
        pipeline.loop = test_matmul._loop_passes()
        target = host_target()
        self.program = PassManager(pipeline.passes(), target=target).run(parse_graph(text))
        verify(self.program)
        self.native = jit.load_object(jit.compile_llvm_ir(emit_program(self.program, target), target))
        self.entry = self.native.entry(entry_name(self.program))


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "off")


def qlinear_graph(m: "int | str", n: int, k: int, kind: str, group: Optional[int], symmetric: bool,
                  scale_dtype: str = "f32", epilogue: bool = True, activations: str = "f32",
                  form: str = "auto") -> str:
    """`tanh(qlinear(x, ...) + b)` (or the bare product) as tensor IR text (`form` other than
    "auto": that CPU kernel)."""
    ins = [f"%x: f32[{m}, {k}]", f"%q: u8[{n}, {k // 2}]" if kind == "int4" else f"%q: i8[{n}, {k}]",
           f"%s: {scale_dtype}[{n}]" if group is None else f"%s: {scale_dtype}[{n}, {k // group}]"]
    operands = "%x, %q, %s"
    if not symmetric:
        ins.append(f"%mn: {scale_dtype}[{n}, {k // (group or k)}]")
        operands += ", %mn"
    ins.append(f"%b: f32[{n}]")
    attrs = (f'{{kind = "{kind}", group_size = {group or k}, symmetric = {str(symmetric).lower()}, '
             f'activations = "{activations}"' + (f', form = "{form}"' if form != "auto" else "") + "}")
    body = f"  %0 = qlinear({operands}) {attrs} : f32[{m}, {n}]\n"
    if epilogue:
        body += (f"  %1 = expand(%b) {{shape = [{m}, {n}]}} : f32[{m}, {n}]\n"
                 f"  %2 = add(%0, %1) : f32[{m}, {n}]\n"
                 f"  %3 = tanh(%2) : f32[{m}, {n}]\n  return %3\n")
    else:
        body += "  return %0\n"
    return f"graph @main({', '.join(ins)}) {{\n{body}}}"


def weights(n: int, k: int, kind: str, group: Optional[int], symmetric: bool,
            seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Quantized operands (by name) and the dequantized weight in float64."""
    torch.manual_seed(seed)
    w = torch.randn(n, k)
    if kind == "int4":
        assert group is not None
        q4 = quantize_weight_int4_grouped(w, group, symmetric, torch.float32)
        arrays = {"q": q4.packed.numpy(), "s": q4.scales.numpy()}
        if not symmetric:
            assert q4.mins is not None
            arrays["mn"] = q4.mins.numpy()
        return arrays, dequantize_int4(q4).double().numpy()
    q8 = quantize_weight_int8(w, group, torch.float32)
    return {"q": q8.qweight.numpy(), "s": q8.scales.numpy()}, dequantize_int8(q8).double().numpy()


def quantized_x(x: np.ndarray, agroup: int) -> np.ndarray:
    """x as the int8-activation kernel sees it (`qlinear_i8`): per group of `agroup`,
    `round_half_even(x * (127 / amax)) * (amax / 127)`, the scale products in f32."""
    m, k = x.shape
    g = x.reshape(m, k // agroup, agroup).astype(np.float32)
    amax = np.abs(g).max(-1, keepdims=True)
    d = amax / np.float32(127)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    return (np.round(g * inv) * d).reshape(m, k).astype(np.float64)


def reference(x: np.ndarray, wd: np.ndarray, b: np.ndarray, epilogue: bool = True,
              plan: Optional[str] = None, kind: str = "int4", group: int = 0) -> np.ndarray:
    """The float64 product of x (quantized as the kernel does when `plan` says `act=int8`)
    and the dequantized weight, then the epilogue."""
    xs = x.astype(np.float64)
    if plan is not None and "act=int8" in plan:
        from torchburn.passes.quant.qlinear import QLinear
        from torchburn.passes.quant.qlinear_i8 import activation_group

        fake = QLinear(None, None, None, None, kind, group, True)  # type: ignore[arg-type]
        xs = quantized_x(x, activation_group(fake))
    y = xs @ wd.T
    return np.tanh(y + b) if epilogue else y


def test_round_trip_and_verifier() -> None:
    text = qlinear_graph(16, 64, 256, "int4", 64, False, "f16")
    g = parse_graph(text)
    verify(g)
    assert print_ir(parse_graph(print_ir(g))) == print_ir(g)
    op = g.ops[0]
    assert op.name == "qlinear" and op.attrs == {"kind": "int4", "group_size": 64, "symmetric": False,
                                                 "activations": "f32"}
    assert ": f32[16, 64]" in print_ir(g).splitlines()[1]


@pytest.mark.parametrize("bad,message", [
    ('kind = "int2"', "unknown kind"),
    ("group_size = 48", "does not divide"),
    ("group_size = 0", "positive integer"),
    ("symmetric = true", "expected 3 operands"),
])
def test_type_rule_rejects_bad_attrs(bad: str, message: str) -> None:
    text = qlinear_graph(2, 8, 64, "int4", 32, False)
    for good in ('kind = "int4"', "group_size = 32", "symmetric = false"):
        if good.split(" = ")[0] == bad.split(" = ")[0]:
            text = text.replace(good, bad)
    with pytest.raises((OpError, ValueError), match=message):
        verify(parse_graph(text))


def test_type_rule_rejects_bad_operands() -> None:
    wrong_dtype = qlinear_graph(2, 8, 64, "int4", 32, True).replace("%q: u8", "%q: i8")
    with pytest.raises((OpError, ValueError), match="must be u8"):
        verify(parse_graph(wrong_dtype))
    wrong_scales = qlinear_graph(2, 8, 64, "int8", 32, True).replace("%s: f32[8, 2]", "%s: f32[8, 3]")
    with pytest.raises((OpError, ValueError), match="scales shape"):
        verify(parse_graph(wrong_scales))


CASES = [  # m, n, k, kind, group, symmetric
    (1, 70, 256, "int4", 64, True), (5, 37, 128, "int4", 32, False), (16, 64, 256, "int8", None, True),
    (3, 9, 96, "int8", 32, True), (1, 33, 256, "int4", 128, True), (17, 5, 40, "int8", None, True),
    (6, 11, 72, "int4", 24, False),
]


#: Cases that take the int8-activation kernel (groups of x long enough for 16-byte dots).
I8_CASES = [(1, 70, 256, "int4", 64, True), (5, 37, 128, "int4", 32, False), (16, 64, 256, "int8", None, True),
            (3, 9, 96, "int8", 32, True), (1, 33, 256, "int4", 128, True), (3, 40, 320, "int4", 32, False),
            (1, 12, 1024, "int8", None, True), (2, 7, 320, "int8", 64, True), (1, 21, 96, "int4", 32, False)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("form", ["simd", "plain", "simd-int8"])
def test_kernels_match_reference(case: tuple, form: str) -> None:  # type: ignore[type-arg]
    """The f32 kernels against the float64 product to f32 rounding; with int8 activations,
    against the float64 product of the *quantized* x (the kernel's integer dot products are
    exact, so only f32 rounding of the scales and sums remains: the same tolerance)."""
    m, n, k, kind, group, symmetric = case
    text = qlinear_graph(m, n, k, kind, group, symmetric, activations="int8" if form == "simd-int8" else "f32")
    c = Compiled(text) if form != "plain" else Compiled(text, lowering="lower-to-loops-gpu")
    plans = [dict(kk.attrs).get("qlinear") for kk in c.program.kernels]
    assert len(c.program.kernels) == 1, "the epilogue is fused"
    assert (plans[0] is not None) == (form != "plain")
    if form == "simd-int8":
        assert ("act=int8" in plans[0]) == (case in I8_CASES), plans[0]
    arrays, wd = weights(n, k, kind, group, symmetric)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    out = np.zeros((m, n), np.float32)
    c({**arrays, "x": x, "b": b, "out0": out})
    expected = reference(x, wd, b, plan=plans[0], kind=kind, group=group or k)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", I8_CASES[5:], ids=lambda c: "-".join(map(str, c)))
def test_int8_activations_more_shapes(case: tuple) -> None:  # type: ignore[type-arg]
    """Asymmetric g32 with K = 320 (not a multiple of 64), per-channel int8 with x quantized
    in groups of 128, grouped int8 g64, three g32 groups (a pack of two and one left); no
    epilogue, so the raw sums are compared."""
    m, n, k, kind, group, symmetric = case
    c = Compiled(qlinear_graph(m, n, k, kind, group, symmetric, epilogue=False, activations="int8"))
    plan = dict(c.program.kernels[0].attrs)["qlinear"]
    assert "act=int8" in plan
    arrays, wd = weights(n, k, kind, group, symmetric)
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    out = np.zeros((m, n), np.float32)
    c({**arrays, "x": x, "b": np.zeros(n, np.float32), "out0": out})
    expected = reference(x, wd, np.zeros(n), epilogue=False, plan=plan, kind=kind, group=group or k)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_dot_product_without_vnni_gives_the_same_results() -> None:
    """`dot4_u8i8_acc` on a target without AVX512-VNNI (the portable sequence) against the
    host's `vpdpbusd`: identical outputs, and the instruction only where the feature is."""
    from torchburn.codegen import Target, emit_program, entry_name, host_target
    from torchburn.runtime import jit

    host = host_target()
    if not host.has_feature("avx512vnni"):
        pytest.skip("the host has no AVX512-VNNI to compare with")
    plain = Target.from_features(host.triple, host.cpu, host.features.replace("+avx512vnni", "-avx512vnni"))
    m, n, k = 3, 21, 256
    c = Compiled(qlinear_graph(m, n, k, "int4", 64, True, activations="int8"))
    arrays, wd = weights(n, k, "int4", 64, True)
    x = np.random.default_rng(2).standard_normal((m, k)).astype(np.float32)
    b = np.zeros(n, np.float32)
    outs = []
    for target in (host, plain):
        llvm_ir = emit_program(c.program, target)
        assert ("vpdpbusd" in llvm_ir) == (target is host)
        c.native = jit.load_object(jit.compile_llvm_ir(llvm_ir, target))
        c.entry = c.native.entry(entry_name(c.program))
        out = np.zeros((m, n), np.float32)
        c({**arrays, "x": x, "b": b, "out0": out})
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    plan = dict(c.program.kernels[0].attrs)["qlinear"]
    np.testing.assert_allclose(outs[1], reference(x, wd, b, plan=plan, kind="int4", group=64), rtol=1e-4, atol=1e-4)


def test_symbolic_rows_int8_activations_in_the_gemv_branch() -> None:
    """With M known only at run time, the GEMV branch quantizes x (a bound of one row) and
    the multi-row branch keeps f32 activations; M = 0 writes nothing and reads nothing."""
    c = Compiled(qlinear_graph("s0", 20, 128, "int4", 64, True, activations="int8"))
    plan = dict(c.program.kernels[0].attrs)["qlinear"]
    assert "mr=1 nr=1 act=int8" in plan and "mr=4 nr=2 lanes=" in plan
    arrays, wd = weights(20, 128, "int4", 64, True)
    b = np.ones(20, np.float32)
    for m in (0, 1, 2, 9):
        x = np.random.default_rng(m).standard_normal((m, 128)).astype(np.float32)
        out = np.zeros((m, 20), np.float32)
        c({**arrays, "x": x, "b": b, "out0": out}, [m])
        expected = reference(x, wd, b, plan="act=int8" if m == 1 else None, kind="int4", group=64)
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_symbolic_rows_build_both_forms() -> None:
    c = Compiled(qlinear_graph("s0", 20, 64, "int4", 32, True))
    assert "mr=1" in dict(c.program.kernels[0].attrs)["qlinear"]
    assert "mr=4" in dict(c.program.kernels[0].attrs)["qlinear"]
    arrays, wd = weights(20, 64, "int4", 32, True)
    b = np.ones(20, np.float32)
    for m in (1, 2, 9):
        x = np.random.default_rng(m).standard_normal((m, 64)).astype(np.float32)
        out = np.zeros((m, 20), np.float32)
        c({**arrays, "x": x, "b": b, "out0": out}, [m])
        np.testing.assert_allclose(out, reference(x, wd, b), rtol=1e-4, atol=1e-4)


GUARD_SCRIPT = r'''
import sys
import numpy as np
sys.path.insert(0, {root!r})
from tests.passes import test_qlinear as t
from tests.passes.test_qlinear import Compiled
exec(t.GUARDED_ARRAY)

for (m, n, k, kind, group, sym) in t.CASES + t.I8_CASES[5:] + [("s0", 13, 64, "int4", 32, True)]:
    for lowering, act in (("lower-to-loops", "f32"), ("lower-to-loops", "int8"), ("lower-to-loops-gpu", "f32")):
        c = Compiled(t.qlinear_graph(m, n, k, kind, group, sym, activations=act), lowering=lowering)
        plan = dict(c.program.kernels[0].attrs).get("qlinear") if m != "s0" else None  # rows = 3: f32
        arrays, wd = t.weights(n, k, kind, group, sym)
        rows = 3 if m == "s0" else m
        rng = np.random.default_rng(0)
        for at_end in (True, False):
            g = {{name: guarded(a.shape, a.dtype, at_end) for name, a in arrays.items()}}
            for name, a in arrays.items():
                g[name][...] = a
            x = guarded((rows, k), np.float32, at_end); x[...] = rng.standard_normal((rows, k))
            b = guarded((n,), np.float32, at_end); b[...] = rng.standard_normal(n)
            out = guarded((rows, n), np.float32, at_end)
            c({{**g, "x": x, "b": b, "out0": out}}, [rows] if m == "s0" else [])
            expected = t.reference(x, wd, b, plan=plan, kind=kind, group=group or k)
            np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
print("GUARDS OK")
'''

#: Defines `guarded(shape, dtype, at_end)`: an array against a PROT_NONE page.
GUARDED_ARRAY = r'''
import ctypes, mmap
libc = ctypes.CDLL(None)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
PAGE = mmap.PAGESIZE
keep = []

def guarded(shape, dtype, at_end):
    count = int(np.prod(shape))
    nbytes = count * np.dtype(dtype).itemsize
    body = (nbytes + PAGE - 1) // PAGE * PAGE
    mm = mmap.mmap(-1, body + 2 * PAGE)
    keep.append(mm)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    libc.mprotect(base, PAGE, 0)
    libc.mprotect(base + PAGE + body, PAGE, 0)
    offset = PAGE + (body - nbytes if at_end else 0)
    return np.frombuffer(mm, dtype=dtype, count=count, offset=offset).reshape(shape)
'''


def run_guard_script(script: str) -> None:
    """Run `script` (formatted with `root`, the repository) in a child process; it must print
    GUARDS OK: an access past a guard page crashes the child instead."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TORCHBURN_CACHE_DIR="off")
    proc = subprocess.run([sys.executable, "-c", script.format(root=root)], capture_output=True,
                          text=True, env=env, timeout=900, cwd=root)
    assert proc.returncode == 0 and "GUARDS OK" in proc.stdout, (proc.returncode, proc.stdout[-2000:],
                                                                 proc.stderr[-4000:])


def test_no_access_outside_buffers() -> None:
    """Every operand against an inaccessible page (after it, then before it), for both
    kernel forms; a read or write past either end would crash the child process."""
    run_guard_script(GUARD_SCRIPT)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_grouped_gemv_scales_once_per_group(kind: str) -> None:
    """Grouped scales leave the inner loop: a GEMV over groups of 32 multiplies (f32 `fmul`)
    only the first chunk of each group (one weight row per step), not every dequantized vector
    (the old form had one `fmul` per vector: 4 chunks x 4 rows for int8), and matches the
    reference."""
    import re

    from torchburn.codegen import emit_program, host_target

    m, n, k = 1, 13, 576
    c = Compiled(qlinear_graph(m, n, k, kind, 32, kind == "int8", epilogue=False))
    plan = dict(c.program.kernels[0].attrs)["qlinear"]
    assert "mr=1 nr=1" in plan, plan
    llvm_ir = emit_program(c.program, host_target())
    lanes = int(plan.split("lanes=")[1].split()[0])
    chunks = (32 // lanes) if kind == "int8" else (16 // lanes) * 2
    fmuls = len(re.findall(r"= fmul <\d+ x float>", llvm_ir))
    if chunks > 1:
        assert fmuls == 1, (fmuls, plan)
    arrays, wd = weights(n, k, kind, 32, kind == "int8")
    x = np.random.default_rng(3).standard_normal((m, k)).astype(np.float32)
    out = np.zeros((m, n), np.float32)
    c({**arrays, "x": x, "b": np.zeros(n, np.float32), "out0": out})
    expected = reference(x, wd, np.zeros(n), epilogue=False)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("bits", [256, 512])
@pytest.mark.parametrize("case", [(1, 21, 96, "int4", 32, False), (3, 10, 608, "int4", 32, True),
                                  (1, 9, 1088, "int4", 32, False), (2, 11, 208, "int8", 16, True)],
                         ids=lambda c: "-".join(map(str, c)))
def test_int8_activations_pack_groups(case: tuple, bits: int) -> None:  # type: ignore[type-arg]
    """Groups shorter than a vector register are taken `pack` at a time by one dot product
    (int4 g32: two on 256-bit vectors, four on 512; int8 g16 likewise), with x's bytes of a
    pack reordered (low halves, then high halves) and the groups' scales blended into lane
    segments: in blocks of eight, whole packs left over, and single groups left after them
    (K = 96: three groups; 608: 19; 1088: 34). Planned for `bits`-bit vectors (the code runs
    here in any case), against the float64 product of the quantized x."""
    from torchburn.codegen import Target

    m, n, k, kind, group, symmetric = case
    machine = Target(vector_bits=bits, l1_bytes=32 * 1024, l2_bytes=1 << 20, threads=2, name="packs")
    c = test_matmul.Compiled(qlinear_graph(m, n, k, kind, group, symmetric, activations="int8"),
                             machine=machine)
    plan = dict(c.program.kernels[0].attrs)["qlinear"]
    pack = min(bits // 8 // (group // 2 if kind == "int4" else group), 8)
    while pack > k // group:
        pack //= 2
    assert f"pack={pack}" in plan, plan
    arrays, wd = weights(n, k, kind, group, symmetric)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    out = np.zeros((m, n), np.float32)
    c({**arrays, "x": x, "b": b, "out0": out})
    np.testing.assert_allclose(out, reference(x, wd, b, plan=plan, kind=kind, group=group), rtol=1e-4, atol=1e-4)


def _split_k_graph(m: int, heads: int, dim: int, activations: str) -> str:
    """`qlinear` of the attention output `[1, H, m, D]` read as `[1, m, H * D]` (what `o_proj`
    reads): x's index splits K into `k // D` and `k % D`."""
    k = heads * dim
    return f"""graph @main(%a: f32[1, {heads}, {m}, {dim}], %q: u8[13, {k // 2}], %s: f32[13, {k // 32}], %mn: f32[13, {k // 32}]) {{
  %0 = permute(%a) {{dims = [0, 2, 1, 3]}} : f32[1, {m}, {heads}, {dim}]
  %1 = reshape(%0) {{shape = [1, {m}, {k}]}} : f32[1, {m}, {k}]
  %2 = qlinear(%1, %q, %s, %mn) {{kind = "int4", group_size = 32, symmetric = false, activations = "{activations}"}} : f32[1, {m}, 13]
  return %2
}}"""


@pytest.mark.parametrize("m,heads,dim,activations,simd", [
    (1, 9, 64, "f32", True), (3, 9, 64, "f32", True), (1, 9, 64, "int8", True), (2, 4, 32, "int8", True),
    (1, 24, 24, "f32", False)])
def test_x_split_along_k_streams(m: int, heads: int, dim: int, activations: str, simd: bool) -> None:
    """x read through `k // D`, `k % D` (the attention output reshaped for `o_proj`) takes the
    SIMD kernel when D is a multiple of `CHUNK_DIVISOR` (each chunk of lanes is one vector
    load); D = 24 keeps the plain nest. Both match the float64 product."""
    c = Compiled(_split_k_graph(m, heads, dim, activations))
    plans = [dict(kk.attrs).get("qlinear") for kk in c.program.kernels]
    assert len(plans) == 1 and (plans[0] is not None) == simd, plans
    k = heads * dim
    arrays, wd = weights(13, k, "int4", 32, False)
    a = np.random.default_rng(4).standard_normal((1, heads, m, dim)).astype(np.float32)
    out = np.zeros((1, m, 13), np.float32)
    c({**arrays, "a": a, "out0": out})
    x = a.transpose(0, 2, 1, 3).reshape(m, k)
    expected = reference(x, wd, np.zeros(13), epilogue=False, plan=plans[0], kind="int4", group=32)
    np.testing.assert_allclose(out.reshape(m, 13), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def _int8_full_range(n: int, k: int, group: int, seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """int8 codes over the whole byte range (-128 and 127 included, as a GGUF Q8_0 file may
    hold) with f16 scales per group, and the dequantized weight in float64."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-128, 128, (n, k), dtype=np.int8)
    q[0, :2] = (-128, 127)
    s = rng.uniform(0.001, 0.02, (n, k // group)).astype(np.float16)
    wd = q.astype(np.float64) * np.repeat(s.astype(np.float64), group, axis=1)
    return {"q": q, "s": s}, wd


def _vnni_host() -> bool:
    from torchburn.codegen import host_target

    return host_target().has_feature("avx512vnni")


def _check_offset_codes(m: int, n: int, k: int, group: int, seed: int) -> None:
    text = qlinear_graph(m, n, k, "int8", group, True, scale_dtype="f16", activations="int8", form="rows")
    c = Compiled(text)
    plan = dict(c.program.kernels[0].attrs)["qlinear"]
    assert "act=int8" in plan and "codes=u8" in plan, plan
    arrays, wd = _int8_full_range(n, k, group, seed)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    out = np.zeros((m, n), np.float32)
    c({**arrays, "x": x, "b": b, "out0": out})
    expected = reference(x, wd, b, plan=plan, kind="int8", group=group)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not _vnni_host(), reason="codes read as q + 128 need a native vpdpbusd")
@pytest.mark.parametrize("m,n,k,group", [(1, 13, 96, 32), (3, 9, 576, 32), (5, 7, 160, 16),
                                         (16, 21, 576, 32), (17, 6, 64, 32)])
def test_int8_codes_read_as_unsigned_bytes(m: int, n: int, k: int, group: int) -> None:
    """Grouped int8 weights (Q8_0's layout) on a VNNI host read their codes as `q + 128`, the
    unsigned operand of `vpdpbusd` (no sign fix-up of x per row and dot), each dot started from
    -128 times x's sums of four bytes: odd row counts (a partial tile of rows), packs of groups
    and a single group left, codes of -128 and 127, against the float64 product of the
    quantized x."""
    _check_offset_codes(m, n, k, group, seed=m + k)


@pytest.mark.skipif(not _vnni_host(), reason="codes read as q + 128 need a native vpdpbusd")
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 19), n=st.integers(1, 9), groups=st.integers(1, 12), seed=st.integers(0, 1000))
def test_int8_codes_read_as_unsigned_bytes_property(m: int, n: int, groups: int, seed: int) -> None:
    _check_offset_codes(m, n, 32 * groups, 32, seed)


@pytest.mark.parametrize("m,k,kind,symmetric", [(3, 576, "int4", False), (16, 576, "int4", False),
                                                (5, 576, "int8", True), (2, 608, "int4", True),
                                                (4, 352, "int8", True)])
def test_int8_activations_tail_groups_read_scales_as_vectors(m: int, k: int, kind: str, symmetric: bool) -> None:
    """Groups left after the blocks of eight (K = 576: 18 groups of 32, SmolLM2's hidden
    size) are taken in smaller power-of-two blocks with narrower packs (int4: 2 groups as one
    pack of 2 after packs of 4), their scales (and mins) read as vectors: only a last odd
    group (K = 608: 19 groups; 352: 11) reads them one by one. Against the float64 product
    of the quantized x, with x's pack order changing inside the row."""
    from torchburn.ir import expr as ex
    from torchburn.ir import loop as lp

    n = 11
    c = Compiled(qlinear_graph(m, n, k, kind, 32, symmetric, epilogue=False, activations="int8", form="rows"))
    plan = dict(c.program.kernels[0].attrs)["qlinear"]
    assert "act=int8" in plan, plan
    body = c.program.kernels[0].body
    scalar = [e for s in lp.walk_stmts(body) for e0 in lp.stmt_exprs(s) for e in ex.walk(e0)
              if isinstance(e, ex.Load) and e.buffer in ("s", "mn") and e.type.lanes == 1]
    assert (len(scalar) > 0) == bool((k // 32) % 2), (len(scalar), plan)
    arrays, wd = weights(n, k, kind, 32, symmetric)
    x = np.random.default_rng(k + m).standard_normal((m, k)).astype(np.float32)
    out = np.zeros((m, n), np.float32)
    c({**arrays, "x": x, "b": np.zeros(n, np.float32), "out0": out})
    expected = reference(x, wd, np.zeros(n), epilogue=False, plan=plan, kind=kind, group=32)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
