"""Helpers of the `lower-to-loops` pass: index maps of views, scalar forms of elementwise ops,
and the builder that turns one fused kernel into a loop nest.

Importing this package registers the element and root rules of the op families kept in
their own modules."""
from . import indexing_rules, nn_rules  # noqa: F401
