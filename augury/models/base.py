"""What every decoder family shares: the fused attention block, the model
shell (embed -> layers -> final norm, LM head), and weight loading from HF
parameter names into fused parameters.

The forward contract (the engine's ModelRunner calls exactly this):
    hidden = model(input_ids [T], positions [T], meta, kv) -> [T, hidden]   (final norm applied)
    logits = model.compute_logits(hidden_rows [N, hidden]) -> [N, vocab] float32
    ids = model.greedy_ids(hidden_rows [N, hidden]) -> [N] long   (argmax of those logits)
A CUDA-graph decode burst also passes `ropes=` (every step's rope rows, gathered once).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

import torch
from torch import nn

from augury.config import ModelConfig
from augury.cpu_kernels.argmax import argmax_last
from augury.layers import cpu_decode, fused_decode
from augury.layers.attention import AttentionMetadata, GroupAttnMeta, paged_attention
from augury.layers.embedding import ScaledEmbedding
from augury.layers.norm import RMSNorm
from augury.layers.rope import RotaryEmbedding, apply_rope


class KVPoolView(Protocol):
    """What the model reads from the engine's KV pool."""

    k: Sequence[torch.Tensor]  # per layer [num_slots, num_kv_heads, head_dim]
    v: Sequence[torch.Tensor]
    group_of_layer: Sequence[str]  # per layer "full" | "sliding"


class WeightLoadError(ValueError):
    """A checkpoint does not fit the model; the message names the tensor."""


@dataclass(frozen=True)
class WeightTarget:
    """Where one HF tensor lands: a parameter, or rows [start, stop) of a fused one."""

    param: torch.Tensor
    rows: tuple[int, int] | None = None
    broadcast: bool = False  # one [D] HF vector fills every row (per-head q/k norm weights)

    def assign(self, name: str, t: torch.Tensor) -> None:
        dst = self.param if self.rows is None else self.param[self.rows[0] : self.rows[1]]
        want = dst.shape[1:] if self.broadcast else dst.shape
        if tuple(t.shape) != tuple(want):
            raise WeightLoadError(f"{name}: checkpoint shape {tuple(t.shape)}, model expects {tuple(want)}")
        if not t.is_floating_point():
            raise WeightLoadError(f"{name}: expected a float tensor, got {t.dtype} (dequantize first)")
        with torch.no_grad():
            dst.copy_(t)


# checkpoints of multimodal wrappers (Gemma3ForConditionalGeneration, ...) nest the text model
_PREFIX_ALIASES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)


def _canonical_name(name: str) -> str:
    for old, new in _PREFIX_ALIASES:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


