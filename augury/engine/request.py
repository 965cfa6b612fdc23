"""A request as the scheduler and engine see it: counters and ids, no tensors."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from augury.engine.types import FinishReason, SamplingParams, TokenLogprob


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    # tokens of prompt+output whose KV is written and final
    num_computed: int = 0
    # prompt tokens served from the prefix cache at (the latest) admission
    num_cached: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    error: str | None = None
    # engine-side per-request state (generator, detokenizer, matcher, output sink)
    generator: Any = None
    detok: Any = None
    matcher: Any = None
    sink: Any = None
    logprobs: list[TokenLogprob] | None = None
    # speculative decoding: method name (None = off), proposed drafts for this step,
    # their probabilities (None for deterministic drafters), telemetry, acceptance EMA
    spec_method: str | None = None
    spec_max_draft: int = 0
    draft_ids: list[int] = field(default_factory=list)
    draft_probs: Any = None
    spec_stats: Any = None
    spec_alpha: float = 0.7  # acceptance of a later draft given the earlier ones passed (spec/coordinator.py)
    spec_alpha_first: float = 0.7  # acceptance of a round's first draft
    # KV codec: run key (requests of one codec attend together), block storage classes
    # (kv.block_manager.BlockClasses; None = the pool's first class), what usage reports
    kv_key: str = ""
    kv_classes: Any = None
    kv_info: dict | None = None
    # timings
    first_token_time: float | None = None
    admit_time: float | None = None
    # bookkeeping for streaming
    num_emitted_ids: int = 0
    aborted: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
