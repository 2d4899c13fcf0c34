"""Errors raised while turning loop IR into native code."""
from __future__ import annotations


class CodegenError(ValueError):
    """The IR cannot be compiled as given: an unsupported construct, a type mismatch, or a
    request that an earlier pass should have carried out (for example a `vectorized` loop)."""
