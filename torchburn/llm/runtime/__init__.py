"""The runtime room: the engine (`engine.LLM`), KV caches per request (`kv_pool`), sampling, the
compiled step (`step_runner`, `step_cache`), chat sessions and the request scheduler.  It imports
the model room, never the server or the command line."""