class AttentionBlock(nn.Module):
    """Fused-QKV self-attention over the paged KV pool.

    `qkv_proj` stacks [q; k; v] on the output dim. With q/k norm, one RMSNorm over
    [T, H+Hkv, D] carries q_norm's weight in its first H rows and k_norm's in the rest.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        layer: int,
        *,
        qkv_bias: bool,
        o_bias: bool,
        qk_norm: bool,
        gemma_norm: bool = False,
        softcap: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        H, Hkv, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = H, Hkv, D
        self.qkv_bias, self.o_bias = qkv_bias, o_bias
        self.qkv_proj = nn.Linear(cfg.hidden_size, (H + 2 * Hkv) * D, bias=qkv_bias, device=device, dtype=dtype)
        self.o_proj = nn.Linear(H * D, cfg.hidden_size, bias=o_bias, device=device, dtype=dtype)
        self.qk_norm = (
            RMSNorm((H + Hkv, D), cfg.rms_norm_eps, gemma_style=gemma_norm, device=device, dtype=dtype)
            if qk_norm
            else None
        )
        sliding = cfg.is_sliding(layer)
        self.window: int | None = cfg.sliding_window if sliding else None
        self.rope_name = "local" if sliding and cfg.rope_local is not None else "global"
        self.scale = cfg.attn_scale
        # attention logit softcapping (Gemma 2 style); none of today's families apply it —
        # HF Gemma 3 ignores `attn_logit_softcapping` — so families pass None
        self.softcap = softcap

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        gmeta: GroupAttnMeta,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
    ) -> torch.Tensor:
        """x [T, hidden] (already normed), rope = (cos, sin) [T, 1, D] -> [T, hidden]."""
        return self.o_proj(self.attend(self.qkv_proj(x), rope, gmeta, k_pool, v_pool))

    def attend(
        self,
        qkv: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        gmeta: GroupAttnMeta,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
    ) -> torch.Tensor:
        """The projected qkv [T, (H + 2 Hkv) D] -> attention output [T, H D], before o_proj
        (q/k norm, rope, the K/V write and attention: what sits between the two projections)."""
        T = qkv.shape[0]
        H, Hkv = self.num_heads, self.num_kv_heads
        qkv = qkv.view(T, H + 2 * Hkv, self.head_dim)
        qk = qkv[:, : H + Hkv]
        if self.qk_norm is not None:
            qk = self.qk_norm(qk)
        qk = apply_rope(qk, *rope)
        o = paged_attention(
            qk[:, :H], qk[:, H:], qkv[:, H + Hkv :], k_pool, v_pool, gmeta, self.scale, self.softcap
        )
        return o.reshape(T, H * self.head_dim)

    def weight_targets(self, prefix: str) -> dict[str, WeightTarget]:
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        spans = {"q_proj": (0, H * D), "k_proj": (H * D, (H + Hkv) * D), "v_proj": ((H + Hkv) * D, (H + 2 * Hkv) * D)}
        out = {}
        for name, rows in spans.items():
            out[f"{prefix}{name}.weight"] = WeightTarget(self.qkv_proj.weight, rows)
            if self.qkv_bias:
                out[f"{prefix}{name}.bias"] = WeightTarget(self.qkv_proj.bias, rows)
        out[f"{prefix}o_proj.weight"] = WeightTarget(self.o_proj.weight)
        if self.o_bias:
            out[f"{prefix}o_proj.bias"] = WeightTarget(self.o_proj.bias)
        if self.qk_norm is not None:
            out[f"{prefix}q_norm.weight"] = WeightTarget(self.qk_norm.weight, (0, H), broadcast=True)
            out[f"{prefix}k_norm.weight"] = WeightTarget(self.qk_norm.weight, (H, H + Hkv), broadcast=True)
        return out


def mlp_targets(mlp: nn.Module, prefix: str) -> dict[str, WeightTarget]:
    """HF gate_proj/up_proj/down_proj -> GatedMLP's fused gate_up_proj and down_proj."""
    inter = mlp.intermediate_size
    out = {
        f"{prefix}gate_proj.weight": WeightTarget(mlp.gate_up_proj.weight, (0, inter)),
        f"{prefix}up_proj.weight": WeightTarget(mlp.gate_up_proj.weight, (inter, 2 * inter)),
        f"{prefix}down_proj.weight": WeightTarget(mlp.down_proj.weight),
    }
    if mlp.down_proj.bias is not None:
        out[f"{prefix}gate_proj.bias"] = WeightTarget(mlp.gate_up_proj.bias, (0, inter))
        out[f"{prefix}up_proj.bias"] = WeightTarget(mlp.gate_up_proj.bias, (inter, 2 * inter))
        out[f"{prefix}down_proj.bias"] = WeightTarget(mlp.down_proj.bias)
    return out


