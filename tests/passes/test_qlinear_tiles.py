"""The `qlinear` tile form (`passes/quant/qlinear_tiles.py`: 16 weight rows by 16 rows of x per
AMX tile product): numerics against the float64 product of the quantized x and against the
rows form, where it is chosen, and the fallbacks where AMX is absent or refused."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.passes.test_qlinear import Compiled, _int8_full_range, qlinear_graph, reference, weights
from torchburn.codegen import amx, host_target
from torchburn.codegen import target as target_mod
from torchburn.ir.parser import parse_graph
from torchburn.ir.printer import print_ir
from torchburn.passes.base import PassManager, get_pass
from torchburn.passes.pipeline import Pipeline


def _amx_host() -> bool:
    return host_target().tile_dot()


needs_amx = pytest.mark.skipif(not _amx_host(), reason="this CPU (or this process) has no AMX-INT8")


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "off")


def _plan(c: Compiled) -> str:
    return dict(c.program.kernels[0].attrs)["qlinear"]


def _run(c: Compiled, arrays: dict[str, np.ndarray], x: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((x.shape[0], n), np.float32)
    c({**arrays, "x": x, "b": b, "out0": out})
    return out


CASES = [  # m, n, k, kind, group, symmetric, scales
    (16, 40, 96, "int4", 32, False, "f16"),   # Q4_1's layout, N not a multiple of 16
    (5, 37, 128, "int4", 32, True, "f32"),    # a partial block of rows
    (37, 21, 576, "int8", 32, True, "f16"),   # Q8_0's layout, three row blocks (16, 16, 5)
    (16, 48, 256, "int4", 64, False, "f16"),  # a 64-element group: one full tile row
    (20, 16, 256, "int4", 128, True, "f32"),  # a group of two tile products
    (4, 17, 128, "int8", 64, True, "f32"),
    (17, 33, 256, "int8", 128, True, "f16"),
    (16, 130, 576, "int4", 32, False, "f16"),  # 2.4 MFLOP: work items in parallel where threads > 1
]


@needs_amx
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_tiles_match_reference_and_rows(case: tuple) -> None:  # type: ignore[type-arg]
    """The tile form's integer sums are exact and x is quantized as in the rows form, so it
    matches the float64 product of the quantized x to f32 rounding, and the rows form to a few
    ulps of summation order (full-range int8 codes, -128 and 127, included)."""
    m, n, k, kind, group, symmetric, scales = case
    tiles = Compiled(qlinear_graph(m, n, k, kind, group, symmetric, scale_dtype=scales, activations="int8", form="tiles"))
    rows = Compiled(qlinear_graph(m, n, k, kind, group, symmetric, scale_dtype=scales, activations="int8", form="rows"))
    assert _plan(tiles).startswith("tiles "), _plan(tiles)
    assert "tile_dot_" in print_ir(tiles.program)
    assert not _plan(rows).startswith("tiles")
    if kind == "int8" and scales == "f16":
        arrays, wd = _int8_full_range(n, k, group, seed=m)
    else:
        arrays, wd = weights(n, k, kind, group, symmetric, seed=m)
        arrays = {key: v.astype(np.float16) if key in ("s", "mn") and scales == "f16" else v for key, v in arrays.items()}
        if scales == "f16":  # the reference from the f16 scales the kernel reads
            wd = _dequantized(arrays, kind, group, symmetric, n, k)
    rng = np.random.default_rng(m + k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[0, :group] = 0.0  # an all-zero group of x (scale 0)
    b = rng.standard_normal(n).astype(np.float32)
    got = _run(tiles, arrays, x, b, n)
    expected = reference(x, wd, b, plan=_plan(tiles), kind=kind, group=group)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, _run(rows, arrays, x, b, n), rtol=2e-5, atol=2e-5)


def _dequantized(arrays: dict[str, np.ndarray], kind: str, group: int, symmetric: bool, n: int, k: int) -> np.ndarray:
    s = np.repeat(arrays["s"].astype(np.float64), group, axis=1)
    if kind == "int8":
        return arrays["q"].astype(np.float64) * s
    packed = arrays["q"].reshape(n, k // group, group // 2)
    codes = np.concatenate([packed & 15, packed >> 4], axis=-1).reshape(n, k).astype(np.float64)
    if symmetric:
        return (codes - 8) * s
    return codes * s + np.repeat(arrays["mn"].astype(np.float64), group, axis=1)


def _lowered_plan(text: str, target: object, options: str = "") -> str:
    pipeline = Pipeline.default()
    pipeline.lowering = get_pass("lower-to-loops")(**options_dict(options))
    program = PassManager(pipeline.passes(), target=target).run(parse_graph(text))
    return dict(program.kernels[0].attrs)["qlinear"]


def options_dict(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (kv.split("=") for kv in text.split(",") if kv)}


@pytest.mark.parametrize("m,min_rows,tiles", [(16, 4, True), (3, 4, False), (5, 8, False), (8, 8, True),
                                              (16, 0, False), (64, 4, False), (20, 1, True)])
def test_tile_rows_option_chooses_the_form(m: int, min_rows: int, tiles: bool) -> None:
    """On a target with AMX-INT8 the tile form is taken from `qlinear_tile_rows` rows of x
    (0: never) up to the panel form's rows; on the same CPU without AMX never (the rows or
    panel form instead)."""
    amx_target = dataclasses.replace(host_target(), features="+avx512f,+avx512bw,+avx512vl,+avx512vnni,+amx-tile,+amx-int8",
                                     vector_bits=512, cpu="sapphirerapids", name="amx-test")
    plain = dataclasses.replace(amx_target, features=amx.without_tiles(amx_target.features), name="no-amx-test")
    text = qlinear_graph(m, 64, 256, "int4", 32, False, activations="int8")
    plan = _lowered_plan(text, amx_target, f"qlinear_tile_rows={min_rows}")
    assert plan.startswith("tiles ") == tiles, plan
    assert not _lowered_plan(text, plain, f"qlinear_tile_rows={min_rows}").startswith("tiles")


def test_tile_rows_option_rejects_negatives() -> None:
    from torchburn.passes.base import PassError

    with pytest.raises(PassError, match="qlinear_tile_rows"):
        get_pass("lower-to-loops")(qlinear_tile_rows=-1)


def test_form_tiles_without_amx_falls_back_and_computes() -> None:
    """`form = "tiles"` on a CPU without AMX is "auto": another form, the same results."""
    plain = dataclasses.replace(host_target(), features=amx.without_tiles(host_target().features), name="no-amx-test")
    text = qlinear_graph(16, 40, 96, "int4", 32, False, activations="int8", form="tiles")
    assert not _lowered_plan(text, plain).startswith("tiles")


def test_refused_permission_means_no_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel refuses the tile state, the host target has no AMX features (and the
    compiler the forms of a CPU without AMX); an AMX CPU's features say `+amx-int8` otherwise."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    monkeypatch.setattr(amx, "_syscall", lambda *args: (-1, 1))  # EPERM
    monkeypatch.setattr(llvm, "get_host_cpu_features", lambda: _Features("+avx512f,+amx-tile,+amx-int8,+amx-bf16"))
    amx.request_tiles.cache_clear()
    target_mod.host_target.cache_clear()
    try:
        refused = target_mod.host_target()
        assert not refused.tile_dot()
        assert "-amx-int8" in refused.features.split(",") and "+amx-int8" not in refused.features.split(",")
        monkeypatch.setattr(amx, "_syscall", lambda *args: (0, 0))
        amx.request_tiles.cache_clear()
        target_mod.host_target.cache_clear()
        assert target_mod.host_target().tile_dot()
    finally:
        monkeypatch.undo()
        amx.request_tiles.cache_clear()
        target_mod.host_target.cache_clear()


class _Features:
    def __init__(self, text: str) -> None:
        self.text = text

    def flatten(self) -> str:
        return self.text


def test_amx_code_is_not_loaded_without_the_tile_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Code compiled for AMX (from the disk cache, say) in a process the kernel refused the
    tile state: a clear error instead of a SIGILL at the first tile instruction."""
    from torchburn.runtime import jit
    from torchburn.runtime.shared_lib import load_shared

    monkeypatch.setattr(amx, "request_tiles", lambda: False)
    obj = jit.ObjectCode(b"", "x86_64-unknown-linux-gnu", "sapphirerapids", "+avx512f,+amx-tile,+amx-int8",
                         shared=b"not a library")
    with pytest.raises(RuntimeError, match="AMX tile state"):
        jit.load_object(obj)
    with pytest.raises(RuntimeError, match="AMX tile state"):
        load_shared(obj)
    jit.check_tile_state(jit.ObjectCode(b"", "x86_64-unknown-linux-gnu", "sapphirerapids", "+avx512f,-amx-tile"))


