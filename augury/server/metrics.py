"""Prometheus metrics, one registry per app (no process-global state).

Request counters and latency histograms are observed by the server; queue,
batch and KV gauges are read from `engine.stats()` at scrape time.
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, CounterMetricFamily

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class _EngineCollector:
    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def collect(self) -> Iterator:
        try:
            st = self.engine.stats()
        except Exception:  # a scrape must never fail because the engine is busy or down
            return
        gauges = {
            "num_waiting": ("augury_queue_depth", "Requests waiting for admission"),
            "num_running": ("augury_running_batch_size", "Requests in the running batch"),
            "kv_blocks_free": ("augury_kv_blocks_free", "Free KV cache blocks"),
            "kv_blocks_total": ("augury_kv_blocks_total", "KV cache blocks in the pool"),
        }
        for key, (name, doc) in gauges.items():
            if key in st:
                yield GaugeMetricFamily(name, doc, value=float(st[key]))
        if "kv_blocks_total" in st and "kv_blocks_free" in st:
            used = float(st["kv_blocks_total"]) - float(st["kv_blocks_free"])
            yield GaugeMetricFamily("augury_kv_blocks_used", "KV cache blocks in use", value=used)
        counters = {
            "prefix_cache_hit_tokens": ("augury_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache"),
            "prompt_tokens_total": ("augury_engine_prompt_tokens", "Prompt tokens the engine processed"),
            "generation_tokens_total": ("augury_engine_generation_tokens", "Tokens the engine generated"),
            "spec_drafted_total": ("augury_spec_drafted_tokens", "Draft tokens proposed by speculative decoding"),
            "spec_accepted_total": ("augury_spec_accepted_tokens", "Draft tokens the target accepted"),
            "spec_rounds_total": ("augury_spec_rounds", "Speculative verify rounds"),
            "preemptions": ("augury_preemptions", "Requests preempted for lack of KV blocks"),
        }
        for key, (name, doc) in counters.items():
            if key in st:
                yield CounterMetricFamily(name, doc, value=float(st[key]))


class ServerMetrics:
    def __init__(self, engine: Any) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("augury_requests", "HTTP requests", ["route", "status"], registry=r)
        self.prompt_tokens = Counter("augury_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.completion_tokens = Counter("augury_completion_tokens", "Completion tokens of finished requests", registry=r)
        self.cached_tokens = Counter("augury_cached_prompt_tokens", "Prompt tokens reused from the prefix cache", registry=r)
        self.ttft = Histogram("augury_time_to_first_token_seconds", "Arrival to first token", buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("augury_inter_token_latency_seconds", "Time between streamed tokens", buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("augury_request_latency_seconds", "Arrival to last token", buckets=_LATENCY_BUCKETS, registry=r)
        self.cancelled = Counter("augury_requests_cancelled", "Requests cancelled by a client disconnect", registry=r)
        r.register(_EngineCollector(engine))

    def render(self) -> bytes:
        return generate_latest(self.registry)
