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
from dataclasses import dataclass, field

import numpy as np
import torch

from augury.kv.block_manager import BlockManager
from augury.layers.attention import AttentionMetadata, AttentionMetadataError, GroupAttnMeta, SeqSpec

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
KV_BUCKET = 256
TRASH_ID = "__cudagraph_trash__"


@dataclass
class _Graph:
    """One captured decode call: n greedy steps (n = 1: a plain step, whose logits the sampler
    reads; n > 1: a burst, engine/burst.py, step j's argmax being step j+1's input and tokens[j]).

    Every input arrives in one int64 buffer, copied from a pinned twin in one transfer per call
    (`_layout` names its parts: ids, positions, and per group the slots written, a window of the
    block table, the last key each row reads and each step's visible key range); the graph
    itself expands the tables into the [Bp, Kp] gather list and the additive masks."""

    graph: torch.cuda.CUDAGraph
    n: int
    layout: dict[str, tuple[int, tuple[int, ...]]]  # name -> (offset, shape) in the buffers
    host: torch.Tensor  # pinned int64 staging buffer
    dev: torch.Tensor  # its device twin (the graph's input)
    copied: torch.cuda.Event  # the last transfer out of `host` is done
    out: torch.Tensor  # logits [Bp, V] float32 (n = 1) or tokens [n, Bp] long
    keep: tuple = ()  # other tensors made before the capture that the graph reads: they must outlive it
    # bursts: two pinned [n, Bp] copies of `out`, each with the event of its copy, used in turn so a
    # burst's tokens survive the next replay of this graph while the host has not read them yet
    outs: list = field(default_factory=list)
    flip: int = 0


@dataclass
class BurstOut:
    """A launched burst's tokens: `dev` [n, B] on the device (the graph's static output, good
    until this graph's next replay, which the stream orders after anything enqueued now) and
    `host` [n, Bp] pinned, filled once `ready` has completed."""

    dev: torch.Tensor
    host: torch.Tensor
    ready: torch.cuda.Event


