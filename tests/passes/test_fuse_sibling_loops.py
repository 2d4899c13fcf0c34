"""`fuse-sibling-loops`: the fused IR, the loops it must keep apart, and one-pass variance
statistics that stay accurate for rows of large mean."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torchburn.passes.loop.fuse_sibling_loops import FuseSiblingLoops
from tests.helpers import run_compiled

from .util import assert_ir, kernel, run_pass

SIBLINGS = """
    kernel @k(%x: f32[4] strides [1], %out: f32[2] strides [1]) {
      alloc %a: f32[1] strides [1] local
      %a[0] = 0.0:f32
      for r0 in 0..4 {
        %a[0] = %a[0] + %x[r0]
      }
      let m = %a[0] / 4.0:f32
      alloc %b: f32[1] strides [1] local
      %b[0] = 0.0:f32
      for r1 in 0..4 {
        %b[0] = %b[0] + %x[r1] * %x[r1]
      }
      %out[0] = m
      %out[1] = %b[0]
    }
"""


def test_sibling_reductions_fuse() -> None:
    assert_ir(run_pass(FuseSiblingLoops(), kernel(SIBLINGS)), """
        kernel @k(%x: f32[4] strides [1], %out: f32[2] strides [1]) {
          alloc %a: f32[1] strides [1] local
          %a[0] = 0.0:f32
          alloc %b: f32[1] strides [1] local
          %b[0] = 0.0:f32
          for r0 in 0..4 {
            %a[0] = %a[0] + %x[r0]
            %b[0] = %b[0] + %x[r0] * %x[r0]
          }
          let m = %a[0] / 4.0:f32
          %out[0] = m
          %out[1] = %b[0]
        }
    """)


def test_dependent_or_different_loops_stay_apart() -> None:
    dependent = kernel(SIBLINGS.replace("%x[r1] * %x[r1]", "%x[r1] * m"))
    assert run_pass(FuseSiblingLoops(), dependent) == dependent  # needs the first loop's result
    other_range = kernel(SIBLINGS.replace("for r1 in 0..4", "for r1 in 1..+3"))
    assert run_pass(FuseSiblingLoops(), other_range) == other_range
    shared = kernel(SIBLINGS.replace("%b[0] = %b[0] + %x[r1] * %x[r1]", "%a[0] = %a[0] + %x[r1]")
                    .replace("%out[1] = %b[0]", "%out[1] = %a[0]"))
    assert run_pass(FuseSiblingLoops(), shared) == shared  # both write %a
    through_memory = kernel("""
        kernel @k(%x: f32[4] strides [1], %out: f32[4] strides [1]) {
          for i in 0..4 {
            %out[i] = %x[i] * 2.0:f32
          }
          for j in 0..4 {
            %out[j] = %out[3 - j] + 1.0:f32
          }
        }
    """)
    assert run_pass(FuseSiblingLoops(), through_memory) == through_memory


def _var_mean(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.var_mean(x, dim=-1, correction=1)


@pytest.mark.parametrize("cols", [1, 2, 15, 17, 1000, 1023])
@pytest.mark.parametrize("offset", [0.0, 1000.0, -3.0e4])
def test_one_pass_statistics_as_accurate_as_eager(cols: int, offset: float) -> None:
    """Against a float64 reference: the worst error at most 4x eager's float32 one, so a
    large mean (where an unshifted `E[x^2] - E[x]^2` would cancel) stays accurate."""
    x = (offset + torch.randn(6, cols, generator=torch.Generator().manual_seed(cols))).float()
    w, b = torch.randn(cols), torch.randn(cols)
    cases = ((lambda t, w_, b_: F.layer_norm(t, (cols,), w_, b_), (x, w, b)), (_var_mean, (x,)))
    with torch.no_grad():
        for fn, args in cases:
            got, _ = run_compiled(fn, *args)
            eager = fn(*args)
            ref = fn(*(a.double() for a in args))
            for g, e, r in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(eager),
                               torch.utils._pytree.tree_leaves(ref)):
                assert torch.equal(g.isnan(), e.isnan())
                ok = ~r.isnan()
                if ok.any():
                    ours, theirs = (g.double() - r)[ok].abs().max(), (e.double() - r)[ok].abs().max()
                    assert ours <= 4 * theirs + 1e-6 * (1 + r[ok].abs().max()), (ours, theirs)


def test_layer_norm_reads_the_row_once_for_its_statistics() -> None:
    x = torch.randn(8, 64)
    with torch.no_grad():
        _, records = run_compiled(lambda t: F.layer_norm(t, (64,)), x)
    kernels = [k for r in records for s in r.subgraphs for k in s.kernels]
    assert len(kernels) == 1, kernels
