"""CUDA graphs for decode steps: one captured forward per (batch bucket, KV bucket).

Small-batch decode on a GPU is bound by the host issuing ~20 kernels per layer;
replaying a captured graph issues them all at once. A step qualifies when every
request computes exactly one token. Shapes are made static by padding: the
batch to a bucket (padded rows write to and read from a reserved "trash"
block), and each KV group's gather length to a multiple of KV_BUCKET (padded
keys are masked with -inf). Same ops, same numbers as the eager path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from augury.kv.block_manager import BlockManager
from augury.layers.attention import AttentionMetadata, GroupAttnMeta, SeqSpec, build_attention_metadata

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
KV_BUCKET = 256
TRASH_ID = "__cudagraph_trash__"


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    ids: torch.Tensor  # [Bp] long
    positions: torch.Tensor  # [Bp] long
    slots: dict[str, torch.Tensor]  # [Bp] long per group
    gather: dict[str, torch.Tensor]  # [Bp, Kp] long per group
    bias: dict[str, torch.Tensor]  # [Bp, 1, 1, Kp] additive mask per group
    logits: torch.Tensor  # [Bp, V] float32 (output)


@dataclass
class _Burst:
    """n greedy steps in one graph: step j reads slots[g][j] and bias[g][j]; its argmax is
    step j+1's input and tokens[j] (engine/burst.py)."""

    graph: torch.cuda.CUDAGraph
    ids: torch.Tensor  # [Bp] long: the first step's input
    positions: torch.Tensor  # [Bp] long: the first step's positions
    slots: dict[str, torch.Tensor]  # [n, Bp] long per group
    gather: dict[str, torch.Tensor]  # [Bp, Kp] long per group (covers all n steps' keys)
    bias: dict[str, torch.Tensor]  # [n, Bp, 1, 1, Kp] additive mask per group and step
    tokens: torch.Tensor  # [n, Bp] long (output)


