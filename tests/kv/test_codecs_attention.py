"""Attention through encoded KV: equals native attention over the decoded cache,
rotated keys/values are transparent, the pool bills encoded bytes."""

from __future__ import annotations

import random

import pytest
import torch

from augury.config import ModelConfig
from augury.kv.block_manager import KVGroup
from augury.kv.codecs import EncodedStore, parse_codec
from augury.kv.pool import KVPool, bytes_per_token_per_layer, plan_groups
from augury.layers.attention import SeqSpec, build_attention_metadata, paged_attention

BS = 4
SCHEMES = ["affine8", "affine4", "affine4-rk", "turbo", "turbo:k4v3", "turbo:rk4v3", "turbo:ck4v3"]


def _specs(lens, num_blocks=64, seed=0):
    rng = random.Random(seed)
    free = list(range(num_blocks))
    rng.shuffle(free)
    out = []
    for nc, nn in lens:
        nb = -(-(nc + nn) // BS)
        out.append(SeqSpec(nc, nn, {"full": [free.pop() for _ in range(nb)]}))
    return out


def _fill(store_or_tensor, specs, kv_all, group="full"):
    """Write positions [0, num_cached) of every request (the 'cache')."""
    for s, x in zip(specs, kv_all):
        slots = torch.tensor([s.block_tables[group][p // BS] * BS + p % BS for p in range(s.num_cached)],
                             dtype=torch.long)
        if not len(slots):
            continue
        if isinstance(store_or_tensor, EncodedStore):
            store_or_tensor.write(slots, x[: s.num_cached])
        else:
            store_or_tensor[slots] = x[: s.num_cached]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("softcap", [None, 30.0])
def test_encoded_attention_equals_native_over_decoded_cache(scheme, softcap):
    torch.manual_seed(0)
    H, Hkv, D, nb = 4, 2, 64, 64
    lens = [(0, 5), (9, 1), (13, 3), (22, 1)]
    specs = _specs(lens, nb)
    meta = build_attention_metadata(specs, BS, {"full": None}, "cpu")
    g = meta.groups["full"]
    T = meta.num_tokens
    k_all = [torch.randn(nc + nn, Hkv, D) * 2 for nc, nn in lens]
    v_all = [torch.randn(nc + nn, Hkv, D) for nc, nn in lens]
    for k in k_all:
        k[..., 5] *= 15  # outlier channel
    q = torch.randn(T, H, D)
    k_new = torch.cat([k[nc:] for k, (nc, _) in zip(k_all, lens)])
    v_new = torch.cat([v[nc:] for v, (nc, _) in zip(v_all, lens)])

    codec = parse_codec(scheme)
    codec.bind(D)
    ks = EncodedStore(codec.key, nb * BS, Hkv, D, torch.float32, "cpu")
    vs = EncodedStore(codec.value, nb * BS, Hkv, D, torch.float32, "cpu")
    _fill(ks, specs, k_all)
    _fill(vs, specs, v_all)
    out = paged_attention(q, k_new, v_new, ks, vs, g, D ** -0.5, softcap)

    # reference: native attention over pools holding the decoded (un-rotated) cache
    kp = torch.full((nb * BS, Hkv, D), float("nan"))
    vp = torch.full((nb * BS, Hkv, D), float("nan"))
    slots = torch.arange(nb * BS)
    kp[:] = codec.key.decode_full([p[slots] for p in ks.parts], torch.float32)
    vp[:] = codec.value.decode_full([p[slots] for p in vs.parts], torch.float32)
    # the native op rewrites the new rows with raw K/V: give it the decoded ones instead
    k_dec = kp[g.slot_mapping].clone()
    v_dec = vp[g.slot_mapping].clone()
    ref = paged_attention(q, k_dec, v_dec, kp, vp, g, D ** -0.5, softcap)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)

    # and it is close to attention over the exact cache (quality sanity, loose)
    kx = torch.zeros(nb * BS, Hkv, D)
    vx = torch.zeros(nb * BS, Hkv, D)
    _fill(kx, specs, k_all)
    _fill(vx, specs, v_all)
    exact = paged_attention(q, k_new, v_new, kx, vx, g, D ** -0.5, softcap)
    rel = float((out - exact).norm() / exact.norm())
    assert rel < (0.5 if "k4" in scheme or scheme.startswith("affine4") else 0.25)


def test_pool_allocates_encoded_stores_and_bills_encoded_bytes():
    cfg = ModelConfig("llama", 100, 64, 128, 3, 4, 2, 64)
    bf = torch.bfloat16
    codec = parse_codec("turbo")
    native_per = bytes_per_token_per_layer(cfg, bf)
    enc_per = bytes_per_token_per_layer(cfg, bf, codec)
    assert native_per == 2 * 2 * 64 * 2
    # per kv head: k = 64 int8 codes + fp16 scale and zero per 32 (2*2*2 B); v = 24 B of 3-bit codes + 2 fp16 rms
    assert enc_per == 2 * (64 + 8) + 2 * (24 + 4)
    budget = 1 << 20
    g_nat = plan_groups(cfg, bf, budget, 16, 4, 64)
    g_enc = plan_groups(cfg, bf, budget, 16, 4, 64, codec)
    assert g_enc[0].num_blocks == budget // (16 * enc_per * 3)
    assert g_enc[0].num_blocks > 2.5 * g_nat[0].num_blocks
    pool = KVPool.allocate(cfg, g_enc, 16, bf, torch.device("cpu"), codec)
    assert all(isinstance(s, EncodedStore) for s in pool.k + pool.v)
    assert pool.nbytes() <= budget and pool.nbytes() == g_enc[0].num_blocks * 16 * enc_per * 3
    native = KVPool.allocate(cfg, g_nat, 16, bf, torch.device("cpu"), parse_codec("native"))
    assert all(isinstance(t, torch.Tensor) for t in native.k) and native.codec is None
