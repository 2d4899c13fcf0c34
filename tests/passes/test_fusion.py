"""`fuse` (passes/tensor/fusion.py): a residual stream is stored at each add, as its product's
epilogue, so every layer of a deep model gets the same kernels."""
from __future__ import annotations

from torchburn.ir.parser import parse_graph
from torchburn.passes.base import get_pass
from torchburn.passes.loop.dedup_kernels import DedupKernels


def residual_layers(n: int) -> str:
    """`h = h + (h * sum(h)) @ w_i`, `n` times: each sum reads the stream, as a norm does."""
    params = ", ".join(f"%w{i}: f32[16, 16]" for i in range(n))
    lines = [f"graph @g(%x: f32[8, 16], {params}) {{"]
    h = "%x"
    for i in range(n):
        lines += [f"  %s{i} = reduce_sum({h}) {{dims = [1], keepdim = true}} : f32[8, 1]",
                  f"  %e{i} = expand(%s{i}) {{shape = [8, 16]}} : f32[8, 16]",
                  f"  %n{i} = mul({h}, %e{i}) : f32[8, 16]",
                  f"  %m{i} = matmul(%n{i}, %w{i}) : f32[8, 16]",
                  f"  %h{i} = add({h}, %m{i}) : f32[8, 16]"]
        h = f"%h{i}"
    lines += [f"  return {h}", "}"]
    return "\n".join(lines)


def test_residual_adds_are_stored_as_epilogues() -> None:
    graph = get_pass("fuse")().run(parse_graph(residual_layers(4)))
    adds = [op for op in graph.ops if op.name == "add"]
    assert all("kernel" in op.attrs for op in adds)  # stored, each its own kernel's root
    for op in graph.ops:
        if op.name == "matmul":  # computed inside the add's kernel, never written
            assert op.attrs.get("fused_into") == (graph.ops[graph.ops.index(op) + 1].attrs["kernel"],)


def test_every_layer_lowers_to_the_same_kernels() -> None:
    def distinct(n: int) -> int:
        graph = get_pass("fuse")().run(parse_graph(residual_layers(n)))
        program = get_pass("lower-to-loops")().run(graph)
        return len(DedupKernels().run(program).kernels)

    assert distinct(3) == distinct(6)


def test_fusion_time_grows_gently_with_depth() -> None:
    """The recompute cost stops at its limit: walked to the end, the inlined DAG of 30 layers
    took seconds, of 60 layers minutes (it was exponential in the depth)."""
    import time

    graph = parse_graph(residual_layers(60))
    t0 = time.process_time()
    get_pass("fuse")().run(graph)
    assert time.process_time() - t0 < 1.0  # ~0.02 s here


ROTARY_THROUGH_VIEWS = """
graph @g(%emb: f32[16, 8], %q: f32[2, 16, 8], %k: f32[2, 16, 8]) {{
  %c = {op}(%emb) : f32[16, 8]
  %r = reshape(%c) {{shape = [1, 16, 8]}} : f32[1, 16, 8]
  %e = expand(%r) {{shape = [2, 16, 8]}} : f32[2, 16, 8]
  %a = mul(%q, %e) : f32[2, 16, 8]
  %b = mul(%k, %e) : f32[2, 16, 8]
  return %a, %b
}}"""


def test_expensive_op_read_through_a_view_by_several_kernels_is_stored() -> None:
    """`cos(emb)` seen through `reshape` by two kernels (the rotary embedding of queries and
    keys): the view has one consumer count, its readers are two, so cos is stored once."""
    graph = get_pass("fuse")().run(parse_graph(ROTARY_THROUGH_VIEWS.format(op="cos")))
    cos = next(op for op in graph.ops if op.name == "cos")
    assert "kernel" in cos.attrs
    cheap = get_pass("fuse")().run(parse_graph(ROTARY_THROUGH_VIEWS.format(op="neg")))
    neg = next(op for op in cheap.ops if op.name == "neg")
    assert neg.attrs.get("fused_into") == (0, 1)  # cheap: recomputed in both kernels


CONV_THROUGH_A_VIEW = """graph @main(%g: f32[1, 8, 4, 64], %x: f32[1, 32, 8, 8], %w: f32[16, 32, 3, 3]) {
  %0 = reshape(%g) {shape = [1, 32, 8, 8]} : f32[1, 32, 8, 8]
  %1 = conv(%0, %w) {stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 1} : f32[1, 16, 8, 8]
  %2 = conv_grad_weight(%0, %x) {window = [3, 3], stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 1} : f32[32, 32, 3, 3]
  return %1, %2
}"""


def test_a_view_a_convolution_loads_from_is_stored() -> None:
    """GroupNorm's backward hands the next convolution its gradient as a reshape of
    `[N, G, C/G, H*W]`: inlined into the convolution, the view left it the element-by-element
    nest (the blocked kernels load their input from a buffer); stored once, it gets them."""
    graph = get_pass("fuse")().run(parse_graph(CONV_THROUGH_A_VIEW))
    view = next(op for op in graph.ops if op.name == "reshape")
    assert "kernel" in view.attrs and not view.attrs.get("fused_into")
    program = get_pass("lower-to-loops")().run(graph)
    text = str(program)
    assert "vreduce_add" in text or "fma" in text  # the blocked (vector) convolution kernels


SQUEEZE_EXCITE = """
graph @g(%x: f32[1, 8, 6, 6], %w: f32[8, 1, 3, 3]) {
  %c = conv(%x, %w) {stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 8} : f32[1, 8, 6, 6]
  %s = sigmoid(%c) : f32[1, 8, 6, 6]
  %h = mul(%c, %s) : f32[1, 8, 6, 6]
  %m = reduce_sum(%h) {dims = [2, 3], keepdim = true} : f32[1, 8, 1, 1]
  %e = expand(%m) {shape = [1, 8, 6, 6]} : f32[1, 8, 6, 6]
  %y = mul(%h, %e) : f32[1, 8, 6, 6]
  return %y
}
"""


def test_an_activation_read_twice_is_computed_once() -> None:
    """SiLU (`c * sigmoid(c)`) read by a squeeze-excite's mean and by its scaling: the sigmoid
    counts toward the cost of recomputing the `mul` (its only reader), so SiLU is stored once,
    as the convolution's epilogue, instead of each reader computing the sigmoid again."""
    graph = get_pass("fuse")().run(parse_graph(SQUEEZE_EXCITE))
    ops = {op.result.name: op for op in graph.ops}
    assert "kernel" in ops["h"].attrs
    assert ops["s"].attrs["fused_into"] == ops["c"].attrs["fused_into"] == (ops["h"].attrs["kernel"],)
