"""`serve.app.Outbox`: the scheduler thread's events reach the requests' queues on the event
loop in order, with one wake-up of the loop for all the events emitted before it ran."""
from __future__ import annotations

import asyncio
import threading

import pytest

pytest.importorskip("starlette")

from torchburn.llm.runtime.scheduler import Finish, Text
from torchburn.llm.serve.app import Outbox


def test_events_of_one_turn_take_one_wake_up() -> None:
    async def main() -> tuple[list[list[object]], int]:
        loop = asyncio.get_running_loop()
        outbox = Outbox(loop)
        wakes = 0
        real = loop.call_soon_threadsafe

        def counting(callback, *args):  # type: ignore[no-untyped-def]
            nonlocal wakes
            wakes += 1
            return real(callback, *args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        queues: list[asyncio.Queue[object]] = [asyncio.Queue() for _ in range(4)]

        def turn() -> None:  # a scheduler turn on another thread: a token for every stream
            for step in range(3):
                for i, q in enumerate(queues):
                    outbox.put(q, Text(f"{i}:{step}"))
            for q in queues:
                outbox.put(q, Finish("length", 1, 3))

        worker = threading.Thread(target=turn)
        worker.start()
        worker.join()          # the loop has not run meanwhile: everything waits for one wake-up
        got = []
        for q in queues:
            events = []
            while True:
                e = await asyncio.wait_for(q.get(), 5)
                events.append(e)
                if isinstance(e, Finish):
                    break
            got.append(events)
        return got, wakes

    got, wakes = asyncio.run(main())
    assert wakes == 1
    for i, events in enumerate(got):
        assert [e.text for e in events[:-1]] == [f"{i}:{s}" for s in range(3)]  # type: ignore[attr-defined]
        assert isinstance(events[-1], Finish)


def test_events_after_a_delivery_wake_the_loop_again() -> None:
    async def main() -> list[str]:
        outbox = Outbox(asyncio.get_running_loop())
        q: asyncio.Queue[Text] = asyncio.Queue()
        out = []
        for n in range(3):  # each put after the previous delivery: none is left behind
            t = threading.Thread(target=outbox.put, args=(q, Text(str(n))))
            t.start()
            t.join()
            out.append((await asyncio.wait_for(q.get(), 5)).text)
        return out

    assert asyncio.run(main()) == ["0", "1", "2"]
