"""quantize_model (which modules get swapped, tied embeddings), GGUF Q4_0/Q4_1 -> exact int4,
and a model-level check that quantized logits stay close to the float model's."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from augury.layers.quant_linear import Int4Linear, Int8Linear
from augury.weights.quantize import (
    int4_linear_from_gguf,
    int4_parts_from_gguf,
    quantize_model,
    quantized_linears,
)


class _Tiny(nn.Module):
    """Embedding + two blocks of projections + a LM head tied to the embedding."""

    def __init__(self, tie: bool = True) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(64, 32)
        self.layers = nn.ModuleList(
            nn.ModuleDict({"qkv_proj": nn.Linear(32, 96), "o_proj": nn.Linear(32, 32, bias=False)}) for _ in range(2)
        )
        self.norm = nn.LayerNorm(32)
        self.lm_head = nn.Linear(32, 64, bias=False)
        if tie:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(ids)
        for layer in self.layers:
            h = h + layer["o_proj"](layer["qkv_proj"](h)[..., :32])
        return self.lm_head(self.norm(h))


def _linear_names(model: nn.Module) -> set[str]:
    return {n for n, m in model.named_modules() if type(m) is nn.Linear}


@pytest.mark.parametrize("mode,cls", [("int8", Int8Linear), ("int4", Int4Linear)])
def test_replaces_exactly_the_linears(mode, cls):
    model = _Tiny()
    names = _linear_names(model)
    emb = model.embed_tokens.weight
    emb_before = emb.detach().clone()
    quantize_model(model, mode)
    q = quantized_linears(model)
    assert set(q) == names and all(type(m) is cls for m in q.values())
    assert not _linear_names(model)
    # the embedding keeps its own float parameter, untouched
    assert model.embed_tokens.weight is emb and isinstance(emb, nn.Parameter)
    assert torch.equal(emb, emb_before)
    assert isinstance(model.norm, nn.LayerNorm)
    assert model(torch.tensor([1, 2, 3])).shape == (3, 64)


def test_lm_head_can_stay_float():
    model = _Tiny()
    quantize_model(model, "int4", include_lm_head=False)
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight is model.embed_tokens.weight
    assert set(quantized_linears(model)) == _linear_names(_Tiny()) - {"lm_head"}


def test_native_is_a_no_op_and_bad_modes_fail():
    model = _Tiny()
    assert quantize_model(model, "native") is model and not quantized_linears(model)
    with pytest.raises(ValueError, match="weights must be one of"):
        quantize_model(model, "int3")
    with pytest.raises(ValueError, match="group size"):
        quantize_model(model, "int4", group_size=16)


def test_quantized_model_output_tracks_float():
    torch.manual_seed(0)
    model = _Tiny(tie=False)
    ids = torch.arange(10)
    ref = model(ids)
    for mode, rel in (("int8", 0.02), ("int4", 0.2)):
        q = quantize_model(_copy(model), mode)
        err = (q(ids) - ref).abs().max() / ref.abs().max()
        assert err < rel, (mode, err.item())


def _copy(model: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(model)


# ---------------------------------------------------------------------------- GGUF 4-bit blocks


def _gguf_blocks(qtype_name: str, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random weights quantized by the reference `gguf` package -> (raw blocks, their dequantization)."""
    from gguf import GGMLQuantizationType, quants

    qtype = GGMLQuantizationType[qtype_name]
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * 0.05 + rng.standard_normal((n, 1)) * 0.02).astype(np.float32)
    raw = quants.quantize(w, qtype)
    return raw, quants.dequantize(raw, qtype).reshape(n, k)


