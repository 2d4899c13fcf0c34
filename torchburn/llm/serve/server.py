"""Running the server: the scheduler's thread, uvicorn on the asyncio side, and a graceful stop.

On SIGTERM or SIGINT the server stops accepting connections and takes no new requests
(``/health`` answers 503); requests already running or waiting may finish for
``shutdown_timeout`` seconds, after which each ends with an error event (a stream) or a 503
(a whole response).  Then the process exits: no request ends silently.
"""
from __future__ import annotations

import logging
import signal
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..runtime.scheduler import Scheduler
from .app import ServerState, create_app

if TYPE_CHECKING:
    from ..runtime.engine import LLM

log = logging.getLogger("torchburn")


def default_model_name(source: Optional[str], llm: "LLM") -> str:
    """The served model's id: the Hub id it was loaded by, else the file's stem (a .gguf) or
    the folder's name."""
    name = llm.name
    if name.endswith(".gguf"):
        return Path(name).stem
    return name


def check_port_free(host: str, port: int) -> None:
    """A clear error before loading anything when the address is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise OSError(f"cannot listen on {host}:{port}: {e.strerror}") from None


def run_server(llm: "LLM", *, model_name: str, host: str = "127.0.0.1", port: int = 8000,
               parallel: int = 4, max_queue: int = 64, api_key: Optional[str] = None,
               prefix_cache: int = 4, shutdown_timeout: float = 30.0, warm_up: bool = True,
               log_level: str = "info") -> None:
    """Serve ``llm`` until SIGTERM/SIGINT (see the module's docstring)."""
    import uvicorn

    scheduler = Scheduler(llm, parallel=parallel, max_queue=max_queue, prefix_cache=prefix_cache)
    if warm_up:
        scheduler.warm_up()
    state = ServerState(llm, scheduler, model_name, api_key)
    app = create_app(state)
    scheduler.start()

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if not state.draining:
                log.info("torchburn: shutting down; running requests have %.0f s to finish",
                         shutdown_timeout)
                state.draining = True
                scheduler.drain(shutdown_timeout)
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off",
                            timeout_graceful_shutdown=int(shutdown_timeout) + 5,
                            access_log=log_level == "debug")
    server = Server(config)
    # uvicorn raises the signal again after its graceful shutdown, with the handler it found:
    # a SIGTERM that was handled (every request ended) then ends the process with status 0
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda sig, frame: None) if main else None
    try:
        server.run()
    finally:
        scheduler.stop()
        if main:
            signal.signal(signal.SIGTERM, previous)
