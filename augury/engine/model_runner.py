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
