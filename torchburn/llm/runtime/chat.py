"""The interactive terminal chat behind `LLM.chat` and ``python -m torchburn.llm chat``.

Each turn renders the whole history with the model's chat template and streams the answer;
the KV cache is kept across turns (`ChatSession`), so a turn prefills only the tokens after
what the cache already holds.  ``/reset`` forgets the history and the cache, ``/exit`` (or end
of input) leaves, and Ctrl-C during an answer stops that answer only (what was said so far
stays in the history).  When the history no longer fits in ``max_context`` the oldest turns
are dropped, the chat says so, and the conversation after the system prompt is prefilled anew.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Optional, TextIO

from .session import ChatSession

if TYPE_CHECKING:
    from .engine import LLM

HELP = "Commands: /reset (forget the conversation), /exit (leave). Ctrl-C stops an answer."
#: Tokens kept free for the answer when trimming history.
ANSWER_RESERVE = 256


def _fit(llm: "LLM", messages: list[dict[str, str]], reserve: int, out: TextIO) -> list[int]:
    """Prompt ids for ``messages``, dropping the oldest turns (not the system prompt) until the
    prompt plus ``reserve`` tokens fits."""
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    turns = messages[len(system):]
    dropped = 0
    while True:
        ids = llm.encode_prompt(system + turns)
        if len(ids) + reserve <= llm.max_context or len(turns) <= 1:
            break
        # Drop one user turn and the answer that followed it.
        cut = 2 if len(turns) > 2 and turns[1]["role"] == "assistant" else 1
        turns = turns[cut:]
        dropped += cut
    if dropped:
        out.write(f"[history too long for max_context={llm.max_context}: dropped the "
                  f"{dropped} oldest message(s)]\n")
        messages[len(system):] = turns
    return ids


def run_chat(llm: "LLM", system_prompt: Optional[str] = None, *,
             max_new_tokens: Optional[int] = None, stdin: Optional[TextIO] = None,
             stdout: Optional[TextIO] = None, **sampling: Any) -> None:
    """Read-eval-print loop; ``sampling`` takes `LLM.generate`'s keyword arguments."""
    inp = stdin or sys.stdin
    out = stdout or sys.stdout
    history: list[dict[str, str]] = []
    session = ChatSession(llm)
    if system_prompt:
        history.append({"role": "system", "content": system_prompt})
    limit = max_new_tokens or llm.defaults.max_new_tokens
    reserve = min(limit, ANSWER_RESERVE, llm.max_context // 2)
    params = llm._params(sampling.get("temperature"), sampling.get("top_k"),
                         sampling.get("top_p"), sampling.get("min_p"),
                         sampling.get("repetition_penalty"))
    seed = sampling.get("seed")
    out.write(f"torchburn chat: {llm.name}. {HELP}\n")
    out.flush()
    try:
        while True:
            try:
                out.write(">>> ")
                out.flush()
                line = inp.readline()
            except KeyboardInterrupt:
                out.write("\n(Ctrl-C: type /exit to leave)\n")
                continue
            if not line:
                out.write("\n")
                return
            text = line.strip()
            if not text:
                continue
            if text in ("/exit", "/quit"):
                return
            if text == "/reset":
                del history[1 if system_prompt else 0:]
                session.reset()
                out.write("[conversation reset]\n")
                continue
            if text.startswith("/"):
                out.write(f"unknown command {text}. {HELP}\n")
                continue
            history.append({"role": "user", "content": text})
            answer: list[str] = []
            try:
                try:
                    ids = _fit(llm, history, reserve, out)
                except ValueError as e:
                    out.write(f"error: {e}\n")
                    history.pop()
                    continue
                for piece in session.stream(ids, limit, params, seed):
                    answer.append(piece)
                    out.write(piece)
                    out.flush()
            except KeyboardInterrupt:
                out.write(" [stopped]")
            out.write("\n")
            out.flush()
            history.append({"role": "assistant", "content": "".join(answer)})
    finally:
        session.close()  # its KV cache back to the LLM's pool
