"""The native few-query paged attention (augury/cpu_kernels/attention.cpp): exact against float64,
bitwise batch invariant (a row's bits never depend on the rest of the call), never reads outside a
request's keys, and what CPU steps actually run when the library is loaded."""

from __future__ import annotations

import random

import pytest
import torch
from native_child import outputs_in_child

import augury.layers.attention as attn
from augury.cpu_kernels import attention as kern
from augury.cpu_kernels import load
from augury.layers.attention import SeqSpec, build_attention_metadata, native_rows_cpu, paged_attention

BS = 16


@pytest.fixture(autouse=True)
def _kernels(native):  # the conftest fixture: a build failure with a toolchain present fails the test
    assert load()


def _tables(n_req: int, blocks_each: int, seed: int, blocks: int = 200) -> list[list[int]]:
    free = list(range(1, blocks))
    random.Random(seed).shuffle(free)
    return [free[i * blocks_each:(i + 1) * blocks_each] for i in range(n_req)]


def _pools(blocks: int, hkv: int, d: int, dtype, seed: int, poison_except: set[int] | None = None):
    g = torch.Generator().manual_seed(seed)
    k, v = (torch.randn(blocks * BS, hkv, d, generator=g) for _ in range(2))
    if poison_except is not None:  # NaN in every slot no request may read
        bad = torch.ones(blocks * BS, dtype=torch.bool)
        bad[list(poison_except)] = False
        k[bad], v[bad] = float("nan"), float("nan")
    return k.to(dtype), v.to(dtype)


def _meta(specs, window=None):
    g = "full" if window is None else "sliding"
    return build_attention_metadata(specs, BS, {g: window}, "cpu").groups[g]