@pytest.mark.parametrize("qtype", ["Q4_1", "Q4_0"])
def test_gguf_blocks_decode_exactly(qtype):
    raw, ref = _gguf_blocks(qtype, 48, 96)
    parts = int4_parts_from_gguf(raw, qtype, (48, 96))
    assert parts.group_size == 32 and parts.q.shape == (48, 96)
    torch.testing.assert_close(parts.dequantize(), torch.from_numpy(ref), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("qtype", ["Q4_1", "Q4_0"])
def test_gguf_int4_linear_fp32_is_exact(qtype):
    raw, ref = _gguf_blocks(qtype, 64, 128, seed=1)
    m = int4_linear_from_gguf(raw, qtype, (64, 128), act_dtype=torch.float32)
    w = torch.from_numpy(ref)
    torch.testing.assert_close(m.dequantize(), w, rtol=1e-6, atol=1e-7)
    x = torch.randn(3, 128)
    torch.testing.assert_close(m(x), x @ w.T, rtol=1e-5, atol=1e-5)


def test_gguf_int4_linear_bf16_is_close():
    raw, ref = _gguf_blocks("Q4_1", 64, 128, seed=2)
    m = int4_linear_from_gguf(raw, "Q4_1", (64, 128))
    w = torch.from_numpy(ref)
    # only d and m + 8d are rounded to bf16: far below one quantization step
    step = (w.amax() - w.amin()) / 15
    assert (m.dequantize() - w).abs().max() < 0.1 * step
    x = torch.randn(2, 128, dtype=torch.bfloat16)
    y = m(x).double()
    ref_y = x.double() @ m.dequantize().double().T
    assert (y - ref_y).abs().max() <= 1e-2 * ref_y.abs().max()


def test_gguf_bad_inputs():
    raw, _ = _gguf_blocks("Q4_1", 16, 64)
    with pytest.raises(ValueError, match="Q4_0 or Q4_1"):
        int4_parts_from_gguf(raw, "Q8_0", (16, 64))
    with pytest.raises(ValueError, match="multiple of 32"):
        int4_parts_from_gguf(raw, "Q4_1", (16, 48))


@pytest.mark.real
def test_smollm2_q4_1_tensors_are_reproduced(smollm2_gguf):
    from gguf import GGUFReader, quants

    reader = GGUFReader(str(smollm2_gguf))
    names = {"blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.29.ffn_gate.weight"}
    for t in reader.tensors:
        if t.name not in names:
            continue
        assert t.tensor_type.name == "Q4_1"
        k, n = (int(d) for d in t.shape)  # GGUF lists dims innermost first
        ref = torch.from_numpy(quants.dequantize(t.data, t.tensor_type).reshape(n, k))
        m = int4_linear_from_gguf(t.data, "Q4_1", (n, k), act_dtype=torch.float32)
        torch.testing.assert_close(m.dequantize(), ref, rtol=1e-6, atol=1e-7)
        names.discard(t.name)
    assert not names, f"tensors not found: {names}"


# ---------------------------------------------------------------------------- a real (tiny) model


def _oracle_helpers():
    pytest.importorskip("transformers")
    pytest.importorskip("augury.models.registry")
    sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
    import oracle_helpers

    return oracle_helpers


@pytest.mark.slow
@pytest.mark.parametrize("mode,max_rel,max_kl", [("int8", 0.02, 1e-3), ("int4", 0.2, 1e-2)])
def test_tiny_llama_logits_stay_close(tmp_path, mode, max_rel, max_kl):
    oh = _oracle_helpers()
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=True,
    )
    _, model, _ = oh.hf_and_augury(cfg, tmp_path)
    ids = oh.prompt(24, cfg.vocab_size, 7)
    (ref,) = oh.Driver(model).step([("a", ids)])
    emb = model.embed_tokens.weight.detach().clone()
    quantize_model(model, mode)
    assert type(model.lm_head) is not nn.Linear and torch.equal(model.embed_tokens.weight, emb)
    (got,) = oh.Driver(model).step([("a", ids)])
    got = got.float()
    # these random logits are near one-hot; KL at temperature std(logits) still sees the tails
    t = ref.std()
    logp, logq = (ref / t).log_softmax(-1), (got / t).log_softmax(-1)
    kl = (logp.exp() * (logp - logq)).sum(-1).mean().item()
    rel = ((got - ref).pow(2).mean().sqrt() / ref.std()).item()
    agree = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    print(f"{mode}: logit rel RMSE {rel:.3f}, mean KL@T {kl:.2e}, greedy agreement {agree:.2f}")
    assert rel < max_rel and kl < max_kl
    assert agree >= 0.9