FRESH_PROCESS = r'''
import pickle, sys
import numpy as np
obj = pickle.load(open(sys.argv[1], "rb"))
from torchburn.runtime.shared_lib import load_shared
from torchburn.runtime import jit
native = load_shared(obj) if obj.shared else jit.load_object(obj)
import ctypes
arrays = pickle.load(open(sys.argv[2], "rb"))
names = sys.argv[3].split(",")
ptrs = (ctypes.c_void_p * len(names))(*[arrays[n].ctypes.data for n in names])
syms = (ctypes.c_int64 * 1)()
native.entry(sys.argv[4])(ctypes.addressof(ptrs), ctypes.addressof(syms), None)
np.save(sys.argv[5], arrays["out0"])
'''


@needs_amx
@pytest.mark.parametrize("shared", [True, False])
def test_a_fresh_process_runs_cached_amx_code(shared: bool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A process that only loads code compiled for AMX (a warm start from the disk cache, which
    never probes the host) asks for the tile state before running it: without that, the first
    tile instruction was an illegal instruction (SIGILL) that killed the process."""
    import pickle
    import subprocess
    import sys

    from torchburn.codegen import emit_program, entry_name
    from torchburn.runtime import jit

    m, n, k = 16, 40, 96
    c = Compiled(qlinear_graph(m, n, k, "int4", 32, False, activations="int8", form="tiles"))
    assert _plan(c).startswith("tiles ")
    obj = jit.compile_llvm_ir(emit_program(c.program, host_target()), host_target(), shared=shared)
    if shared and not obj.shared:
        pytest.skip("no linker for a shared library here")
    arrays, _ = weights(n, k, "int4", 32, False)
    rng = np.random.default_rng(0)
    arrays.update(x=rng.standard_normal((m, k)).astype(np.float32), b=rng.standard_normal(n).astype(np.float32),
                  out0=np.zeros((m, n), np.float32))
    names = [b.name for b in (*c.program.inputs, *c.program.outputs)]
    (tmp_path / "obj.pkl").write_bytes(pickle.dumps(obj))
    (tmp_path / "arrays.pkl").write_bytes(pickle.dumps(arrays))
    out = tmp_path / "out.npy"
    run = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(tmp_path / "obj.pkl"), str(tmp_path / "arrays.pkl"),
                          ",".join(names), entry_name(c.program), str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    np.testing.assert_allclose(np.load(out), _run(c, arrays, arrays["x"], arrays["b"], n), rtol=1e-6, atol=1e-6)
