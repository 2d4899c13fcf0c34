"""The llm command line (``torchburn``, ``python -m torchburn.llm``): generate, chat, bench,
profile and serve.  It may import every other room."""
