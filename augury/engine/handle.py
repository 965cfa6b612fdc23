"""Per-request output queue shared by the engine thread and a consumer.

The engine thread pushes `RequestOutput` deltas; a consumer iterates them
either from a plain thread (blocking) or from asyncio (never blocking the
event loop: the engine wakes the loop with `call_soon_threadsafe`).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import TYPE_CHECKING, AsyncIterator, Callable, Iterator

from augury.engine.types import RequestOutput

if TYPE_CHECKING:
    pass


class RequestHandle:
    def __init__(self, request_id: str, cancel: Callable[[str], None]):
        self.request_id = request_id
        self._cancel = cancel
        self._items: deque[RequestOutput] = deque()
        self._cond = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self.done = False

    # engine side ---------------------------------------------------------
    def push(self, out: RequestOutput) -> None:
        with self._cond:
            self._items.append(out)
            if out.finished:
                self.done = True
            self._cond.notify_all()
            loop, event = self._loop, self._event
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # loop closed: consumer is gone
                pass

    # consumer side ---------------------------------------------------------
    def cancel(self) -> None:
        self._cancel(self.request_id)

    def __iter__(self) -> Iterator[RequestOutput]:
        while True:
            with self._cond:
                while not self._items:
                    self._cond.wait()
                out = self._items.popleft()
            yield out
            if out.finished:
                return

    async def stream(self) -> AsyncIterator[RequestOutput]:
        with self._cond:
            self._loop = asyncio.get_running_loop()
            self._event = asyncio.Event()
        try:
            while True:
                with self._cond:
                    out = self._items.popleft() if self._items else None
                    if out is None:
                        self._event.clear()
                if out is None:
                    await self._event.wait()
                    continue
                yield out
                if out.finished:
                    return
        finally:
            # a consumer that stops early (client disconnect) cancels the request
            if not self.done:
                self.cancel()
