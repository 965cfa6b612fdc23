"""LayerSkip-style self-speculation: the target's first L layers draft.

The drafter is a view of the target (its embedding, first L layers, final
norm and LM head — no extra weights) with its own small KV pool for those L
layers, driven exactly like a draft model.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from torch import nn

from augury.spec.draft_model import ModelDrafter

if TYPE_CHECKING:
    from augury.engine.engine import Engine


class EarlyExitLM(nn.Module):
    """The first `num_layers` layers of a CausalLM, then its final norm and head."""

    def __init__(self, target: nn.Module, num_layers: int):
        super().__init__()
        self.target = target
        self.num_layers = num_layers

    def forward(self, input_ids, positions, meta, kv):
        t = self.target
        ropes = {name: r(positions) for name, r in t.ropes.items()}
        return t.norm(t.run_layers(t.embed_tokens(input_ids), ropes, meta, kv, self.num_layers))

    def compute_logits(self, hidden):
        return self.target.compute_logits(hidden)

    def greedy_ids(self, hidden, out=None):
        return self.target.greedy_ids(hidden, out)


def layerskip_drafter(engine: "Engine", num_layers: int | None) -> ModelDrafter:
    cfg = engine.model_config
    n = num_layers or max(1, cfg.num_layers // 4)
    if not 1 <= n < cfg.num_layers:
        raise ValueError(f"--spec-layers {n}: must be in 1..{cfg.num_layers - 1} for this model")
    sub_cfg = dataclasses.replace(cfg, num_layers=n, layer_types=cfg.layer_types[:n] if cfg.layer_types else ())
    ec = engine.config
    model = EarlyExitLM(engine.loaded.model, n)
    budget = max(engine.pool.nbytes() * n // cfg.num_layers // 2, 1 << 20)
    return ModelDrafter(model, sub_cfg, engine.loaded.device, engine.loaded.dtype, budget, ec.block_size,
                        ec.max_num_seqs, ec.max_num_batched_tokens, name="layerskip")
