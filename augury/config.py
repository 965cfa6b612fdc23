"""Typed, validated configuration. Every knob the engine reads lives here.

`ModelConfig` is the normalized architecture description built from an HF
`config.json` dict (or from GGUF metadata mapped to the same dict); models
read only this, never the raw dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
SPEC_METHODS = ("off", "ngram", "draft-model", "layerskip")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the fix."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    # "default" | "linear" | "llama3" | "dynamic" (treated as default at <= original ctx)
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    # gemma3: rope for sliding layers (rope_local_base_freq)
    rope_local: RopeConfig | None = None
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    qk_norm: bool = False
    # per layer: "full_attention" | "sliding_attention"
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    query_pre_attn_scalar: float | None = None
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None

    @property
    def attn_scale(self) -> float:
        if self.query_pre_attn_scalar is not None:
            return float(self.query_pre_attn_scalar) ** -0.5
        return self.head_dim ** -0.5

    def is_sliding(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == "sliding_attention"

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        d = dict(d)
        if "text_config" in d and d.get("model_type") in ("gemma3",):
            d = {**d["text_config"], "model_type": "gemma3_text"}
        mt = d.get("model_type")
        if mt == "gemma3":
            mt = "gemma3_text"
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"unsupported architecture {mt!r}; supported model types: "
                + ", ".join(SUPPORTED_MODEL_TYPES)
            )
        nh = int(d["num_attention_heads"])
        hs = int(d["hidden_size"])
        nl = int(d["num_hidden_layers"])
        head_dim = d.get("head_dim") or hs // nh
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())

        rope, rope_local = _parse_rope(d, mt)
        layer_types: tuple[str, ...] = ()
        sliding = d.get("sliding_window")
        if mt == "gemma3_text":
            lt = d.get("layer_types")
            if not lt:
                pattern = int(d.get("sliding_window_pattern", d.get("_sliding_window_pattern", 6)))
                lt = [
                    "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                    for i in range(nl)
                ]
            layer_types = tuple(lt)
        elif sliding and d.get("use_sliding_window", mt == "mistral"):
            layer_types = tuple(d.get("layer_types") or ["sliding_attention"] * nl)
        else:
            sliding = None
        if layer_types and "sliding_attention" not in layer_types:
            sliding = None

        act = d.get("hidden_activation") or d.get("hidden_act") or "silu"
        if mt == "gemma3_text" and act == "gelu":
            act = "gelu_pytorch_tanh"
        cfg = cls(
            model_type="llama" if mt == "mistral" else mt,
            vocab_size=int(d["vocab_size"]),
            hidden_size=hs,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=nl,
            num_heads=nh,
            num_kv_heads=int(d.get("num_key_value_heads") or nh),
            head_dim=int(head_dim),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope=rope,
            rope_local=rope_local,
            max_position_embeddings=int(d.get("max_position_embeddings", 8192)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", mt == "gemma3_text")),
            attention_bias=bool(d.get("attention_bias", mt == "qwen2")),
            mlp_bias=bool(d.get("mlp_bias", False)),
            hidden_act=act,
            qk_norm=mt in ("qwen3", "gemma3_text"),
            layer_types=layer_types,
            sliding_window=int(sliding) if sliding else None,
            query_pre_attn_scalar=d.get("query_pre_attn_scalar") if mt == "gemma3_text" else None,
            final_logit_softcapping=d.get("final_logit_softcapping"),
            attn_logit_softcapping=d.get("attn_logit_softcapping"),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            pad_token_id=d.get("pad_token_id"),
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ConfigError("layer_types must list one entry per layer")


def _rope_from(params: dict[str, Any] | None, theta_default: float) -> RopeConfig:
    params = params or {}
    rt = params.get("rope_type") or params.get("type") or "default"
    return RopeConfig(
        theta=float(params.get("rope_theta", theta_default)),
        rope_type=str(rt),
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
    )


def _parse_rope(d: dict[str, Any], mt: str) -> tuple[RopeConfig, RopeConfig | None]:
    """Both transformers 4.x (`rope_theta` + `rope_scaling`) and 5.x (`rope_parameters`)."""
    rp = d.get("rope_parameters")
    theta = float(d.get("rope_theta", 10000.0 if mt != "gemma3_text" else 1_000_000.0))
    if isinstance(rp, dict) and ("full_attention" in rp or "sliding_attention" in rp):
        full = _rope_from(rp.get("full_attention"), theta)
        local = _rope_from(rp.get("sliding_attention"), float(d.get("rope_local_base_freq", 10000.0)))
        return full, local if mt == "gemma3_text" else None
    if isinstance(rp, dict):
        rope = _rope_from(rp, theta)
    else:
        rope = _rope_from(d.get("rope_scaling"), theta)
        rope = RopeConfig(**{**rope.__dict__, "theta": theta})
    local = None
    if mt == "gemma3_text":
        local = RopeConfig(theta=float(d.get("rope_local_base_freq", 10000.0)))
    return rope, local


@dataclass
class EngineConfig:
    """What `augury generate|serve` and `Engine.from_model` take."""

    model: str = "smollm2"
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    weights: str = "native"  # native | int8 | int4
    kv_budget: str | None = None  # bytes ("2GiB") or a fraction of free memory ("0.3")
    block_size: int = 16
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None  # default: the model's context window
    max_queue: int = 256
    enable_prefix_caching: bool = True
    threads: int | None = None  # torch intra-op threads on CPU
    compile: bool = False  # torch.compile the model forward (dynamic shapes; slow first start)
    cuda_graphs: bool = True  # replay captured decode steps on CUDA
    # greedy decode steps per burst when every running request is plain greedy (engine/burst.py):
    # None = auto (8 on a CUDA-graph engine, off elsewhere), 0 or 1 = off
    decode_burst: int | None = None
    # launch the next burst before waiting for the one in flight (pipelined bursts; engine/burst.py):
    # None = auto (on CUDA, where launches are asynchronous; elsewhere a chained burst would only run
    # before the previous one's tokens go out); AUGURY_BURST_PIPELINE=0 turns it off too (A/B)
    burst_pipeline: bool | None = None
    seed: int | None = None  # base seed for requests without one
    progress: bool = True
    # speculative decoding defaults (a request may override or turn it off)
    spec: str = "off"  # off | ngram | draft-model | layerskip
    draft_model: str | None = None  # path/name of the draft model (draft-model method)
    draft_weights: str = "native"  # weight quantization of the draft model
    num_draft_tokens: int = 10  # most drafts per round; the adaptive policy may use fewer
    spec_layers: int | None = None  # layerskip: layers of the target used as drafter
    spec_adaptive: bool = True
    ngram_min: int = 1
    ngram_max: int = 4
    # KV cache codec (mlx-lm's flag names): --kv-bits N = affine intN; --kv-quant turbo[:k8v3] wins
    kv_bits: int | None = None
    kv_group_size: int | None = None  # default 64 (affine), 32 (turbo keys)
    quantized_kv_start: int = 0  # tokens kept native before encoding starts
    kv_quant: str | None = None  # native | affine8 | affine4 | turbo[:k8v3|k4v3|rk4v3...]
    # more codecs a request's `kv_cache` may ask for (comma list, e.g. "native,turbo:k4v3"), and
    # the fraction of the KV budget they share (the default codec keeps the rest)
    kv_extra_codecs: str | None = None
    kv_extra_share: float = 0.25

    def kv_codec(self):
        """The server's default KV codec (augury.kv.codecs.KVCodec)."""
        from augury.kv.codecs import codec_from_flags

        return codec_from_flags(self.kv_bits, self.kv_group_size, self.kv_quant, self.quantized_kv_start)

    # prefix cache: RAM budget for finished requests' blocks, SSD tier (off without a dir)
    prompt_cache_bytes: str | int | None = None  # None: bounded by the KV pool only
    ssd_cache_dir: str | None = None
    ssd_cache_bytes: str | int = "16GiB"
    ssd_persist_before_evict: bool = True

    def validate(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"--dtype {self.dtype!r}: choose float32, bfloat16 or float16")
        if self.weights not in ("native", "int8", "int4"):
            raise ConfigError(f"--weights {self.weights!r}: choose native, int8 or int4")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ConfigError("--block-size must be a power of two")
        if self.max_num_seqs < 1:
            raise ConfigError("--max-batch must be >= 1")
        if self.max_num_batched_tokens < 16:
            raise ConfigError("--max-batched-tokens must be >= 16")
        if self.max_queue < 1:
            raise ConfigError("--max-queue must be >= 1")
        if self.spec not in SPEC_METHODS:
            raise ConfigError(f"--spec {self.spec!r}: choose one of {', '.join(SPEC_METHODS)}")
        if self.spec == "draft-model" and not self.draft_model:
            raise ConfigError("--spec draft-model needs --draft-model PATH")
        if not 1 <= self.num_draft_tokens <= 16:
            raise ConfigError("--num-draft-tokens must be in 1..16")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigError("ngram sizes need 1 <= min <= max")
        from augury.kv.codecs import CodecError

        try:
            self.kv_codec()
        except CodecError as e:
            raise ConfigError(str(e)) from None
        if not 0.0 < self.kv_extra_share < 1.0:
            raise ConfigError("--kv-extra-share must be between 0 and 1 (the fraction of the KV budget "
                              "for the codecs other than the default)")
        if self.kv_extra_codecs:
            from augury.kv.codecs import parse_codec

            for spec in self.kv_extra_codecs.split(","):
                try:
                    parse_codec(spec, self.kv_group_size)
                except CodecError as e:
                    raise ConfigError(f"--kv-extra-codecs: {e}") from None
        for flag, val in (("--prompt-cache-bytes", self.prompt_cache_bytes), ("--ssd-cache-bytes", self.ssd_cache_bytes)):
            if val is None or isinstance(val, int):
                continue
            from augury.kv.pool import parse_bytes

            try:
                parse_bytes(str(val))
            except ValueError:
                raise ConfigError(f"{flag} {val!r}: give bytes like 2GiB or 512MB") from None
