"""`TextStream`: the text of a growing list of generated ids, released piece by piece.

A piece is released once it cannot change: never half a UTF-8 character (`StreamDecoder`), and
never the last ``len(longest stop string) - 1`` characters, which could still turn out to start
a stop string.  `LLM.stream` and the server's scheduler both push one id at a time through it.
"""
from __future__ import annotations

from typing import Sequence

from ..model.tokenizer import StreamDecoder, Tokenizer


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the first stop string, and whether one occurred."""
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    if not found:
        return text, False
    return text[:min(found)], True


class TextStream:
    """Pieces of text for ids pushed one at a time, cut at the first stop string."""

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = ()) -> None:
        self.decoder = StreamDecoder(tokenizer)
        self.stops = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""       # decoded text not yet released
        self.stopped = False    # a stop string was seen: nothing more comes out

    def push(self, token_id: int) -> str:
        """The text that can be released after ``token_id`` (maybe ""); check `stopped` after."""
        if self.stopped:
            return ""
        self.pending += self.decoder.push(token_id)
        if self.stops:
            cut, hit = cut_at_stop(self.pending, self.stops)
            if hit:
                self.stopped = True
                self.pending = ""
                return cut
        ready = self.pending[:len(self.pending) - self.hold] if self.hold else self.pending
        self.pending = self.pending[len(ready):]
        return ready

    def finish(self) -> str:
        """What is still held back, at the end of generation (cut at a stop string)."""
        if self.stopped:
            return ""
        text = self.pending + self.decoder.flush()
        self.pending = ""
        if self.stops:
            text, self.stopped = cut_at_stop(text, self.stops)
        return text
