"""Admin routes: prefix-cache flush (waits for queued SSD writes, reports counts)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

router = APIRouter()


@router.post("/admin/cache/flush")
async def cache_flush(request: Request) -> dict:
    engine = request.app.state.engine
    flush = getattr(engine, "flush_cache", None)
    if flush is None:
        return {"flushed": True, "prefix_cache": "unavailable"}
    # the wait is on disk I/O: keep it off the event loop
    return await asyncio.to_thread(flush, 60.0)
