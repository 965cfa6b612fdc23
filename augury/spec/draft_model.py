"""Draft-model speculation: a second (small) model drafts, the target verifies.

The drafter keeps its own paged KV pool and block manager (per-request state:
how many of the request's tokens its KV covers). Each round it catches up on
the tokens the target confirmed since last time, then drafts k tokens one
batched forward at a time, each chosen with the request's own sampler (so
the verifier has the draft probabilities q for rejection sampling). After
verification it rolls its KV back to what the target kept.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

import torch

from augury.config import EngineConfig, ModelConfig
from augury.engine.request import Request
from augury.engine.sampler import SamplingRow, draw_from_logprobs, processed_logprobs
from augury.kv.block_manager import BlockManager
from augury.kv.pool import KVPool, plan_groups
from augury.layers.attention import SeqSpec, build_attention_metadata
from augury.spec.base import Draft

if TYPE_CHECKING:
    from augury.engine.engine import Engine

PROBE_TEXTS = [
    "Hello, world!", "The quick brown fox jumps over the lazy dog.", "def f(x):\n    return x * 2\n",
    "1234567890", "naïve café — 日本語 🙂", "  two  spaces\tand tabs", "<|im_start|>user\nhi<|im_end|>",
]


class TokenizerMismatch(ValueError):
    pass


def probe_tokenizers(target_tok, draft_tok, target_vocab: int, draft_vocab: int) -> None:
    """Refuse draft/target pairs whose token ids do not mean the same thing."""
    problems = []
    if draft_vocab > target_vocab:
        problems.append(f"draft vocabulary {draft_vocab} > target vocabulary {target_vocab}")
    # the token <-> id map over the shared vocabulary (cheap: one dict lookup per id)
    n = min(target_tok.vocab_size, draft_tok.vocab_size)
    bad = next((i for i in range(n) if target_tok.id_to_token(i) != draft_tok.id_to_token(i)), None)
    if bad is not None:
        problems.append(f"token id {bad} is {target_tok.id_to_token(bad)!r} in the target but "
                        f"{draft_tok.id_to_token(bad)!r} in the draft")
    for text in PROBE_TEXTS:
        a, b = target_tok.encode(text, add_special_tokens=False), draft_tok.encode(text, add_special_tokens=False)
        if a != b:
            problems.append(f"{text!r} tokenizes differently ({a[:6]}... vs {b[:6]}...)")
            break
    if set(target_tok.eos_token_ids) != set(draft_tok.eos_token_ids) and not (
            set(target_tok.eos_token_ids) & set(draft_tok.eos_token_ids)):
        problems.append(f"end-of-sequence ids differ ({target_tok.eos_token_ids} vs {draft_tok.eos_token_ids})")
    if target_tok.bos_token_id != draft_tok.bos_token_id:
        problems.append(f"BOS ids differ ({target_tok.bos_token_id} vs {draft_tok.bos_token_id})")
    if problems:
        raise TokenizerMismatch("the draft model's tokenizer is not the target's family: " + "; ".join(problems)
                                + ". Pick a draft model from the same tokenizer family.")


class ModelDrafter:
    name = "draft-model"

    def __init__(self, model: torch.nn.Module, cfg: ModelConfig, device: torch.device, dtype: torch.dtype,
                 budget_bytes: int, block_size: int, max_seqs: int, max_batched_tokens: int,
                 name: str = "draft-model"):
        self.name = name
        self.model = model
        self.cfg = cfg
        self.device = device
        groups = plan_groups(cfg, dtype, budget_bytes, block_size, max_seqs, max_batched_tokens)
        self.blocks = BlockManager(groups, block_size, enable_prefix_caching=False)
        self.pool = KVPool.allocate(cfg, groups, block_size, dtype, device)
        self.windows = {g.name: g.window for g in groups}
        self.computed: dict[str, int] = {}  # request id -> tokens whose draft KV is valid

    @classmethod
    def from_path(cls, engine: "Engine", path: str) -> "ModelDrafter":
        from augury.engine.loader import load_model

        ec = engine.config
        loaded = load_model(dataclasses.replace(EngineConfig(model=path), device=str(engine.loaded.device),
                                                dtype=_dtype_name(engine.loaded.dtype), progress=ec.progress,
                                                weights=ec.draft_weights))
        probe_tokenizers(engine.tokenizer, loaded.tokenizer, engine.model_config.vocab_size, loaded.config.vocab_size)
        return cls(loaded.model, loaded.config, loaded.device, loaded.dtype, engine.pool.nbytes() // 4,
                   ec.block_size, ec.max_num_seqs, ec.max_num_batched_tokens)

    # ---- DraftSource ------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, reqs: Sequence[Request], max_tokens: Sequence[int]) -> list[Draft]:
        drafts = [Draft([]) for _ in reqs]
        live: list[int] = []
        for i, (req, k) in enumerate(zip(reqs, max_tokens)):
            if k > 0 and self._reserve(req, req.num_tokens + k - 1):
                live.append(i)
        if not live:
            return drafts
        probs: dict[int, list[torch.Tensor]] = {i: [] for i in live}
        # round 0: catch up on confirmed tokens (incl. the pending one) → first draft
        feeds = {i: reqs[i].all_ids[self.computed[reqs[i].request_id]:] for i in live}
        for step in range(max(max_tokens[i] for i in live)):
            batch = [i for i in live if len(drafts[i].ids) < max_tokens[i]]
            if not batch:
                break
            logits = self._forward([reqs[i] for i in batch], [feeds[i] for i in batch])
            rows = [SamplingRow(reqs[i].params, reqs[i].prompt_ids, reqs[i].output_ids + drafts[i].ids,
                                reqs[i].generator) for i in batch]
            logp = processed_logprobs(logits, rows)
            toks = draw_from_logprobs(logp, [reqs[i].generator for i in batch]).tolist()
            sampled = any(reqs[i].generator is not None for i in batch)
            q = logp.exp() if sampled else None
            for j, i in enumerate(batch):
                drafts[i].ids.append(toks[j])
                if q is not None:
                    probs[i].append(q[j])
                feeds[i] = [toks[j]]
        for i in live:
            if reqs[i].generator is not None and probs[i]:
                drafts[i].probs = torch.stack(probs[i])
        return drafts

    def on_verified(self, req: Request, num_accepted: int) -> None:
        rid = req.request_id
        if rid in self.computed:
            self.computed[rid] = min(self.computed[rid], req.num_computed)
            self.blocks.trim(rid, self.computed[rid])

    def release(self, req: Request) -> None:
        self.blocks.free(req.request_id)
        self.computed.pop(req.request_id, None)

    # ---- internals -------------------------------------------------------------------
    def _reserve(self, req: Request, num_tokens: int) -> bool:
        rid = req.request_id
        if rid not in self.computed:
            if self.blocks.admit(rid, req.all_ids, max_new=1 << 30) is None:
                return False
            self.computed[rid] = 0
        return self.blocks.grow(rid, num_tokens)

    def _forward(self, reqs: list[Request], feeds: list[list[int]]) -> torch.Tensor:
        """Ragged forward of `feeds[i]` after each request's valid draft KV → last-row logits."""
        specs, ids, last = [], [], []
        for req, toks in zip(reqs, feeds):
            c = self.computed[req.request_id]
            specs.append(SeqSpec(num_cached=c, num_new=len(toks), block_tables=self.blocks.block_tables(req.request_id)))
            ids.extend(toks)
            last.append(len(ids) - 1)
            self.computed[req.request_id] = c + len(toks)
        meta = build_attention_metadata(specs, self.pool.block_size, self.windows, self.device)
        hidden = self.model(torch.tensor(ids, dtype=torch.long, device=self.device), meta.positions, meta, self.pool)
        sel = hidden.index_select(0, torch.tensor(last, dtype=torch.long, device=self.device))
        return self.model.compute_logits(sel).float()


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
