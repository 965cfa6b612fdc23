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
from augury.engine.scheduler import SchedulerOutput
from augury.kv.block_manager import BlockManager
from augury.kv.pool import KVPool
from augury.layers.attention import SeqSpec, build_attention_metadata


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
    def execute_burst(self, out: SchedulerOutput, n: int) -> list[list[int]]:
        """n greedy decode steps for a pure-decode step (engine/burst.py): per scheduled seq,
        its n tokens. The argmax feeds the next step on the device; one host sync at the end."""
        order = sorted(range(len(out.seqs)), key=lambda i: out.seqs[i].request.kv_key)
        reqs = [out.seqs[i].request for i in order]
        ids = [r.all_ids[r.num_computed] for r in reqs]
        specs = [SeqSpec(num_cached=r.num_computed, num_new=1, block_tables=self.blocks.block_tables(r.request_id),
                         kv_key=r.kv_key) for r in reqs]
        if self.graphs is not None and self.graphs.usable(specs):
            toks = self.graphs.run_burst(ids, specs, n)  # [n, B]
        else:
            cur = torch.tensor(ids, dtype=torch.long, device=self.device)
            steps = []
            for j in range(n):
                step_specs = [SeqSpec(s.num_cached + j, 1, s.block_tables, s.kv_key) for s in specs]
                meta = build_attention_metadata(step_specs, self.pool.block_size, self.windows, self.device,
                                                self.class_ranges)
                # the sampler's greedy choice: argmax of the float32 logits (ties -> lowest id)
                cur = self.model.compute_logits(self.model(cur, meta.positions, meta, self.pool)).float().argmax(-1)
                steps.append(cur)
            toks = torch.stack(steps)
        host = toks.cpu().tolist()
        result: list[list[int]] = [[] for _ in out.seqs]
        for col, i in enumerate(order):
            result[i] = [host[j][col] for j in range(n)]
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
