"""The async client behind the sync client's face, so that one test suite
runs both: every call goes to an AsyncBerth on an event loop of its own (in
a thread), and what comes back is wrapped the same way. A test written for
:class:`berth.Berth` then checks :class:`berth.AsyncBerth` unchanged; a
method the async client lacks fails the test with AttributeError.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Iterator
from typing import Any

from berth import AsyncBerth, AsyncSandbox, AsyncTerminal, Forks


class Loop:
    """An event loop running in a daemon thread until closed."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="async-client", daemon=True)
        self._thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def _unwrap(v: Any) -> Any:
    return v._target if isinstance(v, Over) else v


class Over:
    """An async object seen as a sync one: coroutines are awaited, async
    iterators iterated, async context managers entered, on the loop."""

    def __init__(self, target: Any, loop: Loop) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_loop", loop)

    def __repr__(self) -> str:
        return f"Over({self._target!r})"

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr) or isinstance(attr, type):
            return attr

        def call(*args: Any, **kw: Any) -> Any:
            out = attr(*map(_unwrap, args), **{k: _unwrap(v) for k, v in kw.items()})
            if inspect.isasyncgen(out):
                return self._iterate(out)
            if inspect.isawaitable(out):
                out = self._loop.run(_awaited(out))
            return _wrap(out, self._loop)

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    def _iterate(self, agen: Any) -> Iterator[Any]:
        try:
            while True:
                try:
                    item = self._loop.run(agen.__anext__())
                except StopAsyncIteration:
                    return
                yield _wrap(item, self._loop)
        finally:
            self._loop.run(agen.aclose())

    def __iter__(self) -> Iterator[Any]:
        return self._iterate(self._target.__aiter__())

    def __enter__(self) -> Over:
        self._loop.run(_awaited(self._target.__aenter__()))
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.run(_awaited(self._target.__aexit__(*exc)))

    def close(self) -> None:
        """Berth.close is AsyncBerth.aclose; AsyncTerminal.close is close."""
        target = self._target
        self._loop.run(_awaited(target.aclose() if isinstance(target, AsyncBerth) else target.close()))


async def _awaited(aw: Any) -> Any:
    return await aw


def _wrap(v: Any, loop: Loop) -> Any:
    if isinstance(v, Forks):
        return Forks([Over(s, loop) for s in v], v.snapshot, v.frozen_ms)
    if isinstance(v, (AsyncBerth, AsyncSandbox, AsyncTerminal)):
        return Over(v, loop)
    if isinstance(v, list) and any(isinstance(x, AsyncSandbox) for x in v):
        return [Over(x, loop) for x in v]
    return v
