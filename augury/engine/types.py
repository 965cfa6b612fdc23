"""Plain data passed between the front ends (CLI, server) and the engine.

Nothing here holds tensors: these cross threads and end up in JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass
class SamplingParams:
    """Per-request decoding parameters. temperature == 0 means greedy."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # HF/CTRL style, over prompt + output tokens
    presence_penalty: float = 0.0  # OpenAI style, over output tokens
    frequency_penalty: float = 0.0  # OpenAI style, over output tokens
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0  # 0..20
    skip_special_tokens: bool = True
    # constrained output, compiled by augury.structured into a per-request matcher:
    # {"type": "json_object"} | {"type": "json_schema", "schema": {...}} |
    # {"type": "regex", "pattern": "..."} | {"type": "ebnf", "grammar": "..."}
    structured: dict | None = None
    # speculative decoding for this request: None = the engine default, False = off,
    # {"method": "ngram" | "draft-model" | "layerskip", "num_draft_tokens": N}
    speculative: dict | bool | None = None
    # KV cache codec for this request: None = the server's; {"codec": "native"|"affine"|"turbo",
    # "key_bits", "value_bits", "group_size", "start", "rotate_keys"}
    kv_cache: dict | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self) -> None:
        """Raise ValueError naming the field; the server maps it to a 400."""
        if self.max_tokens < 1:
            raise ValueError("max_tokens: must be >= 1")
        if self.temperature < 0:
            raise ValueError("temperature: must be >= 0")
        if self.top_k < 0:
            raise ValueError("top_k: must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p: must be in (0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError("min_p: must be in [0, 1]")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty: must be > 0")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError("presence_penalty: must be in [-2, 2]")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError("frequency_penalty: must be in [-2, 2]")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError("top_logprobs: must be in [0, 20]")


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # (token_id, logprob), best first


@dataclass
class RequestOutput:
    """One streamed delta for a request (or the final summary when finished)."""

    request_id: str
    text: str  # new text since the previous delta (stop strings never leak)
    token_ids: list[int]  # new token ids since the previous delta
    logprobs: list[TokenLogprob] | None = None
    finished: bool = False
    finish_reason: FinishReason | None = None
    # totals, filled on every delta
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    # usage.speculation (final delta only, when speculation ran) and features dropped
    speculation: dict | None = None
    # usage.kv_cache (final delta only): the codec, its start, the native/encoded boundary the
    # request reached (tokens), and what sliding-window layers stored
    kv_cache: dict | None = None
    warnings: list[str] | None = None
    # timings (seconds, monotonic), filled on the final delta
    ttft_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None


@dataclass
class GenerationResult:
    """What `Engine.generate` returns: the whole completion."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    speculation: dict | None = None
    ttft_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    kv_cache: dict | None = None
