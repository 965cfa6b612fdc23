"""Paged attention over a flat, ragged batch.

One forward step carries T query tokens from B requests (prefill chunks,
single decode tokens and multi-token verify windows mixed). Request i's new
tokens occupy flat rows [qstart_i, qstart_i + num_new_i), in request order.

`build_attention_metadata` runs once per step on the host (numpy, no torch
op overhead) and produces, per KV group ("full", "sliding"), where each new
token's K/V goes (`slot_mapping`), which pool slots each request reads
(`gather_slots`) and the boolean mask. `paged_attention` is then a handful of
tensor ops per layer: write K/V, gather, one SDPA call for the whole batch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from augury.cpu_kernels import attention as native_attn
from augury.cpu_kernels import load as load_native_kernels
from augury.layers.attention_decode_cpu import attend_decode_cpu, attend_rows_cpu

# CPU steps whose attention runs row by row (attend_rows_cpu): verify windows up to the
# longest draft + 1, and steps of at most this many query tokens (decode batches included).
# With the native kernel (augury/cpu_kernels/attention.cpp) every segment of at most
# MAX_ROWS_WINDOW rows per request runs row by row, whatever its token count
MAX_ROWS_WINDOW = 17
MAX_ROWS_TOKENS = 64

_NATIVE: bool | None = None  # None: use the native kernel when the library loaded (tests set False)


def native_cpu_attention() -> bool:
    """Whether the native few-query kernel serves CPU attention (`load()` builds or loads the library
    on its first call and remembers the answer). False: the torch path below serves."""
    return load_native_kernels() if _NATIVE is None else _NATIVE


@dataclass
class SeqSpec:
    """One request's share of a step."""

    num_cached: int  # tokens already in KV before this step
    num_new: int  # query tokens this step; positions = num_cached + arange(num_new)
    # per group: block ids covering positions [0, num_cached + num_new); for a sliding
    # group, blocks wholly outside the window of the first new token may be -1 (released)
    block_tables: dict[str, list[int]]
    kv_key: str = ""  # the request's KV codec (pools with several storage classes run one segment per key)


@dataclass
class GroupAttnMeta:
    """Per-step tensors for the layers of one KV group (shared by all of them)."""

    window: int | None  # sliding window (HF semantics: key_pos > query_pos - window) or None
    slot_mapping: torch.Tensor  # [T] long: pool slot each new token's K/V is written to
    gather_slots: torch.Tensor  # [B, max_kv] long: pool slots each request reads (padding repeats a valid slot)
    mask: torch.Tensor  # [B, 1, max_q, max_kv] bool: True = attend
    num_seqs: int
    max_q: int
    max_kv: int
    # flat row for each padded query slot [B*max_q] and padded slot of each flat row [T];
    # None when every request has max_q new tokens (a plain view suffices)
    q_index: torch.Tensor | None
    out_index: torch.Tensor | None
    # a step mixing single-token decodes with longer windows is split in two segments
    # (flat rows [lo, hi) each) so decodes are not padded to the longest window: (lo, hi, meta)
    parts: list[tuple[int, int, "GroupAttnMeta"]] | None = None
    dense: bool = False  # the mask is all True (one request reading every key): attention skips it
    # pools with several storage classes (kv/classed.py): the class whose local slot ids this
    # meta holds, or None when its requests span classes: then the slots stay global, and
    # `write_split` says which class each new token goes to (class, token rows, local slots)
    store_class: str | None = None
    view_classes: tuple[str, ...] = ()
    write_split: list[tuple[str, torch.Tensor, torch.Tensor]] | None = None
    # a step with requests of several KV codecs: one run per codec, flat rows [lo, hi) each
    codec_parts: list[tuple[int, int, "GroupAttnMeta", str]] | None = None
    _bias: dict[torch.dtype, torch.Tensor] = field(default_factory=dict, repr=False)

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """The mask as 0 / -inf in `dtype`, built on the first layer and reused by the rest
        (a bool mask costs SDPA a conversion per layer)."""
        bias = self._bias.get(dtype)
        if bias is None:
            bias = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device)
            bias.masked_fill_(~self.mask, float("-inf"))
            self._bias[dtype] = bias
        return bias


