"""16 concurrent streaming clients, a quarter hanging up mid-stream: the rest
complete, and every KV block returns to the pool."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import pytest


async def _client(url: str, i: int, hang_up_after: int | None, prompt: str) -> tuple[int, str | None]:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 24, "temperature": 0, "stream": True}
    chunks, finish = 0, None
    async with httpx.AsyncClient(timeout=300) as c:
        async with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                chunks += 1
                finish = chunk["choices"][0]["finish_reason"] or finish
                if hang_up_after is not None and chunks >= hang_up_after:
                    return i, "hung-up"  # leaving the block closes the connection
    return i, finish


def _wait_for(pred, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def test_sixteen_clients_with_disconnects(live):
    engine = live.engine
    start_free = engine.stats()["kv_blocks_free"]
    rng = random.Random(7)
    quitters = set(rng.sample(range(16), 4))
    prompt = "Write a short story about a robot." if live.kind == "real" else "tell me something"

    async def main():
        return await asyncio.gather(*[
            _client(live.url, i, rng.randint(2, 6) if i in quitters else None, prompt) for i in range(16)])

    results = dict(asyncio.run(main()))
    for i, finish in results.items():
        if i in quitters:
            assert finish == "hung-up"
        else:
            assert finish in ("stop", "length"), (i, finish)
    assert _wait_for(lambda: engine.stats()["kv_blocks_free"] == start_free), engine.stats()
    assert engine.stats()["num_running"] == 0
    # and it keeps serving
    r = httpx.post(live.url + "/v1/chat/completions", timeout=120,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 200


def test_disconnect_while_waiting_cancels(fake_live):
    """A client that leaves before its first token frees its request at once."""
    engine = fake_live.engine
    start_free = engine.stats()["kv_blocks_free"]
    engine.token_delay_s = 0.5  # slow enough that the client leaves mid-generation

    async def main():
        async with httpx.AsyncClient(timeout=30) as c:
            body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 50, "stream": True}
            async with c.stream("POST", fake_live.url + "/v1/chat/completions", json=body) as r:
                async for _ in r.aiter_lines():
                    break

    asyncio.run(main())
    assert _wait_for(lambda: engine.stats()["num_running"] == 0, timeout=3)
    assert engine.stats()["kv_blocks_free"] == start_free


def test_metrics_exposed(fake_live):
    httpx.post(fake_live.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                            "max_tokens": 4, "stream": True})
    text = httpx.get(fake_live.url + "/metrics").text
    for name in ("augury_requests_total", "augury_prompt_tokens_total", "augury_completion_tokens_total",
                 "augury_time_to_first_token_seconds_bucket", "augury_inter_token_latency_seconds_bucket",
                 "augury_queue_depth", "augury_running_batch_size", "augury_kv_blocks_used",
                 "augury_kv_blocks_free", "augury_prefix_cache_hit_tokens"):
        assert name in text, name
    assert 'route="/v1/chat/completions",status="200"' in text
