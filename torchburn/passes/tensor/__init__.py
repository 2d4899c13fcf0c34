"""Passes on the tensor graph: canonicalization, batch-norm folding, attention forms and fusion
into kernels. They see `Graph`s and give `Graph`s back."""