def _reference(q, kp, vp, specs, scale, window=None):
    """float64 attention from positions alone (no metadata): row j of request i sees positions
    (nc + j - window, nc + j] of its block table."""
    out, t = [], 0
    H, Hkv = q.shape[1], kp.shape[1]
    for s in specs:
        tab = next(iter(s.block_tables.values()))
        for j in range(s.num_new):
            p = s.num_cached + j
            pos = range(0 if window is None else max(0, p - window + 1), p + 1)
            slots = torch.tensor([tab[x // BS] * BS + x % BS for x in pos])
            k = kp[slots].double().repeat_interleave(H // Hkv, 1)  # [L, H, D]: query head h reads h // rep
            v = vp[slots].double().repeat_interleave(H // Hkv, 1)
            w = (torch.einsum("hd,lhd->hl", q[t].double(), k) * scale).softmax(-1)
            out.append(torch.einsum("hl,lhd->hd", w, v))
            t += 1
    return torch.stack(out)


def _used_slots(specs, window=None) -> set[int]:
    used = set()
    for s in specs:
        tab = next(iter(s.block_tables.values()))
        for p in range(0 if window is None else max(0, s.num_cached - window + 1), s.num_cached + s.num_new):
            used.add(tab[p // BS] * BS + p % BS)
    return used


@pytest.mark.parametrize("dtype,qdtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                          (torch.bfloat16, torch.float32)])
# 24: AVX2's 8-lane path, AVX-512's scalar one; 20: the scalar path everywhere
@pytest.mark.parametrize("H,HKV,D", [(9, 3, 64), (8, 2, 128), (4, 4, 48), (6, 2, 24), (4, 2, 20)])
@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("sharp", [False, True])  # scores hundreds apart: most exps underflow to 0
def test_matches_float64_reference(dtype, qdtype, H, HKV, D, window, sharp):
    # ragged: windows of 1..11 rows, contexts across 16-key and block boundaries, a first prefill-like row
    lens = [(0, 1), (15, 11), (130, 4), (31, 2), (300, 7), (7, 3)]
    tabs = _tables(len(lens), 20, seed=H + D)
    specs = [SeqSpec(nc, nn, {"full" if window is None else "sliding": t}) for (nc, nn), t in zip(lens, tabs)]
    kp, vp = _pools(200, HKV, D, dtype, seed=1, poison_except=_used_slots(specs, window))
    q = torch.randn(sum(n for _, n in lens), H, D, generator=torch.Generator().manual_seed(2)).to(qdtype)
    scale = D ** -0.5 * (40.0 if sharp else 1.0)
    got = native_rows_cpu(q, kp, vp, _meta(specs, window), scale)
    assert got.dtype == qdtype and not got.isnan().any()
    want = _reference(q, kp, vp, specs, scale, window)
    # bf16: one rounding of the output; sharp: float32 scores ~100 in size carry ~1e-5 of error into exp
    tol = (1e-4 if sharp else 1e-5) if qdtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


def test_the_build_names_its_path():
    """attention.cpp has an AVX-512 path, an AVX2 one and a portable one; x86 machines with AVX2
    never fall back to the portable loop (~5x slower at a few hundred keys)."""
    import platform

    isa = torch.ops.augury_cpu.attention_isa()
    assert isa in ("avx512", "avx2", "portable")
    flags = open("/proc/cpuinfo").read() if platform.system() == "Linux" else ""
    if " avx2 " in flags and " fma " in flags:
        assert isa != "portable"


def _lone(q_row, kp, vp, nc, tab, window=None):
    specs = [SeqSpec(nc, 1, {"full" if window is None else "sliding": tab})]
    return native_rows_cpu(q_row, kp, vp, _meta(specs, window), 0.125)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 37])
def test_window_rows_are_bitwise_their_lone_decode_steps(dtype, window):
    H, HKV, D = 9, 3, 64
    (tab,) = _tables(1, 40, seed=5)
    kp, vp = _pools(200, HKV, D, dtype, seed=6)
    g = torch.Generator().manual_seed(7)
    for nc in (0, 1, 15, 17, 64, 150, 300, 511):
        for rows in (1, 2, 5, 11):
            q = torch.randn(rows, H, D, generator=g).to(dtype)
            specs = [SeqSpec(nc, rows, {"full" if window is None else "sliding": tab})]
            win = native_rows_cpu(q, kp, vp, _meta(specs, window), 0.125)
            for j in range(rows):
                assert torch.equal(win[j], _lone(q[j:j + 1], kp, vp, nc + j, tab, window)), (nc, rows, j)


def test_rows_are_bitwise_invariant_to_order_batch_and_threads():
    H, HKV, D = 9, 3, 64
    lens = [(40, 3), (7, 4), (130, 11), (0, 2), (66, 1), (299, 1)]
    tabs = _tables(len(lens), 20, seed=8)
    kp, vp = _pools(200, HKV, D, torch.float32, seed=9)
    g = torch.Generator().manual_seed(10)
    qs = [torch.randn(nn, H, D, generator=g) for _, nn in lens]
    specs = [SeqSpec(nc, nn, {"full": t}) for (nc, nn), t in zip(lens, tabs)]
    gm = _meta(specs)
    base = native_rows_cpu(torch.cat(qs), kp, vp, gm, 0.125)
    # requests in another order: every row keeps its bits
    perm = [3, 5, 1, 0, 4, 2]
    got = native_rows_cpu(torch.cat([qs[i] for i in perm]), kp, vp, _meta([specs[i] for i in perm]), 0.125)
    by_req = dict(zip(perm, got.split([lens[i][1] for i in perm])))
    assert torch.equal(torch.cat([by_req[i] for i in range(len(lens))]), base)
    starts = [sum(nn for _, nn in lens[:i]) for i in range(len(lens) + 1)]
    # each request alone
    for i, s in enumerate(specs):
        assert torch.equal(native_rows_cpu(qs[i], kp, vp, _meta([s]), 0.125), base[starts[i]:starts[i + 1]])
    # (row, KV head) pairs split over 2 threads
    plan = kern.make_plan(gm.mask, gm.out_index, gm.dense, H, D)
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        par = kern.paged_attention_rows(torch.cat(qs), kp, vp, gm.gather_slots, kern.RowPlan(plan.rows, True),
                                          0.125)
    finally:
        torch.set_num_threads(n)
    assert torch.equal(par, base)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [2, 3, 4])
def test_one_row_split_over_threads_keeps_its_bits(dtype, threads):
    """A lone decode row's query heads split over threads (on AVX2 the split may cut a KV head's
    group of query heads in two) give the bits of the serial call."""
    H, HKV, D = 9, 3, 64
    tabs = _tables(1, 20, seed=12)
    kp, vp = _pools(200, HKV, D, dtype, seed=13)
    q = torch.randn(1, H, D, generator=torch.Generator().manual_seed(14))
    gm = _meta([SeqSpec(257, 1, {"full": tabs[0]})])
    plan = kern.make_plan(gm.mask, gm.out_index, gm.dense, H, D)
    serial = kern.paged_attention_rows(q, kp, vp, gm.gather_slots, kern.RowPlan(plan.rows, False), 0.125)
    n = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        par = kern.paged_attention_rows(q, kp, vp, gm.gather_slots, kern.RowPlan(plan.rows, True), 0.125)
    finally:
        torch.set_num_threads(n)
    assert torch.equal(par, serial)


@pytest.mark.parametrize("threads", [2, 3])
def test_work_stealing_changes_no_bit(threads):
    """The units (AVX2: (row, query head), 72 here; AVX-512 and scalar: (row, KV head), 24) are shared
    out by parallel_steal (kernels.h), which lets a thread that finishes early take the others' chunks:
    the bits of the static split (the A/B hook augury_cpu::set_steal) and of the serial call, for 8
    decode rows of unequal lengths."""
    H, HKV, D = 9, 3, 64
    lens = [(40, 1), (7, 1), (130, 1), (0, 1), (66, 1), (299, 1), (3, 1), (180, 1)]
    tabs = _tables(len(lens), 20, seed=15)
    kp, vp = _pools(200, HKV, D, torch.float32, seed=16)
    q = torch.randn(len(lens), H, D, generator=torch.Generator().manual_seed(17))
    gm = _meta([SeqSpec(nc, nn, {"full": t}) for (nc, nn), t in zip(lens, tabs)])
    plan = kern.make_plan(gm.mask, gm.out_index, gm.dense, H, D)
    serial = kern.paged_attention_rows(q, kp, vp, gm.gather_slots, kern.RowPlan(plan.rows, False), 0.125)
    n = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for steal in (True, False):
            torch.ops.augury_cpu.set_steal(steal)
            par = kern.paged_attention_rows(q, kp, vp, gm.gather_slots, kern.RowPlan(plan.rows, True), 0.125)
            assert torch.equal(par, serial), steal
    finally:
        torch.ops.augury_cpu.set_steal(True)
        torch.set_num_threads(n)


def test_bad_row_plans_are_errors_not_wild_reads():
    kp, vp = _pools(4, 1, 16, torch.float32, seed=0)
    gather = torch.tensor([[0, 1, 2, 3]])
    q = torch.randn(1, 1, 16)
    for rows in ([[0, 0, 5]], [[1, 0, 1]], [[0, 2, 2]]):
        with pytest.raises(RuntimeError):
            torch.ops.augury_cpu.paged_attention_rows(q, kp, vp, gather, torch.tensor(rows, dtype=torch.int32),
                                                      1.0, False)
    with pytest.raises(RuntimeError, match="outside the pool"):
        torch.ops.augury_cpu.paged_attention_rows(q, kp, vp, torch.tensor([[0, 999]]),
                                                  torch.tensor([[0, 0, 2]], dtype=torch.int32), 1.0, False)


# --- routing -------------------------------------------------------------------------------------

def _count_calls(monkeypatch) -> list[int]:
    calls = []
    real = kern.paged_attention_rows

    def counted(q, *a, **k):
        calls.append(q.shape[0])
        return real(q, *a, **k)

    monkeypatch.setattr(kern, "paged_attention_rows", counted)
    return calls


CASES = {
    "decode": [SeqSpec(37, 1, {"full": list(range(1, 5))})],
    "window": [SeqSpec(37, 5, {"full": list(range(1, 5))})],
    "decode+window": [SeqSpec(20, 1, {"full": list(range(1, 5))}), SeqSpec(9, 4, {"full": list(range(5, 9))})],
    "decode+prefill": [SeqSpec(20, 1, {"full": list(range(1, 5))}), SeqSpec(0, 40, {"full": list(range(5, 9))})],
}


def _case(specs, H=6, HKV=2, D=16):
    g = torch.Generator().manual_seed(0)
    meta = build_attention_metadata(specs, BS, {"full": None}, "cpu")
    T = meta.num_tokens
    pools = (torch.randn(16 * BS, HKV, D, generator=g), torch.randn(16 * BS, HKV, D, generator=g))
    q, k, v = (torch.randn(T, n, D, generator=g) for n in (H, HKV, HKV))
    return q, k, v, pools, meta.groups["full"]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_cpu_steps_run_the_kernel_when_it_is_loaded(monkeypatch, name, compiled):
    import augury.layers.attention_cpu_op  # noqa: F401  (the compiled graph's op)

    calls = _count_calls(monkeypatch)
    q, k, v, (kp, vp), gm = _case(CASES[name])
    fn = paged_attention
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(paged_attention, dynamic=True, backend="eager", fullgraph=True)
    with torch.inference_mode():
        got = fn(q, k, v, kp.clone(), vp.clone(), gm, 0.25, None)
        monkeypatch.setattr(attn, "_NATIVE", False)  # the torch path, as without the library
        if compiled:
            torch._dynamo.reset()
        want = fn(q, k, v, kp.clone(), vp.clone(), gm, 0.25, None)
    decode_rows = sum(s.num_new for s in CASES[name] if s.num_new <= attn.MAX_ROWS_WINDOW)
    assert sum(calls) == decode_rows  # every few-query row went through the kernel; prefill rows did not
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_softcap_and_unsupported_dtypes_keep_the_torch_path(monkeypatch):
    calls = _count_calls(monkeypatch)
    q, k, v, (kp, vp), gm = _case(CASES["window"])
    with torch.inference_mode():
        paged_attention(q, k, v, kp, vp, gm, 0.25, 30.0)
        paged_attention(q.half(), k.half(), v.half(), kp.half(), vp.half(), gm, 0.25, None)
    assert calls == []


def test_software_prefetch_changes_no_bit(tmp_path):
    """The AVX-512 path asks for K and V rows ahead of use (AUGURY_ATTN_PREFETCH, read once per process):
    a hint, so with it off (a child process) every output is bitwise the same. Shapes: rep 3 / 4 / 1 / 2
    (every pass-3 tile size), D 64 and 128 (pass 3 in one or two column slices), keys across 16-key
    blocks, float32 and bf16 pools."""
    g = torch.Generator().manual_seed(11)
    calls = []
    for H, HKV, D, dtype in [(9, 3, 64, torch.float32), (4, 1, 128, torch.bfloat16), (2, 2, 64, torch.float32),
                             (8, 4, 64, torch.bfloat16)]:
        S = 80 * BS
        kp, vp = (torch.randn(S, HKV, D, generator=g).to(dtype) for _ in range(2))
        gather = torch.randperm(S, generator=g)[: 4 * 300].view(4, 300).contiguous()
        rows = torch.tensor([[0, 0, 1], [1, 5, 40], [2, 0, 300], [3, 17, 150]], dtype=torch.int32)
        q = torch.randn(4, H, D, generator=g)
        calls.append((q, kp, vp, gather, rows, D ** -0.5, True))
    here = [torch.ops.augury_cpu.paged_attention_rows(*a) for a in calls]
    off = outputs_in_child("torch:ops.augury_cpu.paged_attention_rows", calls, {"AUGURY_ATTN_PREFETCH": "0"}, tmp_path)
    for a, b in zip(here, off):
        assert torch.equal(a, b)
