"""Helpers of the `lower-to-loops` pass: index maps of views, scalar forms of elementwise ops,
and the builder that turns one fused kernel into a loop nest."""