class CausalLM(nn.Module):
    """Model shell shared by every family; subclasses supply `make_layer`.

    A layer is called as `layer(h [T, hidden], rope, gmeta, k_pool, v_pool) -> [T, hidden]`,
    exposes `self_attn` (an AttentionBlock) and `weight_targets(prefix)`.
    """

    gemma_norms = False  # RMSNorm flavour of the final norm (layers choose their own)

    def __init__(
        self, cfg: ModelConfig, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = ScaledEmbedding(
            cfg.vocab_size, cfg.hidden_size, self.embed_scale(), device=device, dtype=dtype
        )
        self.layers = nn.ModuleList(self.make_layer(i, device, dtype) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, gemma_style=self.gemma_norms, device=device, dtype=dtype)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device=device, dtype=dtype)
        self.ropes = nn.ModuleDict()
        if cfg.tie_word_embeddings:
            self.tie_weights()

    # -- family hooks -------------------------------------------------------------------
    def make_layer(self, layer: int, device, dtype) -> nn.Module:
        raise NotImplementedError

    def embed_scale(self) -> float | None:
        return None

    # -- setup --------------------------------------------------------------------------
    def tie_weights(self) -> None:
        self.lm_head.weight = self.embed_tokens.weight

    def init_rope(self, max_positions: int | None = None) -> None:
        """(Re)build the cos/sin caches on the model's device, in its dtype."""
        cfg = self.cfg
        n = max_positions or cfg.max_position_embeddings
        w = self.embed_tokens.weight
        self.ropes["global"] = RotaryEmbedding(cfg.rope, cfg.head_dim, n, device=w.device, dtype=w.dtype)
        if cfg.rope_local is not None and any(l.self_attn.rope_name == "local" for l in self.layers):
            self.ropes["local"] = RotaryEmbedding(cfg.rope_local, cfg.head_dim, n, device=w.device, dtype=w.dtype)

    def kv_group_windows(self) -> dict[str, int | None]:
        """Group name -> window, for `build_attention_metadata(windows=...)`."""
        out: dict[str, int | None] = {}
        for layer in self.layers:
            w = layer.self_attn.window
            out["sliding" if w is not None else "full"] = w
        return out

    def kv_group_of_layer(self) -> list[str]:
        """Per layer, the KV group whose block table it reads ("full" | "sliding")."""
        return ["sliding" if l.self_attn.window is not None else "full" for l in self.layers]

    # -- forward ------------------------------------------------------------------------
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, kv: KVPoolView,
        ropes: dict | None = None,
    ) -> torch.Tensor:
        """input_ids, positions [T] -> final-normed hidden [T, hidden]. ropes: this step's rope rows
        ({name: (cos, sin) [T, 1, D]}, as the `ropes` modules give them for `positions`) when the
        caller already has them (a decode burst gathers every step's rows at once)."""
        if ropes is None:
            ropes = {name: r(positions) for name, r in self.ropes.items()}  # once per step, shared by layers
        return fused_decode.final_norm(self.norm, self.run_layers(self.embed_tokens(input_ids), ropes, meta, kv,
                                                                  len(self.layers)))

    def run_layers(self, h: torch.Tensor, ropes: dict, meta: AttentionMetadata, kv: KVPoolView, n: int) -> torch.Tensor:
        """The first n layers on h [T, hidden]. A few-row eager CPU step whose layers all take the
        native layer call runs them straight from cpu_decode.run_stack (the same calls, without the
        per-layer module call and checks); anything else goes through the modules."""
        fast = cpu_decode.run_stack(self, h, ropes, meta, kv, n)
        if fast is not None:
            return fast
        for i in range(n):
            layer = self.layers[i]
            gmeta = meta.groups[kv.group_of_layer[i]]
            if gmeta.window != layer.self_attn.window:
                raise ValueError(
                    f"layer {i} needs window {layer.self_attn.window}, its KV group "
                    f"{kv.group_of_layer[i]!r} was built with window {gmeta.window}"
                )
            h = layer(h, ropes[layer.self_attn.rope_name], gmeta, kv.k[i], kv.v[i])
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab] float32 (final softcapping applied here)."""
        return self._head(hidden).float()

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits in the head's own dtype: compute_logits before its float32 copy."""
        logits = fused_decode.head(self.lm_head, hidden)
        cap = self.cfg.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def greedy_ids(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [N, hidden] -> [N] long: compute_logits(hidden).argmax(-1) exactly (ties -> lowest id),
        written into `out` when given. On the GPU one launch reads the logits in their own dtype
        (`layers/triton_argmax.py`; widening to float32 is exact and keeps the order), instead of a
        float32 copy, torch's one-block reduction and a copy into `out`."""
        logits = self._head(hidden)
        if logits.device.type == "cuda" and _argmax_kernel_ok():
            from augury.layers.triton_argmax import argmax_rows, supported

            if supported(logits):
                return argmax_rows(logits, out)
        ids = argmax_last(logits.float())  # CPU: the native kernel (cpu_kernels/argmax.cpp)
        return ids if out is None else out.copy_(ids)

    # -- weights ------------------------------------------------------------------------
    def weight_targets(self) -> dict[str, WeightTarget]:
        out = {
            "model.embed_tokens.weight": WeightTarget(self.embed_tokens.weight),
            "model.norm.weight": WeightTarget(self.norm.weight),
            "lm_head.weight": WeightTarget(self.lm_head.weight),
        }
        for i, layer in enumerate(self.layers):
            out.update(layer.weight_targets(f"model.layers.{i}."))
        return out

    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """HF-named tensors (any float dtype) -> fused parameters. Unknown names are ignored."""
        targets = self.weight_targets()
        seen: set[str] = set()
        for raw, t in tensors:
            name = _canonical_name(raw)
            target = targets.get(name)
            if target is None:
                continue
            target.assign(name, t)
            seen.add(name)
        optional = {"lm_head.weight"} if self.cfg.tie_word_embeddings else set()
        missing = sorted(set(targets) - seen - optional)
        if missing:
            more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
            raise WeightLoadError(f"checkpoint lacks {len(missing)} required tensors: {', '.join(missing[:5])}{more}")

    def randomize_weights(self, seed: int = 0, std: float = 0.02) -> None:
        """Random weights of the right shape (throughput benchmarks), identity norms."""
        dev = self.embed_tokens.weight.device
        g = torch.Generator(device=dev).manual_seed(seed)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, RMSNorm):
                    m.reset_weight()
                elif isinstance(m, (nn.Linear, ScaledEmbedding)):
                    w = torch.randn(m.weight.shape, generator=g, device=dev, dtype=torch.float32)
                    m.weight.copy_(w * std)
                    if getattr(m, "bias", None) is not None:
                        m.bias.zero_()


@functools.cache
def _argmax_kernel_ok() -> bool:
    """Whether the Triton argmax (`layers/triton_argmax.py`) imports; AUGURY_TRITON_ARGMAX=0 keeps
    torch's argmax (A/B measurements)."""
    if os.environ.get("AUGURY_TRITON_ARGMAX", "1") == "0":
        return False
    try:
        import augury.layers.triton_argmax  # noqa: F401
    except ImportError:
        return False
    return True
