"""ATen lowerings, one module per op family. Importing this package registers them all."""
from . import elementwise, factories, histogram, linalg, order, reductions, special, views  # noqa: F401
from . import attention, indexing, nn, number_theory, sorting  # noqa: F401
