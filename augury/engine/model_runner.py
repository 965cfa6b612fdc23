"""ModelRunner: turns a scheduled step into one batched forward and logits.

Builds the flat ragged batch (token ids, positions, block tables, draft
slots), runs the model once and returns the logits of the rows that are
sampled: for a request that reaches its end this step, the last confirmed
token's row plus one row per draft token (the verify window).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from augury.config import ModelConfig
from augury.engine.request import Request
from augury.engine.scheduler import SchedulerOutput
from augury.kv.block_manager import BlockManager
from augury.kv.pool import KVPool
from augury.layers.attention import SeqSpec, build_attention_metadata


@dataclass
class BurstRun:
    """A launched decode burst (ModelRunner.launch_burst)."""

    reqs: list[Request]  # in the caller's order
    order: list[int]  # batch column -> index in reqs (requests of one KV codec together)
    n: int  # steps
    last: torch.Tensor  # [B] device, by column: the last step's argmax, a chained burst's first input
    host: torch.Tensor  # [n, >= B] tokens by column on the host (pinned on CUDA), valid once `ready` is done
    ready: object | None  # torch.cuda.Event of the device->host copy; None: already on the host


@dataclass
class StepLogits:
    logits: torch.Tensor  # [R, V] float32, rows of all sampled requests in schedule order
    row_start: list[int]  # per scheduled seq: first row index (-1 if not sampled)
    num_rows: list[int]  # per scheduled seq: 1 + num_draft if sampled else 0


class ModelRunner:
    def __init__(self, model: torch.nn.Module, cfg: ModelConfig, pool: KVPool, blocks: BlockManager,
                 device: torch.device):
        self.model = model
        self.cfg = cfg
        self.pool = pool
        self.blocks = blocks
        self.device = device
        self.windows = {name: g.window for name, g in blocks.groups.items()}
        self.class_ranges = pool.class_ranges  # None unless the pool stores several codecs
        self.graphs = None  # CudaGraphDecoder, set by the engine on CUDA

    def enable_cuda_graphs(self, dtype: torch.dtype, max_batch: int) -> None:
        from augury.engine.cuda_graphs import CudaGraphDecoder

        self.graphs = CudaGraphDecoder(self.model, self.pool, self.blocks, self.windows, self.device, dtype,
                                       max_batch)

    @torch.inference_mode()
    def launch_burst(self, reqs: list[Request], n: int, after: BurstRun | None = None) -> BurstRun:
        """Start n greedy decode steps for requests that each decode one token (engine/burst.py);
        the argmax feeds the next step on the device and nothing waits for the result.

        `after`: a burst of the same requests still in flight; this one follows it on the device
        (first input = its last argmax row, positions n_after further on), so the host never sees
        the token in between. The block tables must already cover every position written."""
        if after is not None:
            assert after.reqs == reqs, "a chained burst runs the requests of the burst before it"
            order, skip = after.order, after.n
        else:
            order, skip = sorted(range(len(reqs)), key=lambda i: reqs[i].kv_key), 0
        cols = [reqs[i] for i in order]
        specs = [SeqSpec(num_cached=r.num_computed + skip, num_new=1,
                         block_tables=self.blocks.block_tables(r.request_id), kv_key=r.kv_key) for r in cols]
        ids = None if after is not None else [r.all_ids[r.num_computed] for r in cols]
        if self.graphs is not None and self.graphs.usable(specs):
            got = self.graphs.run_burst(ids, specs, n, first=after.last if after is not None else None)
            return BurstRun(reqs, order, n, got.dev[-1], got.host, got.ready)
        cur = after.last if after is not None else torch.tensor(ids, dtype=torch.long, device=self.device)
        steps = []
        for j in range(n):
            step_specs = [SeqSpec(s.num_cached + j, 1, s.block_tables, s.kv_key) for s in specs]
            meta = build_attention_metadata(step_specs, self.pool.block_size, self.windows, self.device,
                                            self.class_ranges)
            # the sampler's greedy choice: argmax of the logits (ties -> lowest id)
            cur = self.model.greedy_ids(self.model(cur, meta.positions, meta, self.pool))
            steps.append(cur)
        toks = torch.stack(steps)
        if toks.device.type != "cuda":
            return BurstRun(reqs, order, n, toks[-1], toks, None)
        host = torch.empty(toks.shape, dtype=toks.dtype, pin_memory=True)
        host.copy_(toks, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return BurstRun(reqs, order, n, toks[-1], host, ready)

    @staticmethod
    def burst_tokens(run: BurstRun) -> list[list[int]]:
        """Wait for a launched burst: per request (in `run.reqs` order), its n tokens."""
        if run.ready is not None:
            run.ready.synchronize()
        host = run.host[:, :len(run.reqs)].tolist()
        result: list[list[int]] = [[] for _ in run.reqs]
        for col, i in enumerate(run.order):
            result[i] = [host[j][col] for j in range(run.n)]
        return result

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> StepLogits:
        ids: list[int] = []
        specs: list[SeqSpec] = []
        rows: list[int] = []
        row_start = [-1] * len(out.seqs)
        num_rows = [0] * len(out.seqs)
        # requests of one KV codec together, and within them single-token decodes first:
        # attention then runs the decodes unpadded (layers/attention.py)
        order = sorted(range(len(out.seqs)), key=lambda i: (out.seqs[i].request.kv_key,
                                                            out.seqs[i].num_new + out.seqs[i].num_draft != 1))
        offset = 0
        for i in order:
            s = out.seqs[i]
            req = s.request
            start = req.num_computed
            toks = req.all_ids[start:start + s.num_new] + req.draft_ids[:s.num_draft]
            ids.extend(toks)
            specs.append(SeqSpec(num_cached=start, num_new=len(toks),
                                 block_tables=self.blocks.block_tables(req.request_id), kv_key=req.kv_key))
            if s.sample:
                row_start[i] = len(rows)
                k = 1 + s.num_draft
                first = offset + s.num_new - 1
                rows.extend(range(first, first + k))
                num_rows[i] = k
            offset += len(toks)
        if self.graphs is not None and self.graphs.usable(specs) and rows == list(range(len(ids))):
            return StepLogits(self.graphs.run(ids, specs), row_start, num_rows)
        meta = build_attention_metadata(specs, self.pool.block_size, self.windows, self.device, self.class_ranges)
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        hidden = self.model(input_ids, meta.positions, meta, self.pool)
        if rows:
            if len(rows) == len(ids):
                sel = hidden
            else:
                sel = hidden.index_select(0, torch.tensor(rows, dtype=torch.long, device=self.device))
            logits = self.model.compute_logits(sel).float()
        else:
            logits = torch.empty(0, self.cfg.vocab_size)
        return StepLogits(logits, row_start, num_rows)
