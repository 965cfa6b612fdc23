"""The one-row fused GEMV equals its unfused ops; a fused Llama layer equals the module's own forward.

Runs under TRITON_INTERPRET=1 on the CPU (small shapes: the interpreter is slow); on a CUDA
machine the same checks run compiled, plus the 8B shapes and a captured CUDA graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.triton_env import interpreter, rerun_in_fresh_process  # noqa: E402

CPU, FRESH = interpreter()

from augury.layers import fused_decode  # noqa: E402
from augury.layers.norm import RMSNorm  # noqa: E402
import triton.language as tl  # noqa: E402
from augury.layers.triton_gemv import GemvConfig, _rnd, gemv, norm_block, qkv_rope_kv, supported  # noqa: E402

here = pytest.mark.skipif(not FRESH, reason="triton was imported before the interpreter was on: test_in_fresh_process runs these")
cuda_only = pytest.mark.skipif(CPU, reason="needs a CUDA device")
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SMALL = GemvConfig(block_n=4, block_k=32)


def _rand(*shape, seed=0, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(DEV, dtype)


def _close(y, ref, dtype):
    """fp32: tight; half types: within two roundings at the output's scale (both sides round the
    product and then the residual sum, in different fp32 orders)."""
    y, ref = y.float(), ref.float()
    if dtype == torch.float32:
        torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(y, ref, atol=2 ** -6 * ref.abs().max().item(), rtol=0)


@here
@pytest.mark.parametrize("k", [64, 100])  # whole tiles, and a ragged last tile
@pytest.mark.parametrize("n", [8, 13])  # whole row blocks, and masked rows
def test_plain_product(n, k):
    x, w = _rand(1, k, seed=1), _rand(n, k, seed=2)
    assert supported(x, w)
    y = gemv(x, w, cfg=SMALL)
    assert y.shape == (1, n) and y.dtype == x.dtype
    _close(y, F.linear(x, w), x.dtype)


@here
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k,want", [
    (12, 4100, GemvConfig(16, 1024, 8)),  # K >= 2N (down): masked rows, a ragged last tile
    (2200, 2200, GemvConfig(8, 2048, 8)),  # N <= K < 2N (o_proj): a tile wider than K's remainder
    (2300, 2100, GemvConfig(8, 512, 4)),  # K < N <= 2K (qkv)
    (100, 40, GemvConfig(8, 64, 4)),  # a small layer: the generic default
])
def test_each_shape_default_runs(n, k, want, dtype):
    """`default_config`'s shape classes, each run at the launch parameters the model gets."""
    from augury.layers.triton_gemv import default_config

    assert default_config(n, k) == want
    rows = slice(0, n) if n < 64 else slice(0, n, 97)  # (the interpreter is slow: check some rows)
    x, w, r = _rand(1, k, seed=50, dtype=dtype), _rand(n, k, seed=51, dtype=dtype), _rand(1, n, seed=52, dtype=dtype)
    _close(gemv(x, w, residual=r)[:, rows], (r + F.linear(x, w))[:, rows], dtype)


