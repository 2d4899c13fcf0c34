"""`torchburn::linear_int8` / `linear_int4` compiled by TorchBurn (the `qlinear` IR op and its
dequantizing kernels, `torchburn/passes/quant/qlinear.py`) equal the ops' eager reference,
and nothing falls back to PyTorch."""
from __future__ import annotations

from typing import Any, Optional

import pytest
import torch

from tests.helpers import assert_fully_compiled, run_compiled
from torchburn.quant import QuantizedLinear, quantize_

# (quant_type, group_size, symmetric)
CONFIGS = [
    ("int8", None, True), ("int8", 32, True), ("int8", 64, True), ("int8", 128, True),
    ("int4", 32, True), ("int4", 64, True), ("int4", 128, True),
    ("int4", 32, False), ("int4", 64, False), ("int4", 128, False),
]
X_SHAPES = [(1, 256), (16, 256), (2, 3, 256)]


@pytest.fixture(autouse=True)
def _activations(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Float activations (exact to f32 rounding) unless a test asks for int8 ones with
    `@pytest.mark.parametrize("activations", ...)`; the choice is an attribute of the IR op,
    so each value compiles (and caches) its own kernel."""
    from torchburn.runtime.config import reload_config

    value = request.node.callspec.params.get("activations", "f32") if hasattr(request.node, "callspec") else "f32"
    monkeypatch.setenv("TORCHBURN_QLINEAR_ACTIVATIONS", value)
    reload_config()
    yield
    monkeypatch.undo()
    reload_config()


def _layer(quant_type: str, group: Optional[int], symmetric: bool, bias: bool, out_features: int = 72,
           in_features: int = 256, scale_dtype: torch.dtype = torch.float16) -> QuantizedLinear:
    torch.manual_seed(0)
    lin = torch.nn.Linear(in_features, out_features, bias=bias)
    return QuantizedLinear.from_float(lin, quant_type, group, symmetric, scale_dtype)


def _check(fn: Any, x: torch.Tensor, dynamic: bool = False) -> None:
    with torch.no_grad():
        expected = fn(x)
        out, reports = run_compiled(fn, x, dynamic=dynamic)
    tol = {"rtol": 1e-4, "atol": 1e-4} if x.dtype == torch.float32 else {}
    torch.testing.assert_close(out, expected, **tol)
    assert out.dtype == x.dtype
    assert_fully_compiled(reports)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-g{c[1]}-{'sym' if c[2] else 'asym'}")
@pytest.mark.parametrize("shape", X_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_eager(config: tuple[str, Optional[int], bool], shape: tuple[int, ...]) -> None:
    """Every layout, GEMV and multi-row forms, 3-D x; bias and dtype vary across the grid."""
    quant_type, group, symmetric = config
    k = CONFIGS.index(config) + X_SHAPES.index(shape)
    bias = k % 2 == 0
    dtype = torch.bfloat16 if k % 3 == 0 else torch.float32
    layer = _layer(quant_type, group, symmetric, bias)
    if dtype == torch.bfloat16:
        layer = layer.to(torch.bfloat16)
    _check(layer, torch.randn(shape, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_bias_and_dtype(dtype: torch.dtype, bias: bool) -> None:
    layer = _layer("int4", 64, True, bias)
    if dtype == torch.bfloat16:
        layer = layer.to(torch.bfloat16)
    _check(layer, torch.randn(5, 256, dtype=dtype))


@pytest.mark.parametrize("config,in_features", [
    (("int8", None, True), 40),   # K not a multiple of the vector width: 8-lane chunks
    (("int8", 20, True), 100),    # group of 20: 4-lane chunks
    (("int4", 8, True), 40),      # half groups of 4 bytes
    (("int4", 24, False), 72),    # half groups of 12 bytes: 4-lane chunks
])
def test_odd_sizes(config: tuple[str, Optional[int], bool], in_features: int) -> None:
    """Sizes that are not multiples of the vector width or of the row/column blocks."""
    layer = _layer(*config, bias=True, out_features=37, in_features=in_features)
    for rows in (1, 7):
        _check(layer, torch.randn(rows, in_features))


def test_dynamic_rows() -> None:
    """M known at run time only: the GEMV and the multi-row kernel, chosen by M."""
    layer = _layer("int4", 32, True, bias=True)
    with torch.no_grad():
        torch._dynamo.reset()
        fn = torch.compile(layer, backend="torchburn", dynamic=True, fullgraph=True)
        for rows in (1, 3, 9, 16):
            x = torch.randn(rows, 256)
            torch.testing.assert_close(fn(x), layer(x), rtol=1e-4, atol=1e-4)


def test_quantized_model_fuses_epilogues() -> None:
    """A model quantized with `quantize_`: one kernel per layer, bias and GELU computed on the
    finished tile (no separate elementwise kernel)."""
    from torchburn.compiler import driver

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 96), torch.nn.GELU(), torch.nn.Linear(96, 64)).eval()
    quantize_(model, "int4", group_size=32)
    x = torch.randn(4, 128)
    driver.memory_cache().entries.clear()
    _check(model, x)
    programs = [c.program for c in driver.memory_cache().entries.values()]
    assert len(programs) == 1
    kernels = programs[0].kernels
    assert len(kernels) == 2
    assert all("qlinear" in dict(k.attrs) for k in kernels)


def test_non_contiguous_x_uses_plain_kernel() -> None:
    """x read through a transposing view cannot be streamed with vector loads: the scalar
    kernel computes it, still compiled and still equal."""
    layer = _layer("int4", 32, False, bias=True)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return layer(x.t())

    _check(fn, torch.randn(256, 6))


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("activations", ["int8"])
@pytest.mark.parametrize("config", [("int8", None, True), ("int8", 32, True), ("int4", 64, True),
                                    ("int4", 32, False), ("int4", 128, True)],
                         ids=lambda c: f"{c[0]}-g{c[1]}-{'sym' if c[2] else 'asym'}")
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_int8_activations_accuracy(activations: str, config: tuple[str, Optional[int], bool], rows: int) -> None:
    """x quantized to int8 per group: the output differs from the op's eager reference by
    x's rounding alone, about 0.5% relative for x ~ N(0, 1) (half a step of 1/127 of each
    group's absmax, summed over K at random signs), so the bound is 1.5%. Against the float
    linear, for INT4 that adds little to the weight's own error (the two add in quadrature):
    the total stays within 1.1x the float-activation error, and for INT8 within the
    documented 1% for these rows."""
    quant_type, group, symmetric = config
    torch.manual_seed(1)
    lin = torch.nn.Linear(320 if quant_type == "int4" and group == 32 else 512, 48, bias=False)
    layer = QuantizedLinear.from_float(lin, quant_type, group, symmetric, torch.float16)
    x = torch.randn(rows, lin.in_features)
    with torch.no_grad():
        expected = layer(x)
        out, reports = run_compiled(layer, x)
        exact = torch.nn.functional.linear(x, lin.weight)
    assert_fully_compiled(reports)
    assert 1e-5 < _relative_error(out, expected) < 0.015, "x was quantized (f32 activations give ~3e-7)"
    if quant_type == "int4":
        assert _relative_error(out, exact) < 1.1 * _relative_error(expected, exact)
    else:
        assert _relative_error(out, exact) < 0.01


@pytest.mark.parametrize("activations", ["int8"])
@pytest.mark.parametrize("config", [("int4", 32, True), ("int4", 32, False), ("int8", 32, True)],
                         ids=lambda c: f"{c[0]}-g{c[1]}-{'sym' if c[2] else 'asym'}")
@pytest.mark.parametrize("in_features", [256, 608, 96])
@pytest.mark.parametrize("rows", [1, 5])
def test_int8_activations_group_blocks(activations: str, config: tuple[str, Optional[int], bool],
                                       in_features: int, rows: int) -> None:
    """The int8-activation kernel reads the scales of GROUP_BLOCK groups as one vector and takes
    the groups left over one by one: 8 groups (blocks only), 19 (two blocks and three left),
    3 (none in a block) give the op's reference within x's rounding."""
    quant_type, group, symmetric = config
    torch.manual_seed(in_features + rows)
    lin = torch.nn.Linear(in_features, 40, bias=True)
    layer = QuantizedLinear.from_float(lin, quant_type, group, symmetric, torch.float16)
    x = torch.randn(rows, in_features)
    with torch.no_grad():
        expected = layer(x)
        out, reports = run_compiled(layer, x)
    assert_fully_compiled(reports)
    assert 1e-5 < _relative_error(out, expected) < 0.015
