"""Submitting to the engine and reading its streams from the event loop.

`submit_all` turns engine refusals into API errors before any byte is sent;
`merge` interleaves the n choices of one request and cancels whatever is
still running when the consumer goes away (client disconnect).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

import anyio
from starlette.responses import StreamingResponse

from augury.engine.types import RequestOutput, SamplingParams
from augury.server.errors import APIError, EngineFull, from_value_error
from augury.server.metrics import ServerMetrics


def submit_all(engine: Any, work: list[tuple[list[int], SamplingParams]], retry_after_s: int = 1) -> list[Any]:
    """Submit every (prompt ids, params) pair or none of them (earlier ones are cancelled)."""
    handles: list[Any] = []
    try:
        for ids, p in work:
            handles.append(engine.submit(list(ids), p))
    except EngineFull as e:
        _cancel(handles)
        raise APIError(
            429, f"the server is busy ({e or 'queue full'}); retry shortly",
            code="queue_full", headers={"Retry-After": str(retry_after_s)},
        ) from e
    except ValueError as e:
        _cancel(handles)
        raise from_value_error(e) from e
    except BaseException:
        _cancel(handles)
        raise
    return handles


def _cancel(handles: list[Any]) -> None:
    for h in handles:
        try:
            h.cancel()
        except Exception:  # cancelling a finished request is harmless
            pass


@dataclass
class _Timing:
    start: float
    last: float | None = None


async def merge(handles: list[Any], metrics: ServerMetrics | None, t_arrival: float) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Yield (choice index, delta) from all handles as they arrive."""
    queue: asyncio.Queue = asyncio.Queue()
    done = [False] * len(handles)

    async def pump(i: int, h: Any) -> None:
        try:
            async for out in h.stream():
                await queue.put((i, out, None))
        except BaseException as e:  # forward engine failures to the consumer
            await queue.put((i, None, e))
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            await queue.put((i, None, StopAsyncIteration()))

    tasks = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(handles)]
    timing = [_Timing(t_arrival) for _ in handles]
    remaining = len(handles)
    try:
        while remaining:
            i, out, err = await queue.get()
            if isinstance(err, StopAsyncIteration):
                remaining -= 1
                continue
            if err is not None:
                raise APIError(500, f"engine error: {err}") from err
            now = time.monotonic()
            if metrics is not None and out.token_ids:
                t = timing[i]
                if t.last is None:
                    metrics.ttft.observe(now - t.start)
                else:
                    per = (now - t.last) / len(out.token_ids)
                    for _ in out.token_ids:
                        metrics.itl.observe(per)
                t.last = now
            if out.finished:
                done[i] = True
                if metrics is not None:
                    metrics.e2e.observe(now - timing[i].start)
                    metrics.completion_tokens.inc(out.completion_tokens)
                    if i == 0:
                        metrics.prompt_tokens.inc(out.prompt_tokens)
                        metrics.cached_tokens.inc(out.cached_tokens)
            yield i, out
    finally:
        if not all(done):
            if metrics is not None:
                metrics.cancelled.inc()
            _cancel([h for h, d in zip(handles, done) if not d])
        for t in tasks:
            t.cancel()


async def collect(handles: list[Any], metrics: ServerMetrics | None, t_arrival: float) -> list[list[RequestOutput]]:
    outs: list[list[RequestOutput]] = [[] for _ in handles]
    async for i, out in merge(handles, metrics, t_arrival):
        outs[i].append(out)
    return outs


async def collect_unless_disconnected(request: Any, handles: list[Any], metrics: ServerMetrics | None, t_arrival: float):
    """Non-streaming: a client that hangs up cancels its request too."""
    task = asyncio.ensure_future(collect(handles, metrics, t_arrival))
    try:
        while True:
            finished, _ = await asyncio.wait({task}, timeout=0.1)
            if finished:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                _cancel(handles)
                raise APIError(499, "client disconnected")
    finally:
        if not task.done():
            task.cancel()


class DisconnectAwareStream(StreamingResponse):
    """Always watch `receive` for a disconnect, whatever ASGI version the server
    speaks, so an idle stream (waiting on the engine) is cancelled at once."""

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[override]
        async with anyio.create_task_group() as tg:

            async def run_stream() -> None:
                try:
                    await self.stream_response(send)
                except OSError:
                    pass  # the peer is gone; the cancel below cleans up
                tg.cancel_scope.cancel()

            tg.start_soon(run_stream)
            await self.listen_for_disconnect(receive)
            tg.cancel_scope.cancel()


def final_or_500(seq: list) -> Any:
    """The last delta of a collected request; a failed generation becomes a 500 in the route's format."""
    final = seq[-1]
    if final.error or final.finish_reason == "error":
        from augury.server.errors import APIError

        raise APIError(500, f"generation failed: {final.error or 'engine error'}")
    return final