def prepare_masks(meta: "AttentionMetadata", dtype: torch.dtype) -> None:
    """Build every group's (and segment's) additive mask in `dtype` now, so a compiled forward
    always finds the cache filled, as it does in CUDA-graph metadata (see engine/loader.py)."""
    todo = list(meta.groups.values())
    while todo:
        gm = todo.pop()
        gm.additive_mask(dtype)
        todo.extend(m for _, _, m in gm.parts or ())
        todo.extend(m for _, _, m, _ in gm.codec_parts or ())


@dataclass
class AttentionMetadata:
    positions: torch.Tensor  # [T] long: absolute position of each query token
    groups: dict[str, GroupAttnMeta]
    num_tokens: int
    num_seqs: int
    max_q: int
    uniform: bool  # every request has max_q new tokens (all-decode, equal verify windows)
    query_start: list[int]  # [B+1] host cumsum of num_new: request i owns rows [qs[i], qs[i+1])


class AttentionMetadataError(ValueError):
    """The step's block tables do not cover what attention must read or write."""


ClassRanges = dict[str, list[tuple[str, int, int]]]  # group -> (storage class, first slot, end slot)


def build_attention_metadata(
    seqs: list[SeqSpec],
    block_size: int,
    windows: dict[str, int | None],
    device: torch.device | str,
    class_ranges: ClassRanges | None = None,
) -> AttentionMetadata:
    """Host-side, once per step. `windows` maps each group name to its window (None = full).

    When the step starts with single-token decodes followed by longer windows (the
    runner orders it so), attention runs as two segments: the decodes unpadded, the
    rest padded to its own longest window. With `class_ranges` (a pool of several
    storage classes), requests come grouped by `kv_key` and each key's run gets its
    own segments, with slots translated to the class they read (kv/classed.py)."""
    if not seqs:
        raise AttentionMetadataError("a step needs at least one request")
    runs: list[tuple[int, int]] = []
    if class_ranges is not None:
        lo = 0
        for i in range(1, len(seqs) + 1):
            if i == len(seqs) or seqs[i].kv_key != seqs[lo].kv_key:
                runs.append((lo, i))
                lo = i
        if len({seqs[a].kv_key for a, _ in runs}) != len(runs):
            raise AttentionMetadataError("requests of one KV codec must be consecutive in a step")
    if len(runs) <= 1:
        return _build_split(seqs, block_size, windows, device, class_ranges)
    meta = _build(seqs, block_size, windows, device)
    parts = []
    for a, b in runs:
        sub = _build_split(seqs[a:b], block_size, windows, device, class_ranges)
        parts.append((meta.query_start[a], meta.query_start[b], sub, seqs[a].kv_key))
    for g, gm in meta.groups.items():
        gm.codec_parts = [(lo, hi, sub.groups[g], key) for lo, hi, sub, key in parts]
    return meta


def _build_split(seqs: list[SeqSpec], block_size: int, windows: dict[str, int | None], device: torch.device | str,
                 class_ranges: ClassRanges | None) -> AttentionMetadata:
    if class_ranges is None and all(s.num_new == 1 for s in seqs):
        return _build_decodes(seqs, block_size, windows, device)
    meta = _build(seqs, block_size, windows, device, class_ranges)
    n_dec = 0
    while n_dec < len(seqs) and seqs[n_dec].num_new == 1:
        n_dec += 1
    if 0 < n_dec < len(seqs):
        head = _build(seqs[:n_dec], block_size, windows, device, class_ranges)
        tail = _build(seqs[n_dec:], block_size, windows, device, class_ranges)
        for g, gm in meta.groups.items():
            gm.parts = [(0, n_dec, head.groups[g]), (n_dec, meta.num_tokens, tail.groups[g])]
    return meta


def _to_device(a: np.ndarray, device: torch.device | str) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(device, non_blocking=True)


def _short_table(g: str, i: int, blocks: int, tokens: int, block_size: int) -> AttentionMetadataError:
    return AttentionMetadataError(f"group {g!r}: request {i} has {blocks} blocks, needs "
                                  f"{(tokens - 1) // block_size + 1} for {tokens} tokens")


