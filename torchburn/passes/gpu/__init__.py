"""The GPU engine's passes: lowering fused kernels to WGSL-shaped nests, mapping loops onto
workgroups and invocations, splitting wide and deep reductions, and the GPU pipeline."""
