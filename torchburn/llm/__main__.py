"""``python -m torchburn.llm``: see `torchburn.llm.cli.main`."""
from .cli.main import run

run()
