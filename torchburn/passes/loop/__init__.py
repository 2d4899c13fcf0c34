"""Passes on loop nests (after `lower-to-loops`): simplification, tiling, unrolling,
vectorization, parallelization, accumulator splitting, math expansion and memory planning,
with the loop utilities they share."""
