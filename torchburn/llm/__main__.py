"""``python -m torchburn.llm``: see `torchburn.llm.cli`."""
import sys

from .cli import main

sys.exit(main())
