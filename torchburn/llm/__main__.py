"""``python -m torchburn.llm``: see `torchburn.llm.cli`."""
from .cli import run

run()