@here
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_prologue_and_residual_epilogue_follow_the_unfused_ops(dtype):
    k, n = 96, 20
    x, w, r = _rand(1, k, seed=3, dtype=dtype, scale=3.0), _rand(n, k, seed=4, dtype=dtype), _rand(1, n, seed=5, dtype=dtype)
    norm = RMSNorm(k, 1e-5, device=DEV, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(_rand(k, seed=6, dtype=dtype))
    y = gemv(x, w, norm_weight=norm.weight, eps=1e-5, residual=r, cfg=SMALL)
    ref = r + F.linear(norm(x), w)
    _close(y, ref, dtype)


@here
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k", [96, 5000])  # one tile, and two with a ragged last one
def test_final_norm_kernel_follows_the_module(dtype, k):
    from augury.layers.triton_gemv import rms_norm_row

    x = _rand(1, k, seed=7, dtype=dtype, scale=3.0)
    norm = RMSNorm(k, 1e-5, device=DEV, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(_rand(k, seed=8, dtype=dtype))
    y = rms_norm_row(x, norm.weight, norm.eps)
    assert y.shape == x.shape and y.dtype == dtype
    _close(y, norm(x), dtype)
    with pytest.raises(ValueError, match="rms_norm_row"):
        rms_norm_row(x.expand(2, k), norm.weight, norm.eps)


@here
def test_final_norm_takes_the_kernel_for_one_row_only(monkeypatch):
    from augury.layers import triton_gemv

    calls = []
    real = triton_gemv.rms_norm_row
    monkeypatch.setattr(triton_gemv, "rms_norm_row", lambda *a, **k: calls.append(1) or real(*a, **k))
    norm = RMSNorm(64, 1e-6, device=DEV)
    gemma = RMSNorm(64, 1e-6, gemma_style=True, device=DEV)
    one, two = _rand(1, 64, seed=9), _rand(2, 64, seed=10)
    monkeypatch.setattr(fused_decode, "FORCE", True)
    _close(fused_decode.final_norm(norm, one), norm(one), torch.float32)
    assert calls == [1]
    for n, h in ((norm, two), (gemma, one)):  # several rows, a Gemma-style norm: the module
        assert torch.equal(fused_decode.final_norm(n, h), n(h))
    monkeypatch.setattr(fused_decode, "FORCE", False)
    assert torch.equal(fused_decode.final_norm(norm, one), norm(one))
    assert calls == [1]


@here
def test_lm_head_takes_the_gemv_for_one_row_only(monkeypatch):
    from augury.layers import triton_gemv

    calls = []
    real = triton_gemv.gemv
    monkeypatch.setattr(triton_gemv, "gemv", lambda *a, **k: calls.append(1) or real(*a, **k))
    lin = torch.nn.Linear(64, 40, bias=False, device=DEV)
    with torch.no_grad():
        lin.weight.copy_(_rand(40, 64, seed=11))
    biased = torch.nn.Linear(64, 40, bias=True, device=DEV)
    one, two = _rand(1, 64, seed=12), _rand(2, 64, seed=13)
    monkeypatch.setattr(fused_decode, "FORCE", True)
    _close(fused_decode.head(lin, one), lin(one), torch.float32)
    assert calls == [1]
    for m, h in ((lin, two), (biased, one)):  # several rows, a bias: the module
        assert torch.equal(fused_decode.head(m, h), m(h))
    monkeypatch.setattr(fused_decode, "FORCE", False)
    assert torch.equal(fused_decode.head(lin, one), lin(one))
    assert calls == [1]


@here
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_prologue(dtype):
    k, n = 80, 12
    gu, w = _rand(1, 2 * k, seed=7, dtype=dtype, scale=2.0), _rand(n, k, seed=8, dtype=dtype)
    gate, up = gu.chunk(2, dim=-1)
    y = gemv(gu, w, silu_mul=True, cfg=SMALL)
    _close(y, F.linear(F.silu(gate) * up, w), dtype)


@here
def test_norm_block_reads_x_in_one_round_at_8b_width():
    # qkv's 512-column tiles, gate_up's 1,024, SmolLM2's 576 columns, the tests' small K
    assert norm_block(512, 4096) == 1024 and norm_block(1024, 4096) == 1024
    assert norm_block(1024, 576) == 1024 and norm_block(64, 64) == 64 and norm_block(32, 96) == 128


def test_bad_inputs_are_refused():
    w = _rand(8, 64)
    with pytest.raises(ValueError, match="columns"):
        gemv(_rand(1, 63), w)
    with pytest.raises(ValueError, match="one prologue"):
        gemv(_rand(1, 128), w, norm_weight=_rand(64), silu_mul=True)
    assert not supported(_rand(2, 64), w)  # one row only
    assert not supported(_rand(1, 64, dtype=torch.bfloat16), w)  # dtypes must match


def _tiny_llama(dtype, hidden=64, inter=96):
    from augury.config import ModelConfig
    from augury.models.llama import LlamaForCausalLM

    cfg = ModelConfig.from_hf_dict({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 96, "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    })
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg, device=DEV, dtype=dtype)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.1)
    m.init_rope(64)
    return m


def fused_layer_outputs(dtype, hidden=64, forces=(False, True)) -> dict:
    """A one-token step of a tiny Llama (4 heads of hidden / 4, 2 KV heads) over a real paged pool after a
    6-token prefill, with the fused layer path forced off / on: {force: logits}."""
    from augury.layers.attention import SeqSpec, build_attention_metadata

    m = _tiny_llama(dtype, hidden=hidden)
    bs, nl, hkv, d = 8, 2, 2, hidden // 4
    pools = {"k": [torch.zeros(32, hkv, d, device=DEV, dtype=dtype) for _ in range(nl)],
             "v": [torch.zeros(32, hkv, d, device=DEV, dtype=dtype) for _ in range(nl)]}

    class View:
        k, v, group_of_layer = pools["k"], pools["v"], ["full"] * nl

    prompt = torch.tensor([5, 17, 3, 40, 22, 9], device=DEV)
    meta = build_attention_metadata([SeqSpec(0, 6, {"full": [1, 2]})], bs, {"full": None}, DEV)
    step = build_attention_metadata([SeqSpec(6, 1, {"full": [1, 2]})], bs, {"full": None}, DEV)
    tok = torch.tensor([31], device=DEV)
    outs = {}
    for force in forces:
        fused_decode.FORCE = force
        try:
            for p in pools["k"] + pools["v"]:
                p.zero_()
            with torch.no_grad():
                m(prompt, meta.positions, meta, View)  # prefill (never fused: 6 rows)
                assert fused_decode.eligible(m.layers[0], torch.zeros(1, hidden, device=DEV, dtype=dtype)) == force
                outs[force] = m(tok, step.positions, step, View)
        finally:
            fused_decode.FORCE = None
    return outs


@here
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_layer_equals_the_modules(dtype):
    """A one-token step of a tiny Llama with the fused layer path vs without, over a real paged pool."""
    outs = fused_layer_outputs(dtype)
    _close(outs[True], outs[False], dtype)


def tiny_step(hidden=64):
    """A tiny fp32 Llama (4 heads of hidden / 4), its paged pools (block size 8, blocks 1 and 2), a 6-token
    prefill's and a one-token step's metadata: (model, pools, view, prefill meta, step meta, step token)."""
    from augury.layers.attention import SeqSpec, build_attention_metadata

    m = _tiny_llama(torch.float32, hidden=hidden)
    pools = {"k": [torch.zeros(32, 2, hidden // 4, device=DEV) for _ in range(2)],
             "v": [torch.zeros(32, 2, hidden // 4, device=DEV) for _ in range(2)]}

    class View:
        k, v, group_of_layer = pools["k"], pools["v"], ["full"] * 2

    pre = build_attention_metadata([SeqSpec(0, 6, {"full": [1, 2]})], 8, {"full": None}, DEV)
    step = build_attention_metadata([SeqSpec(6, 1, {"full": [1, 2]})], 8, {"full": None}, DEV)
    return m, pools, View, pre, step, torch.tensor([31], device=DEV)


def compiled_tiny_step(hidden=64) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """`tiny_step`'s one-token step with the fused path forced on, eager and under torch.compile
    (fullgraph): (the compiled graph's call targets, compiled logits, eager logits)."""
    m, pools, View, pre, step, tok = tiny_step(hidden)
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    fused_decode.FORCE = True
    try:
        with torch.no_grad():
            m(torch.tensor([5, 17, 3, 40, 22, 9], device=DEV), pre.positions, pre, View)
            want = m(tok, step.positions, step, View)
            torch._dynamo.reset()
            got = torch.compile(m, fullgraph=True, backend=backend)(tok, step.positions, step, View)
    finally:
        fused_decode.FORCE = None
        torch._dynamo.reset()
    return seen, got, want


@here
def test_compiled_step_calls_the_fused_op_and_equals_eager():
    """Under torch.compile (fullgraph) each layer's four products are `augury::gemv` nodes."""
    seen, got, want = compiled_tiny_step()
    assert sum("augury.gemv" in s for s in seen) == 6  # 2 layers x 3 products ...
    assert sum("augury.qkv_rope_kv" in s for s in seen) == 2  # ... + qkv with rope and the K/V write
    assert sum("augury.rms_norm_row" in s for s in seen) == 1  # the final norm: eager's kernel, eager's bits
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@here
@pytest.mark.parametrize("cfg", [SMALL, GemvConfig(block_n=16, block_k=32)])  # 16 rows: a whole head of D=16
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qkv_rope_kv_equals_the_product_rope_and_pool_write(dtype, cfg):
    """The qkv kernel's epilogue is bitwise `apply_rope` and the pool writes of `paged_attention`
    over the same kernel's product (the same sums: only the row order inside a block differs)."""
    from augury.config import RopeConfig
    from augury.layers.rope import RotaryEmbedding, apply_rope

    H, Hkv, D, hidden = 4, 2, 16, 64
    x, w = _rand(1, hidden, seed=20, dtype=dtype, scale=2.0), _rand((H + 2 * Hkv) * D, hidden, seed=21, dtype=dtype)
    g = _rand(hidden, seed=22, dtype=dtype)
    cos, sin = RotaryEmbedding(RopeConfig(theta=500000.0), D, 64, device=DEV, dtype=dtype)(torch.tensor([37], device=DEV))
    # views with different strides (slot and head), so K's strides used for V would show
    k_pool = torch.full((10, 2, Hkv, D), 7.0, device=DEV, dtype=dtype)[:, 1]
    v_pool = torch.full((10, Hkv, 3, D), 7.0, device=DEV, dtype=dtype)[:, :, 2]
    k_ref, v_ref = k_pool.clone(), v_pool.clone()
    slot = torch.tensor([6], device=DEV)
    q = qkv_rope_kv(x, w, norm_weight=g, eps=1e-5, cos=cos, sin=sin, k_pool=k_pool, v_pool=v_pool, slot=slot,
                    num_heads=H, num_kv_heads=Hkv, cfg=cfg)
    qkv = gemv(x, w, norm_weight=g, eps=1e-5, cfg=cfg).view(1, H + 2 * Hkv, D)
    qk = apply_rope(qkv[:, : H + Hkv], cos, sin)
    k_ref.index_copy_(0, slot, qk[:, H:])
    v_ref.index_copy_(0, slot, qkv[:, H + Hkv:])
    assert q.shape == (1, H * D)
    assert torch.equal(v_pool, v_ref)  # the slot, and nothing else
    assert torch.equal(k_pool[:6], k_ref[:6]) and torch.equal(k_pool[7:], k_ref[7:])
    if dtype == torch.float32 and not CPU:  # compiled fp32 may contract x * cos + y * sin into an FMA
        torch.testing.assert_close(q.view(1, H, D), qk[:, :H], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(k_pool[6], k_ref[6], atol=1e-5, rtol=1e-5)
    else:  # bf16: every rounding is explicit (triton_gemv._rnd), so bitwise on the GPU and the interpreter
        assert torch.equal(q.view(1, H, D), qk[:, :H])
        assert torch.equal(k_pool[6], k_ref[6])


@here
def test_bf16_rounding_is_torchs():
    """`_rnd` (the epilogues' explicit fp32 -> bf16 rounding) equals torch's cast, NaN, inf,
    subnormals and ties included."""
    import triton

    @triton.jit
    def k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(y_ptr + i, _rnd(tl.load(x_ptr + i, mask=i < n), tl.bfloat16), mask=i < n)

    special = torch.tensor([0x7FFFFFFF, -1, 0x7F800001, 0x7FC00000, 0x7F800000, -8388608, 0x7F7FFFFF,
                            0x00000001, 0x00008000, 0x00018000, 0x3F808000, 0x3F818000, 0x3F80FFFF,
                            -1082064896, 0], dtype=torch.int32).view(torch.float32)
    g = torch.Generator().manual_seed(7)
    x = torch.cat([special, torch.randn(1009, generator=g) * 10.0 ** torch.randint(-30, 30, (1009,), generator=g)])
    y = torch.empty_like(x)
    k[(1,)](x.to(DEV), y_dev := y.to(DEV), x.numel(), BLOCK=1024)
    want = x.to(torch.bfloat16).float()
    got = y_dev.cpu()
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    assert torch.equal(got[ok].view(torch.int32), want[ok].view(torch.int32))


@here
def test_rope_kv_epilogue_only_where_it_matches_the_old_path():
    """The qkv kernel takes rope and the K/V write only over plain pools in the activation dtype,
    without q/k norm and with full-width rope rows in that dtype; otherwise `attend` does."""
    from augury.layers.fused_decode import _rope_kv_fusable

    m = _tiny_llama(torch.float32)
    attn = m.layers[0].self_attn
    h = torch.zeros(1, 64, device=DEV)
    D = attn.head_dim
    rope = (torch.ones(1, 1, D, device=DEV), torch.zeros(1, 1, D, device=DEV))
    pool = torch.zeros(8, attn.num_kv_heads, D, device=DEV)
    gm = type("Meta", (), {"write_split": None, "codec_parts": None})()
    assert _rope_kv_fusable(attn, h, rope, gm, pool, pool)
    assert not _rope_kv_fusable(attn, h, rope, gm, pool.half(), pool.half())  # another pool dtype
    assert not _rope_kv_fusable(attn, h, rope, gm, object(), object())  # an encoded store
    assert not _rope_kv_fusable(attn, h, tuple(t.double() for t in rope), gm, pool, pool)  # rope dtype
    assert not _rope_kv_fusable(attn, h, tuple(t[..., : D // 2] for t in rope), gm, pool, pool)  # partial
    attn.qk_norm = RMSNorm((attn.num_heads + attn.num_kv_heads, D), 1e-6, device=DEV)
    assert not _rope_kv_fusable(attn, h, rope, gm, pool, pool)  # q/k norm (Qwen3)


@here
def test_pool_writes_survive_functionalization():
    """Under torch.compile the op mutates the pools (auto-functionalized): the compiled step
    leaves the same pools as the eager one."""
    m, pools, View, pre, step, tok = tiny_step()
    fused_decode.FORCE = True
    try:
        with torch.no_grad():
            m(torch.tensor([5, 17, 3, 40, 22, 9], device=DEV), pre.positions, pre, View)
            want = m(tok, step.positions, step, View)
            want_pools = [p.clone() for p in pools["k"] + pools["v"]]
            for p in pools["k"] + pools["v"]:
                p[14].zero_()  # the step's slot (position 6 in block 1 at block size 8): written again below
            torch._dynamo.reset()
            got = torch.compile(m, fullgraph=True, backend="aot_eager")(tok, step.positions, step, View)
    finally:
        fused_decode.FORCE = None
        torch._dynamo.reset()
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    for p, w in zip(pools["k"] + pools["v"], want_pools):
        assert torch.equal(p, w)


@here
def test_layers_it_cannot_fuse_are_not_eligible():
    m = _tiny_llama(torch.float32)
    h = torch.zeros(1, 64, device=DEV)
    fused_decode.FORCE = True
    try:
        layer = m.layers[0]
        assert fused_decode.eligible(layer, h)
        assert not fused_decode.eligible(layer, torch.zeros(2, 64, device=DEV))  # two rows
        layer.self_attn.o_proj.bias = torch.nn.Parameter(torch.zeros(64, device=DEV))
        assert not fused_decode.eligible(layer, h)  # a bias: unfused
    finally:
        fused_decode.FORCE = None


@cuda_only
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (57344, 4096), (4096, 14336)])
def test_llama3_8b_shapes_on_cuda(n, k):
    x, w, r = _rand(1, k, seed=9, dtype=torch.bfloat16), _rand(n, k, seed=10, dtype=torch.bfloat16, scale=0.02), \
        _rand(1, n, seed=11, dtype=torch.bfloat16)
    y = gemv(x, w, residual=r)
    ref = r.float() + F.linear(x.float(), w.float())
    torch.testing.assert_close(y.float(), ref, atol=3e-2, rtol=2e-2)


@here
@pytest.mark.parametrize("n,k", [(13, 100), (4096, 4096), (6144, 4096)] if DEV.type == "cuda" else [(13, 100)])
def test_evict_first_weight_stream_is_bitwise_the_plain_one(n, k):
    """GemvConfig.weight_cache = 2 (an L2 eviction hint on the weight loads) changes no bit; a value it does not
    know is refused."""
    from dataclasses import replace

    from augury.layers.triton_gemv import default_config

    x, w = _rand(1, k, seed=12), _rand(n, k, seed=13)
    if DEV.type == "cuda":
        x, w = x.to(torch.bfloat16), w.to(torch.bfloat16)
    base = replace(default_config(n, k) if DEV.type == "cuda" else SMALL, weight_cache=0)
    assert torch.equal(gemv(x, w, cfg=replace(base, weight_cache=2)), gemv(x, w, cfg=base))
    with pytest.raises(ValueError, match="weight_cache is 0"):
        gemv(x, w, cfg=replace(base, weight_cache=1))


@cuda_only
@pytest.mark.parametrize("early,late", [(True, False), (False, False), (True, True)])
def test_weights_before_or_after_the_wait_on_cuda(early, late):
    """The o_proj shape under PDL, right after a PDL product that writes its input and lets it
    start at once (or, late, only after its weight stream), with a new input each time: the first
    weight tile loaded before the wait (early_weights) or after it, the result is bitwise the plain
    launch's on the finished input."""
    from augury.layers.triton_pdl import pdl_enabled

    if not pdl_enabled(DEV):
        pytest.skip("no programmatic dependent launch on this device")
    w0 = _rand(4096, 1024, seed=23, dtype=torch.bfloat16, scale=0.05)
    w, r = _rand(4096, 4096, seed=24, dtype=torch.bfloat16, scale=0.02), _rand(1, 4096, seed=25, dtype=torch.bfloat16)
    first = GemvConfig(block_n=8, block_k=1024, num_warps=4, late_launch=late)
    for i in range(4):
        x = gemv(_rand(1, 1024, seed=30 + i, dtype=torch.bfloat16), w0, pdl=True, cfg=first)
        got = gemv(x, w, residual=r, pdl=True, early_weights=early)
        torch.cuda.synchronize()
        assert torch.equal(got, gemv(x.clone(), w, residual=r, pdl=False))


@cuda_only
def test_replays_in_a_cuda_graph():
    x, w = _rand(1, 4096, seed=12, dtype=torch.bfloat16), _rand(6144, 4096, seed=13, dtype=torch.bfloat16)
    nw = _rand(4096, seed=14, dtype=torch.bfloat16)
    gemv(x, w, norm_weight=nw)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemv(x, w, norm_weight=nw)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(out, gemv(x, w, norm_weight=nw), atol=0, rtol=0)


@pytest.mark.skipif(FRESH, reason="this process runs the checks itself")
def test_in_fresh_process():
    rerun_in_fresh_process(__file__, timeout=900)
