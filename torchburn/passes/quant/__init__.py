"""The quantized-product kernels (`qlinear`: int8/int4 and the GGUF block types), built by
`lower-to-loops` for a fused quantized linear: the SIMD GEMV/GEMM forms, int8 activations,
and the plain nest for GPUs."""