class CudaGraphDecoder:
    def __init__(self, model: torch.nn.Module, pool, blocks: BlockManager, windows: dict[str, int | None],
                 device: torch.device, dtype: torch.dtype, max_batch: int):
        self.model, self.pool, self.blocks = model, pool, blocks
        self.windows, self.device, self.dtype = windows, device, dtype
        self.max_batch = min(max_batch, BATCH_BUCKETS[-1])
        got = blocks.admit(TRASH_ID, [0], max_new=1)
        if got is None:
            raise RuntimeError("no KV block left for the CUDA-graph scratch block")
        self.trash_block = {g: t[0] for g, t in blocks.block_tables(TRASH_ID).items()}
        self.trash = {g: b * blocks.block_size for g, b in self.trash_block.items()}
        self.graphs: dict[tuple, _Graph] = {}
        self.mempool = torch.cuda.graph_pool_handle()
        # a list turns on per-replay timing (bench/roofline.py --timeline): one
        # (host s at entry, host s at replay, start event, end event, steps) per call
        self.timing: list | None = None

    @property
    def bursts(self) -> dict[tuple, _Graph]:
        return {k: v for k, v in self.graphs.items() if v.n > 1}

    def usable(self, specs: list[SeqSpec]) -> bool:
        return len(specs) <= self.max_batch and all(s.num_new == 1 for s in specs)

    @staticmethod
    def _bucket(n: int, buckets=BATCH_BUCKETS) -> int:
        return next(b for b in buckets if b >= n)

    def run(self, ids: list[int], specs: list[SeqSpec]) -> torch.Tensor:
        """-> logits [B, V] float32 for a pure-decode step."""
        return self._call(ids, specs, 1).out[:len(specs)]

    def run_burst(self, ids: list[int] | None, specs: list[SeqSpec], n: int,
                  first: torch.Tensor | None = None) -> BurstOut:
        """Launch n greedy steps from a pure-decode step; nothing waits for them. The block
        tables must already cover positions num_cached .. num_cached + n - 1. `first` [B]
        (device): the first input ids, taken on the device (a chained burst: the previous
        burst's last row) instead of `ids`. The tokens are copied to a pinned buffer right
        behind the replay, so the next replay of the same graph cannot overwrite them."""
        B = len(specs)
        e = self._call(ids, specs, n, first_ids=first)
        if not e.outs:
            e.outs = [(torch.empty(e.out.shape, dtype=e.out.dtype).pin_memory(), torch.cuda.Event())
                      for _ in range(2)]
        host, ready = e.outs[e.flip]
        e.flip ^= 1
        host.copy_(e.out, non_blocking=True)
        ready.record()
        return BurstOut(e.out[:, :B], host, ready)

    # ---- internals ----------------------------------------------------------------
    def _call(self, ids: list[int] | None, specs: list[SeqSpec], n: int,
              first_ids: torch.Tensor | None = None) -> _Graph:
        t_in = time.perf_counter() if self.timing is not None else 0.0
        bs = self.blocks.block_size
        B = len(specs)
        Bp = self._bucket(B)
        nc = np.fromiter((s.num_cached for s in specs), dtype=np.int64, count=B)
        ctx = nc + n  # keys the last step reads (its own included)
        starts, kps = {}, {}
        for g in specs[0].block_tables:
            if g not in self.windows and g != "full":
                raise AttentionMetadataError(f"no window given for KV group {g!r}")
            w = self.windows.get(g)
            # as build_attention_metadata: from the block holding the first new token's oldest visible key
            kv_start = np.zeros(B, dtype=np.int64) if w is None else (np.maximum(nc - w + 1, 0) // bs) * bs
            starts[g] = kv_start
            kps[g] = -(-int((ctx - kv_start).max()) // KV_BUCKET) * KV_BUCKET
        key = (n, Bp, tuple(sorted(kps.items())))
        e = self.graphs.get(key)
        if e is None:
            e = self._capture(n, Bp, kps)
            self.graphs[key] = e
        e.copied.synchronize()  # the previous call's transfer has left the staging buffer
        host = e.host.numpy()

        def part(name: str) -> np.ndarray:
            off, shape = e.layout[name]
            return host[off:off + int(np.prod(shape))].reshape(shape)

        part("ids")[:B] = ids if first_ids is None else 0
        part("ids")[B:] = 0
        part("positions")[:B] = nc
        part("positions")[B:] = 0
        steps = np.arange(n, dtype=np.int64)
        qpos = nc[None, :] + steps[:, None]  # [n, B] each step's query position
        for g, kv_start in starts.items():
            w = self.windows.get(g)
            table = part(f"table:{g}")
            nb = table.shape[1]
            table[:] = self.trash_block[g]  # padding rows (and unused columns) read the trash block
            first = kv_start // bs
            for b, s in enumerate(specs):
                t = s.block_tables[g]
                if len(t) <= (ctx[b] - 1) // bs:
                    raise AttentionMetadataError(f"group {g!r}: request {b} has {len(t)} blocks, needs "
                                                 f"{(ctx[b] - 1) // bs + 1} for {ctx[b]} tokens")
                row = t[first[b]:first[b] + nb]
                table[b, :len(row)] = row
            if (table[:B] < 0).any():
                bad = int(np.argmax((table[:B] < 0).any(axis=1)))
                raise AttentionMetadataError(f"group {g!r}: request {bad} reads a released (-1) block; "
                                             f"window={w}, num_cached={nc[bad]}")
            last = part(f"last:{g}")
            last[:B] = ctx - 1 - kv_start  # padding keys repeat the last real one
            last[B:] = 0
            lo, hi = part(f"lo:{g}"), part(f"hi:{g}")
            hi[:, :B] = qpos - kv_start[None, :] + 1  # causal: key position <= query position
            lo[:, :B] = 0 if w is None else np.maximum(qpos - w - kv_start[None, :] + 1, 0)
            hi[:, B:] = 1  # padding rows attend to the trash slot only
            lo[:, B:] = 0
            slots = part(f"slots:{g}")
            rows = np.arange(B)
            pos_block = (qpos - kv_start[None, :]) // bs  # [n, B], in the table window
            slots[:, :B] = table[rows[None, :], pos_block] * bs + qpos % bs
            slots[:, B:] = self.trash[g]
        e.dev.copy_(e.host, non_blocking=True)
        e.copied.record()
        if first_ids is not None:  # after the transfer, before the replay (stream order); padding rows keep 0
            off = e.layout["ids"][0]
            e.dev[off:off + B].copy_(first_ids)
        self._replay(e.graph, t_in, n)
        return e

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

    def _expand(self, part, keys: dict[str, torch.Tensor]) -> tuple[dict, dict]:
        """Per group, from the call's inputs: the gather list [Bp, Kp] (row b reads its table window
        up to key last[b], padding keys repeat that one) and the additive masks [n, Bp, 1, 1, Kp]
        (0 on keys lo[j, b] <= k < hi[j, b], else -inf): what build_attention_metadata makes."""
        bs = self.blocks.block_size
        gathers, biases = {}, {}
        for g, k in keys.items():
            kk = torch.minimum(k[None, :], part(f"last:{g}")[:, None])  # [Bp, Kp]
            gathers[g] = part(f"table:{g}").gather(1, kk // bs) * bs + kk % bs
            lo, hi = part(f"lo:{g}"), part(f"hi:{g}")
            valid = (k >= lo[:, :, None]) & (k < hi[:, :, None])  # [n, Bp, Kp]
            bias = torch.zeros(valid.shape, dtype=self.dtype, device=k.device).masked_fill_(~valid, float("-inf"))
            biases[g] = bias.view(*valid.shape[:2], 1, 1, valid.shape[2])
        return gathers, biases

    def _layout(self, n: int, Bp: int, kps: dict[str, int]) -> dict[str, tuple[int, tuple[int, ...]]]:
        bs = self.blocks.block_size
        shapes: dict[str, tuple[int, ...]] = {"ids": (Bp,), "positions": (Bp,)}
        for g, Kp in kps.items():
            shapes[f"table:{g}"] = (Bp, (Kp - 1) // bs + 1)
            shapes[f"last:{g}"] = (Bp,)
            shapes[f"lo:{g}"] = (n, Bp)
            shapes[f"hi:{g}"] = (n, Bp)
            shapes[f"slots:{g}"] = (n, Bp)
        layout, off = {}, 0
        for name, shape in shapes.items():
            layout[name] = (off, shape)
            off += int(np.prod(shape))
        return layout

    def _capture(self, n: int, Bp: int, kps: dict[str, int]) -> _Graph:
        dev = self.device
        layout = self._layout(n, Bp, kps)
        size = sum(int(np.prod(shape)) for _, shape in layout.values())
        host = torch.zeros(size, dtype=torch.long).pin_memory()
        buf = torch.zeros(size, dtype=torch.long, device=dev)

        def part(name: str) -> torch.Tensor:
            off, shape = layout[name]
            return buf[off:off + int(np.prod(shape))].view(shape)

        # a valid starting state for the warm-up runs: every row reads the trash slot only
        for g in kps:
            part(f"table:{g}").fill_(self.trash_block[g])
            part(f"hi:{g}").fill_(1)
            part(f"slots:{g}").fill_(self.trash[g])
        ids, pos = part("ids"), part("positions")
        keys = {g: torch.arange(Kp, dtype=torch.long, device=dev) for g, Kp in kps.items()}
        placeholder = {g: torch.ones((Bp, 1, 1, Kp), dtype=torch.bool, device=dev) for g, Kp in kps.items()}
        out = (torch.zeros((n, Bp), dtype=torch.long, device=dev) if n > 1 else None)
        steps = torch.arange(n, dtype=torch.long, device=dev)  # made before the capture: kept alive in `keep`

        def body() -> torch.Tensor:
            gathers, biases = self._expand(part, keys)
            cur = ids
            logits = None
            # every step's positions and rope rows in one gather each (a kernel per step each otherwise)
            all_pos = (pos[None, :] + steps[:, None]).view(-1) if n > 1 else pos
            all_ropes = {name: r(all_pos) for name, r in self.model.ropes.items()}
            for j in range(n):
                groups = {}
                for g, Kp in kps.items():
                    gm = GroupAttnMeta(window=self.windows.get(g), slot_mapping=part(f"slots:{g}")[j],
                                       gather_slots=gathers[g], mask=placeholder[g], num_seqs=Bp, max_q=1,
                                       max_kv=Kp, q_index=None, out_index=None)
                    gm._bias[self.dtype] = biases[g][j]
                    groups[g] = gm
                p = all_pos[j * Bp:(j + 1) * Bp]
                meta = AttentionMetadata(positions=p, groups=groups, num_tokens=Bp, num_seqs=Bp, max_q=1,
                                         uniform=True, query_start=list(range(Bp + 1)))
                ropes = {name: (c[j * Bp:(j + 1) * Bp], s[j * Bp:(j + 1) * Bp]) for name, (c, s) in all_ropes.items()}
                h = self.model(cur, p, meta, self.pool, ropes=ropes)
                if n > 1:  # the sampler's greedy choice (ties -> lowest id), straight into the output row
                    cur = self.model.greedy_ids(h, out=out[j])
                else:
                    logits = self.model.compute_logits(h)
            return out if n > 1 else logits

        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up (allocator, lazy init) outside the graph
                body()
        torch.cuda.current_stream(dev).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            result = body()
        copied = torch.cuda.Event()
        copied.record()
        return _Graph(graph, n, layout, host, buf, copied, result, (keys, placeholder, steps))
