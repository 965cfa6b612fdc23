"""`augury fit`: how much memory a model needs at a context, batch, KV codec and weight mode,
and the longest context that fits a budget.

KV bytes come from `augury.kv.pool.bytes_per_token_per_layer`, the function the
engine's `plan_groups` uses to size its blocks, so `fit` and admission agree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from augury.config import ModelConfig
from augury.kv.codecs import KVCodec, parse_codec
from augury.kv.pool import bytes_per_token_per_layer

_DTYPE_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}


@dataclass
class FitReport:
    weights_bytes: int
    kv_bytes: int
    activation_bytes: int
    total_bytes: int
    kv_bytes_per_token: float  # all layers, one request, full-attention layers at this context
    max_context: int | None  # longest per-request context whose total fits `budget_bytes`
    budget_bytes: int | None
    codec: str
    weights: str

    def as_dict(self) -> dict:
        return asdict(self)


def weight_bytes(cfg: ModelConfig, weights: str = "native", dtype: torch.dtype = torch.bfloat16) -> int:
    """Parameters in storage: linears at the weight mode (int4 g32: fp16 scale+zero per 32), embeddings
    and norms in the compute dtype; a tied LM head is its own copy once quantized."""
    eb = _DTYPE_BYTES[dtype]
    h, D, H, Hkv = cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    per_layer_lin = (H + 2 * Hkv) * D * h + H * D * h + 3 * h * cfg.intermediate_size
    lin = cfg.num_layers * per_layer_lin
    head = cfg.vocab_size * h
    norms = cfg.num_layers * (2 * h + (H + Hkv) * D) + h
    per_w = {"native": eb, "int8": 1 + 4 / h, "int4": 0.5 + 4 / 32}[weights]  # int8: one fp32 scale per row
    embed = cfg.vocab_size * h * eb
    head_bytes = 0 if (cfg.tie_word_embeddings and weights == "native") else head * per_w
    return int(embed + lin * per_w + head_bytes + norms * eb)


def kv_bytes(cfg: ModelConfig, ctx: int, batch: int, codec: KVCodec, dtype: torch.dtype,
             block_size: int = 16, prefill_chunk: int = 512) -> int:
    """KV of `batch` requests of `ctx` tokens, whole blocks; sliding layers hold window + one chunk."""
    per = bytes_per_token_per_layer(cfg, dtype, codec)
    blocks = -(-ctx // block_size)
    total = 0
    for i in range(cfg.num_layers):
        if cfg.is_sliding(i) and cfg.sliding_window:
            held = min(blocks, -(-(cfg.sliding_window + prefill_chunk) // block_size) + 2)
        else:
            held = blocks
        total += held * block_size * per
    return total * batch


def activation_bytes(cfg: ModelConfig, batch: int, prefill_chunk: int, dtype: torch.dtype) -> int:
    """Peak per-step working set, roughly: a prefill chunk's hidden/MLP rows plus fp32 logits of
    the sampled rows, plus one layer's attention scores for the chunk (SDPA materializes them on CPU)."""
    eb = _DTYPE_BYTES[dtype]
    T = prefill_chunk
    rows = T * (4 * cfg.hidden_size + 3 * cfg.intermediate_size + (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim)
    logits = batch * cfg.vocab_size * 4
    return int(rows * eb + logits)


def fit(cfg: ModelConfig, ctx: int, batch: int = 1, codec: KVCodec | str = "native", weights: str = "native",
        dtype: torch.dtype = torch.bfloat16, budget_bytes: int | None = None, block_size: int = 16,
        prefill_chunk: int = 512) -> FitReport:
    c = parse_codec(codec) if isinstance(codec, str) else codec
    c.check_head_dim(cfg.head_dim)
    w = weight_bytes(cfg, weights, dtype)
    kv = kv_bytes(cfg, ctx, batch, c, dtype, block_size, prefill_chunk)
    act = activation_bytes(cfg, batch, min(prefill_chunk, ctx), dtype)
    max_ctx = None
    if budget_bytes is not None:
        lo, hi = 0, max(cfg.max_position_embeddings, ctx) * 64
        while lo < hi:  # KV is monotone in ctx: bisect the largest that fits
            mid = (lo + hi + 1) // 2
            need = w + kv_bytes(cfg, mid, batch, c, dtype, block_size, prefill_chunk) + act
            lo, hi = (mid, hi) if need <= budget_bytes else (lo, mid - 1)
        max_ctx = lo
    per_tok = kv_bytes(cfg, block_size * 1024, 1, c, dtype, block_size, prefill_chunk) / (block_size * 1024)
    return FitReport(w, kv, act, w + kv + act, per_tok, max_ctx, budget_bytes, c.id, weights)


def _gib(n: float) -> str:
    return f"{n / 1024**3:.3f} GiB" if n >= 1024**3 / 10 else f"{n / 1024**2:.1f} MiB"


def format_report(model: str, ctx: int, batch: int, r: FitReport) -> str:
    lines = [
        f"model {model}: context {ctx} x batch {batch}, KV codec {r.codec}, weights {r.weights}",
        f"  weights      {_gib(r.weights_bytes)}",
        f"  KV cache     {_gib(r.kv_bytes)}  ({r.kv_bytes_per_token / 1024:.1f} KiB/token at long context)",
        f"  activations  {_gib(r.activation_bytes)}",
        f"  total        {_gib(r.total_bytes)}",
    ]
    if r.budget_bytes is not None:
        lines.append(f"  budget {_gib(r.budget_bytes)}: longest context that fits at batch {batch}: {r.max_context}")
    return "\n".join(lines)
