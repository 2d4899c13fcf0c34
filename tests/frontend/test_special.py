"""Special functions (frontend/lowerings/special.py) against PyTorch over wide argument ranges,
special values included, in f32 and f64."""
from __future__ import annotations

from typing import Callable

import pytest
import torch

from tests.helpers import assert_fully_compiled, check, run_compiled

FUNCS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "i0": torch.i0, "i0e": torch.special.i0e, "i1": torch.special.i1, "i1e": torch.special.i1e,
    "modified_bessel_i0": torch.special.modified_bessel_i0,
    "modified_bessel_i1": torch.special.modified_bessel_i1,
    "modified_bessel_k0": torch.special.modified_bessel_k0,
    "modified_bessel_k1": torch.special.modified_bessel_k1,
    "scaled_modified_bessel_k0": torch.special.scaled_modified_bessel_k0,
    "scaled_modified_bessel_k1": torch.special.scaled_modified_bessel_k1,
    "bessel_j0": torch.special.bessel_j0, "bessel_j1": torch.special.bessel_j1,
    "bessel_y0": torch.special.bessel_y0, "bessel_y1": torch.special.bessel_y1,
    "spherical_bessel_j0": torch.special.spherical_bessel_j0,
    "erfcx": torch.special.erfcx, "airy_ai": torch.special.airy_ai,
}


def _args(dtype: torch.dtype) -> torch.Tensor:
    grid = torch.cat([torch.linspace(-40, 40, 801, dtype=torch.float64), torch.tensor([-2.09, 2.09, 8.3203353, 104.0])])
    special = torch.tensor([0.0, -0.0, 1e-6, -1e-6, 0.3, 2.0, 5.0, 8.0, 26.0, 27.0, -27.0,
                            float("inf"), float("-inf"), float("nan")], dtype=torch.float64)
    return torch.cat([grid, special]).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(FUNCS))
def test_special_function_matches_torch(name: str, dtype: torch.dtype) -> None:
    fn = FUNCS[name]
    x = _args(dtype)
    if dtype == torch.float64:
        check(fn, x, rtol=1e-10, atol=1e-12)
        return
    # f32 is computed in f64 and rounded once, so it is compared with the f64 result (eager
    # f32 loses more, e.g. in sin of the large phases of Ai(-37)).
    out, reports = run_compiled(fn, x)
    torch.testing.assert_close(out, fn(x.double()).float(), rtol=2e-6, atol=1e-7, equal_nan=True)
    assert_fully_compiled(reports)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ndtri_matches_torch(dtype: torch.dtype) -> None:
    p = torch.cat([torch.linspace(0, 1, 1001, dtype=torch.float64),
                   torch.tensor([1e-300, 1e-20, 1e-15, 1 - 1e-12, -0.5, 1.5, float("nan")], dtype=torch.float64)])
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    check(torch.special.ndtri, p.to(dtype), **tol)
