"""The serve room: an OpenAI-compatible HTTP server (Starlette on uvicorn) over the runtime's
continuous-batching `Scheduler` (``torchburn serve``; docs/serve.md).  It imports the model and
runtime rooms, never the command line."""