class CudaGraphDecoder:
    def __init__(self, model: torch.nn.Module, pool, blocks: BlockManager, windows: dict[str, int | None],
                 device: torch.device, dtype: torch.dtype, max_batch: int):
        self.model, self.pool, self.blocks = model, pool, blocks
        self.windows, self.device, self.dtype = windows, device, dtype
        self.max_batch = min(max_batch, BATCH_BUCKETS[-1])
        got = blocks.admit(TRASH_ID, [0], max_new=1)
        if got is None:
            raise RuntimeError("no KV block left for the CUDA-graph scratch block")
        self.trash = {g: t[0] * blocks.block_size for g, t in blocks.block_tables(TRASH_ID).items()}
        self.graphs: dict[tuple, _Graph] = {}
        self.bursts: dict[tuple, _Burst] = {}
        self.mempool = torch.cuda.graph_pool_handle()
        # a list turns on per-replay timing (bench/roofline.py --timeline): one
        # (host s at entry, host s at replay, start event, end event, steps) per call
        self.timing: list | None = None

    def usable(self, specs: list[SeqSpec]) -> bool:
        return len(specs) <= self.max_batch and all(s.num_new == 1 for s in specs)

    @staticmethod
    def _bucket(n: int, buckets=BATCH_BUCKETS) -> int:
        return next(b for b in buckets if b >= n)

    def run(self, ids: list[int], specs: list[SeqSpec]) -> torch.Tensor:
        """-> logits [B, V] float32 for a pure-decode step."""
        t_in = time.perf_counter() if self.timing is not None else 0.0
        B = len(specs)
        meta = build_attention_metadata(specs, self.blocks.block_size, self.windows, "cpu")
        Bp = self._bucket(B)
        kps = {g: -(-gm.max_kv // KV_BUCKET) * KV_BUCKET for g, gm in meta.groups.items()}
        key = (Bp, tuple(sorted(kps.items())))
        entry = self.graphs.get(key)
        if entry is None:
            entry = self._capture(Bp, kps)
            self.graphs[key] = entry
        self._fill(entry, ids, meta, B, Bp, kps)
        self._replay(entry.graph, t_in, 1)
        return entry.logits[:B]

    def run_burst(self, ids: list[int], specs: list[SeqSpec], n: int) -> torch.Tensor:
        """-> tokens [n, B] (device) of n greedy steps from a pure-decode step. The block
        tables must already cover positions num_cached .. num_cached + n - 1."""
        t_in = time.perf_counter() if self.timing is not None else 0.0
        B = len(specs)
        # one n-token window per request gives every step's slots and causal mask at once
        wide = [SeqSpec(s.num_cached, n, s.block_tables, s.kv_key) for s in specs]
        meta = build_attention_metadata(wide, self.blocks.block_size, self.windows, "cpu")
        Bp = self._bucket(B)
        kps = {g: -(-gm.max_kv // KV_BUCKET) * KV_BUCKET for g, gm in meta.groups.items()}
        key = (n, Bp, tuple(sorted(kps.items())))
        e = self.bursts.get(key)
        if e is None:
            e = self._capture_burst(n, Bp, kps)
            self.bursts[key] = e
        host_ids = torch.zeros(Bp, dtype=torch.long)
        host_ids[:B] = torch.tensor(ids, dtype=torch.long)
        host_pos = torch.zeros(Bp, dtype=torch.long)
        host_pos[:B] = meta.positions.view(B, n)[:, 0]
        e.ids.copy_(host_ids, non_blocking=True)
        e.positions.copy_(host_pos, non_blocking=True)
        for g, gm in meta.groups.items():
            Kp = kps[g]
            slots = torch.full((n, Bp), self.trash[g], dtype=torch.long)
            slots[:, :B] = gm.slot_mapping.view(B, n).t()
            gather = self._padded_gather(g, gm, B, Bp, Kp)
            valid = torch.zeros((n, Bp, 1, 1, Kp), dtype=torch.bool)
            valid[:, :B, 0, 0, : gm.max_kv] = gm.mask[:, 0].permute(1, 0, 2)  # [B, n, K] -> [n, B, K]
            valid[:, B:, :, :, 0] = True  # padded rows attend to the trash slot only
            bias = torch.zeros((n, Bp, 1, 1, Kp), dtype=self.dtype).masked_fill_(~valid, float("-inf"))
            e.slots[g].copy_(slots, non_blocking=True)
            e.gather[g].copy_(gather, non_blocking=True)
            e.bias[g].copy_(bias, non_blocking=True)
        self._replay(e.graph, t_in, n)
        return e.tokens[:, :B]

    def _capture_burst(self, n: int, Bp: int, kps: dict[str, int]) -> _Burst:
        dev = self.device
        ids = torch.zeros(Bp, dtype=torch.long, device=dev)
        pos = torch.zeros(Bp, dtype=torch.long, device=dev)
        tokens = torch.zeros((n, Bp), dtype=torch.long, device=dev)
        slots = {g: torch.full((n, Bp), self.trash[g], dtype=torch.long, device=dev) for g in kps}
        gather = {g: torch.full((Bp, Kp), self.trash[g], dtype=torch.long, device=dev) for g, Kp in kps.items()}
        bias = {g: torch.zeros((n, Bp, 1, 1, Kp), dtype=self.dtype, device=dev) for g, Kp in kps.items()}

        def body() -> None:
            cur = ids
            for j in range(n):
                groups = {}
                for g, Kp in kps.items():
                    gm = GroupAttnMeta(window=self.windows.get(g), slot_mapping=slots[g][j], gather_slots=gather[g],
                                       mask=torch.ones((Bp, 1, 1, Kp), dtype=torch.bool, device=dev), num_seqs=Bp,
                                       max_q=1, max_kv=Kp, q_index=None, out_index=None)
                    gm._bias[self.dtype] = bias[g][j]
                    groups[g] = gm
                p = pos + j
                meta = AttentionMetadata(positions=p, groups=groups, num_tokens=Bp, num_seqs=Bp, max_q=1,
                                         uniform=True, query_start=list(range(Bp + 1)))
                logits = self.model.compute_logits(self.model(cur, p, meta, self.pool))
                cur = logits.float().argmax(-1)  # the sampler's greedy choice (ties -> lowest id)
                tokens[j].copy_(cur)

        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up (allocator, lazy init) outside the graph
                body()
        torch.cuda.current_stream(dev).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            body()
        return _Burst(graph, ids, pos, slots, gather, bias, tokens)

    # ---- internals ----------------------------------------------------------------
    def _replay(self, graph: torch.cuda.CUDAGraph, t_in: float, steps: int) -> None:
        if self.timing is None:
            graph.replay()
            return
        t = time.perf_counter()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        self.timing.append((t_in, t, a, b, steps))

    def _padded_gather(self, g: str, gm: GroupAttnMeta, B: int, Bp: int, Kp: int) -> torch.Tensor:
        """[Bp, Kp] host gather table: real rows padded with their last key, padding rows on trash."""
        gather = torch.full((Bp, Kp), self.trash[g], dtype=torch.long)
        gather[:B, : gm.max_kv] = gm.gather_slots
        gather[:B, gm.max_kv:] = gm.gather_slots[:, -1:]
        return gather

    def _fill(self, e: _Graph, ids: list[int], meta: AttentionMetadata, B: int, Bp: int, kps: dict[str, int]) -> None:
        host_ids = torch.zeros(Bp, dtype=torch.long)
        host_ids[:B] = torch.tensor(ids, dtype=torch.long)
        host_pos = torch.zeros(Bp, dtype=torch.long)
        host_pos[:B] = meta.positions
        e.ids.copy_(host_ids, non_blocking=True)
        e.positions.copy_(host_pos, non_blocking=True)
        for g, gm in meta.groups.items():
            Kp = kps[g]
            slots = torch.full((Bp,), self.trash[g], dtype=torch.long)
            slots[:B] = gm.slot_mapping
            gather = self._padded_gather(g, gm, B, Bp, Kp)
            valid = torch.zeros((Bp, 1, 1, Kp), dtype=torch.bool)
            valid[:B, :, :, : gm.max_kv] = gm.mask
            valid[B:, :, :, 0] = True  # padded rows attend to the trash slot only
            bias = torch.zeros((Bp, 1, 1, Kp), dtype=self.dtype).masked_fill_(~valid, float("-inf"))
            e.slots[g].copy_(slots, non_blocking=True)
            e.gather[g].copy_(gather, non_blocking=True)
            e.bias[g].copy_(bias, non_blocking=True)

    def _capture(self, Bp: int, kps: dict[str, int]) -> _Graph:
        dev = self.device
        ids = torch.zeros(Bp, dtype=torch.long, device=dev)
        pos = torch.zeros(Bp, dtype=torch.long, device=dev)
        slots, gather, bias, groups = {}, {}, {}, {}
        for g, Kp in kps.items():
            slots[g] = torch.full((Bp,), self.trash[g], dtype=torch.long, device=dev)
            gather[g] = torch.full((Bp, Kp), self.trash[g], dtype=torch.long, device=dev)
            bias[g] = torch.zeros((Bp, 1, 1, Kp), dtype=self.dtype, device=dev)
            gm = GroupAttnMeta(window=self.windows.get(g), slot_mapping=slots[g], gather_slots=gather[g],
                               mask=torch.ones((Bp, 1, 1, Kp), dtype=torch.bool, device=dev), num_seqs=Bp,
                               max_q=1, max_kv=Kp, q_index=None, out_index=None)
            gm._bias[self.dtype] = bias[g]
            groups[g] = gm
        meta = AttentionMetadata(positions=pos, groups=groups, num_tokens=Bp, num_seqs=Bp, max_q=1, uniform=True,
                                 query_start=list(range(Bp + 1)))
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up (allocator, lazy init) outside the graph
                self.model.compute_logits(self.model(ids, pos, meta, self.pool))
        torch.cuda.current_stream(dev).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            logits = self.model.compute_logits(self.model(ids, pos, meta, self.pool))
        return _Graph(graph, ids, pos, slots, gather, bias, logits)
