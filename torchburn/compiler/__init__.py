"""The staged compile driver: one IR graph, one target -> passes -> codegen -> a loaded program,
with the caches, dumps and versions that go with it. Torch-free: it sees IR, the pass pipeline,
codegen and the runtime, so `torchburn-opt` and the backend share it."""