def _released(g: str, i: int, window: int | None, num_cached: int) -> AttentionMetadataError:
    return AttentionMetadataError(f"group {g!r}: request {i} reads a released (-1) block; "
                                  f"window={window}, num_cached={num_cached}")


def _build_decodes(seqs: list[SeqSpec], block_size: int, windows: dict[str, int | None],
                   device: torch.device | str) -> AttentionMetadata:
    """`_build` for a step of single-token decodes on a one-class pool (the steady state of decoding),
    in a fraction of its numpy calls: a small model's CPU decode step spent ~0.25 ms in `_build`.
    The same metadata, field for field (tested against `_build`)."""
    B = len(seqs)
    nc = np.fromiter((s.num_cached for s in seqs), dtype=np.int64, count=B)
    if (nc < 0).any():
        raise AttentionMetadataError("every request needs num_new >= 1 and num_cached >= 0")

    def dev(a: np.ndarray) -> torch.Tensor:
        return _to_device(a, device)

    ar = np.arange(block_size)
    groups: dict[str, GroupAttnMeta] = {}
    for g in seqs[0].block_tables:
        if g not in windows and g != "full":
            raise AttentionMetadataError(f"no window given for KV group {g!r}")
        window = windows.get(g)
        kv_start = np.zeros(B, dtype=np.int64) if window is None else \
            (np.maximum(nc - window + 1, 0) // block_size) * block_size
        max_kv = int((nc + 1 - kv_start).max())
        gather = np.empty((B, max_kv), dtype=np.int64)
        slots = np.empty(B, dtype=np.int64)
        tables = [s.block_tables[g] for s in seqs]
        for i, t in enumerate(tables):  # every request's length first, then released blocks (as `_build`)
            if int(nc[i]) // block_size >= len(t):
                raise _short_table(g, i, len(t), int(nc[i]) + 1, block_size)
        for i, t in enumerate(tables):
            n, lo = int(nc[i]), int(kv_start[i])
            used = np.asarray(t[lo // block_size:n // block_size + 1], dtype=np.int64)
            if (used < 0).any():
                raise _released(g, i, window, n)
            row = (used[:, None] * block_size + ar).reshape(-1)[:n + 1 - lo]  # keys lo..n in slot order
            gather[i, :len(row)] = row
            gather[i, len(row):] = row[-1]  # padding reads the last real key
            slots[i] = row[-1]  # the new token's key is the last one read
        kpos = kv_start[:, None] + np.arange(max_kv)[None, :]
        mask = kpos <= nc[:, None]  # causal; padded keys sit past every query
        if window is not None:
            mask &= kpos > (nc - window)[:, None]
        groups[g] = GroupAttnMeta(window=window, slot_mapping=dev(slots), gather_slots=dev(gather),
                                  mask=dev(mask[:, None, None, :]), num_seqs=B, max_q=1, max_kv=max_kv,
                                  q_index=None, out_index=None, dense=bool(mask.all()))
    return AttentionMetadata(positions=dev(nc), groups=groups, num_tokens=B, num_seqs=B, max_q=1, uniform=True,
                             query_start=list(range(B + 1)))


def _classify(slots: np.ndarray, gather: np.ndarray, ranges: list[tuple[str, int, int]]):
    """Which storage classes this segment touches -> (class or None, slots, gather, split).
    One class: slots become local to it. Several: slots stay global and `split` lists
    (class, token rows, local slots) for the writes."""
    every = np.concatenate([slots, gather.reshape(-1)])
    touched = [(c, lo, hi) for c, lo, hi in ranges if ((every >= lo) & (every < hi)).any()]
    if len(touched) == 1:
        c, lo, _ = touched[0]
        return c, slots - lo, gather - lo, None, (c,)
    split = []
    for c, lo, hi in touched:
        rows = np.nonzero((slots >= lo) & (slots < hi))[0]
        if len(rows):
            split.append((c, rows, slots[rows] - lo))
    return None, slots, gather, split, tuple(c for c, _, _ in touched)


def _build(
    seqs: list[SeqSpec],
    block_size: int,
    windows: dict[str, int | None],
    device: torch.device | str,
    class_ranges: ClassRanges | None = None,
) -> AttentionMetadata:
    B = len(seqs)
    nc = np.fromiter((s.num_cached for s in seqs), dtype=np.int64, count=B)
    nn_ = np.fromiter((s.num_new for s in seqs), dtype=np.int64, count=B)
    if (nn_ < 1).any() or (nc < 0).any():
        raise AttentionMetadataError("every request needs num_new >= 1 and num_cached >= 0")
    ctx = nc + nn_
    T = int(nn_.sum())
    max_q = int(nn_.max())
    qs = np.zeros(B + 1, dtype=np.int64)
    np.cumsum(nn_, out=qs[1:])
    req_of_tok = np.repeat(np.arange(B), nn_)  # [T]
    off_of_tok = np.arange(T) - qs[req_of_tok]  # [T] index within the request's new tokens
    pos = nc[req_of_tok] + off_of_tok  # [T]
    uniform = bool((nn_ == max_q).all())

    j = np.arange(max_q)
    # padded query rows repeat the request's last real row, so no row is fully masked
    jq = np.minimum(j[None, :], (nn_ - 1)[:, None])  # [B, max_q]
    qpos = nc[:, None] + jq  # [B, max_q]

    def dev(a: np.ndarray) -> torch.Tensor:
        return _to_device(a, device)

    q_index = out_index = None
    if not uniform:
        q_index = dev((qs[:B, None] + jq).reshape(-1))
        out_index = dev(req_of_tok * max_q + off_of_tok)

    groups: dict[str, GroupAttnMeta] = {}
    for g in seqs[0].block_tables:
        if g not in windows and g != "full":
            raise AttentionMetadataError(f"no window given for KV group {g!r}")
        window = windows.get(g)
        tables = [s.block_tables[g] for s in seqs]
        lens = np.fromiter((len(t) for t in tables), dtype=np.int64, count=B)
        if ((ctx - 1) // block_size >= lens).any():
            bad = int(np.argmax((ctx - 1) // block_size >= lens))
            raise _short_table(g, bad, int(lens[bad]), int(ctx[bad]), block_size)
        bt = np.full((B, int(lens.max())), -1, dtype=np.int64)
        for i, t in enumerate(tables):
            bt[i, : len(t)] = t
        if window is None:
            kv_start = np.zeros(B, dtype=np.int64)
        else:
            # read from the block holding the first new token's oldest visible key
            kv_start = (np.maximum(nc - window + 1, 0) // block_size) * block_size
        max_kv = int((ctx - kv_start).max())
        kpos = kv_start[:, None] + np.arange(max_kv)[None, :]  # [B, max_kv]
        kpos_c = np.minimum(kpos, (ctx - 1)[:, None])  # padding reads the last real key
        blocks = np.take_along_axis(bt, kpos_c // block_size, axis=1)
        if (blocks < 0).any():
            bad = int(np.argmax((blocks < 0).any(axis=1)))
            raise _released(g, bad, window, int(nc[bad]))
        gather = blocks * block_size + kpos_c % block_size
        slots = bt[req_of_tok, pos // block_size] * block_size + pos % block_size
        mask = kpos[:, None, :] <= qpos[:, :, None]  # causal; padded keys sit past every query
        if window is not None:
            mask &= kpos[:, None, :] > qpos[:, :, None] - window
        store_class, split, view = None, None, ()
        if class_ranges is not None:
            store_class, slots, gather, split, view = _classify(slots, gather, class_ranges[g])
        groups[g] = GroupAttnMeta(
            window=window,
            slot_mapping=dev(slots),
            gather_slots=dev(gather),
            mask=dev(mask[:, None]),
            num_seqs=B,
            max_q=max_q,
            max_kv=max_kv,
            q_index=q_index,
            out_index=out_index,
            dense=bool(mask.all()),
            store_class=store_class,
            view_classes=view,
            write_split=None if split is None else [(c, dev(r), dev(s)) for c, r, s in split],
        )
    return AttentionMetadata(
        positions=dev(pos),
        groups=groups,
        num_tokens=T,
        num_seqs=B,
        max_q=max_q,
        uniform=uniform,
        query_start=qs.tolist(),
    )


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    gmeta: GroupAttnMeta,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    """q [T, H, D], k/v [T, Hkv, D] (rope applied), pools [num_slots, Hkv, D] -> [T, H, D].

    Writes this step's K/V into the pools first, so a request's new tokens see
    each other through the same gather as its cached ones.
    """
    if not isinstance(k_pool, torch.Tensor):  # an encoded KV codec: encode on write, decode on read
        from augury.kv.classed import ClassedStore
        from augury.kv.codecs.attention import encoded_paged_attention

        if isinstance(k_pool, ClassedStore):  # several codecs in one pool
            from augury.kv.classed import classed_paged_attention

            return classed_paged_attention(q, k, v, k_pool, v_pool, gmeta, scale, softcap)

        return encoded_paged_attention(q, k, v, k_pool, v_pool, gmeta, scale, softcap)
    k_pool.index_copy_(0, gmeta.slot_mapping, k.to(k_pool.dtype))
    v_pool.index_copy_(0, gmeta.slot_mapping, v.to(v_pool.dtype))
    return attend_written(q, k_pool, v_pool, gmeta, scale, softcap)


def attend_written(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    gmeta: GroupAttnMeta,
    scale: float,
    softcap: float | None,
    l2_warm: tuple[torch.Tensor, ...] = (),
) -> torch.Tensor:
    """`paged_attention` over plain pools that already hold this step's K/V (the fused GPU
    decode layer writes them in its qkv kernel): q [T, H, D] -> [T, H, D]. l2_warm: the next
    product's weight tensors, which the decode kernel asks the L2 for (`triton_paged_decode`)."""
    if q.is_cuda and (kernels := _paged_kernel()) is not None:
        # decode and verify segments read the pool in place (no gathered K/V copy); wide
        # segments (prefill chunks) keep gather + SDPA inside attend_paged. Under
        # torch.compile the kernel is one opaque custom op (augury::paged_decode_attention)
        return kernels.attend_paged(q, k_pool, v_pool, gmeta, scale, softcap, l2_warm)
    if softcap is None and q.device.type == "cpu" and torch.compiler.is_compiling():
        from augury.layers.attention_cpu_op import attend_compiled_cpu  # registered by engine/loader.py

        return attend_compiled_cpu(q, k_pool, v_pool, gmeta, scale)
    if softcap is None and q.device.type == "cpu" and native_cpu_attention() and native_attn.supports(q, k_pool):
        return attend_native_cpu(q, k_pool, v_pool, gmeta, scale)
    return attend(q, lambda slots: k_pool.index_select(0, slots), lambda slots: v_pool.index_select(0, slots),
                  gmeta, scale, softcap)


@functools.lru_cache(maxsize=1)
def _paged_kernel():
    """The Triton paged decode-attention module, or None where triton cannot be used."""
    try:
        from augury.layers import triton_paged_decode
    except Exception:  # no triton, or one that cannot build here: gather + SDPA serves
        return None
    return triton_paged_decode


Reader = Callable[[torch.Tensor], torch.Tensor]  # flat slots [S] -> rows [S, Hkv, D]


def attend_native_cpu(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, gmeta: GroupAttnMeta,
                      scale: float) -> torch.Tensor:
    """Eager CPU attention over plain pools with the native kernel loaded: q [T, H, D] -> [T, H, D].

    Segments of at most MAX_ROWS_WINDOW rows per request (one-token decodes, verify windows, small
    chunks; the whole step at once when no segment is wider) run in one kernel call that reads the
    pools in place, each row bitwise its own one-token step, sliding windows included (a row's key
    range comes from the mask). Wider segments (prefill chunks) keep gather + SDPA."""
    if gmeta.max_q <= MAX_ROWS_WINDOW:
        return native_rows_cpu(q, k_pool, v_pool, gmeta, scale)
    if gmeta.parts is None:
        return _attend_segment(q, lambda s: k_pool.index_select(0, s), lambda s: v_pool.index_select(0, s), gmeta,
                               scale, None)
    return torch.cat([attend_native_cpu(q[lo:hi], k_pool, v_pool, m, scale) for lo, hi, m in gmeta.parts])


def native_rows_cpu(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, gmeta: GroupAttnMeta,
                    scale: float) -> torch.Tensor:
    """One native kernel call for every row of `gmeta`; its row plan is made on the step's first
    layer and kept on the metadata for the rest."""
    plan = getattr(gmeta, "_native_plan", None)
    if plan is None:
        plan = native_attn.make_plan(gmeta.mask, gmeta.out_index, gmeta.dense, q.shape[1], q.shape[2])
        gmeta._native_plan = plan
    return native_attn.paged_attention_rows(q, k_pool, v_pool, gmeta.gather_slots, plan, scale)


def attend(q: torch.Tensor, read_k: Reader, read_v: Reader, gmeta: GroupAttnMeta, scale: float,
           softcap: float | None) -> torch.Tensor:
    """Attention of q [T, H, D] over the slots `gmeta` gathers, read through `read_k/read_v`
    (a plain pool or a KV codec that decodes on read). -> [T, H, D]"""
    if gmeta.parts is None:
        return _attend_segment(q, read_k, read_v, gmeta, scale, softcap)
    return torch.cat([_attend_segment(q[lo:hi], read_k, read_v, part, scale, softcap)
                      for lo, hi, part in gmeta.parts])


def _attend_segment(q: torch.Tensor, read_k: Reader, read_v: Reader, gmeta: GroupAttnMeta, scale: float,
                    softcap: float | None) -> torch.Tensor:
    T, H, D = q.shape
    B, max_q = gmeta.num_seqs, gmeta.max_q
    # the grouped-matmul decode path is for eager CPU steps; under torch.compile its
    # data-dependent "dense" switch breaks dynamic shapes, and inductor fuses SDPA anyway
    eager_cpu = softcap is None and q.device.type == "cpu" and not torch.compiler.is_compiling()
    if eager_cpu and max_q == 1 and B == 1:
        return attend_decode_cpu(q, read_k, read_v, gmeta, scale)
    if eager_cpu and gmeta.window is None and max_q <= MAX_ROWS_WINDOW and T <= MAX_ROWS_TOKENS:
        # verify windows and small batches: each row exactly as its own one-token step computes
        # it (bitwise batch invariance: speculation and batching cannot change a greedy token)
        return attend_rows_cpu(q, read_k, read_v, gmeta, scale)
    if eager_cpu and max_q == 1:  # larger decode batches: one padded grouped matmul
        return attend_decode_cpu(q, read_k, read_v, gmeta, scale)
    if gmeta.q_index is None:
        qp = q.reshape(B, max_q, H, D)
    else:
        qp = q.index_select(0, gmeta.q_index).view(B, max_q, H, D)
    qp = qp.transpose(1, 2)  # [B, H, max_q, D]
    # one index_select over the flat slot list: several times cheaper than 2-D indexing
    flat = gmeta.gather_slots.view(-1)
    kc = read_k(flat)
    kc = kc.view(B, -1, *kc.shape[1:]).transpose(1, 2)  # [B, Hkv, max_kv, D]
    vc = read_v(flat)
    vc = vc.view(B, -1, *vc.shape[1:]).transpose(1, 2)
    if kc.dtype != q.dtype:
        kc, vc = kc.to(q.dtype), vc.to(q.dtype)
    if softcap is None:
        # under torch.compile(dynamic=True) the head counts are symbolic and SDPA takes only a
        # plain bool (a SymBool broke the graph at every prefill layer); GQA with equal head
        # counts is the same attention, so compiled graphs always pass True
        gqa = True if torch.compiler.is_compiling() else kc.shape[1] != H
        o = F.scaled_dot_product_attention(
            qp, kc, vc, attn_mask=gmeta.additive_mask(q.dtype), scale=scale, enable_gqa=gqa
        )
    else:
        # the additive mask, not the bool one: under CUDA graphs only the additive mask is refilled
        o = softcap_attention(qp, kc, vc, gmeta.additive_mask(q.dtype), scale, softcap)
    o = o.transpose(1, 2)  # [B, max_q, H, D]
    if gmeta.out_index is None:
        return o.reshape(T, H, D)
    return o.reshape(B * max_q, H, D).index_select(0, gmeta.out_index)


def softcap_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float
) -> torch.Tensor:
    """q [B, H, Q, D], k/v [B, Hkv, K, D], mask [B, 1, Q, K] (bool, True = attend, or an
    additive 0/-inf mask) -> [B, H, Q, D].

    Eager path for tanh logit softcapping (Gemma 2 style), softmax in float32 as HF does.
    """
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, v)
