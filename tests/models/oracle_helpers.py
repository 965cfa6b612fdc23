"""Shared by the model-family oracle tests: a tiny HF model with random weights
saved and reloaded into augury, a NaN-filled KV pool, and a driver that feeds
ragged steps through shuffled, reused blocks."""

from __future__ import annotations

import copy
import glob
import json
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from safetensors.torch import load_file

from augury.config import ModelConfig
from augury.layers.attention import SeqSpec, build_attention_metadata
from augury.models.registry import build_model


def randomize_hf(model: torch.nn.Module, seed: int, gemma: bool) -> None:
    """Larger-than-init random weights so every tensor visibly moves the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(0.3 * noise if gemma else 1.0 + 0.3 * noise)
            elif "embed" in name:
                p.copy_(0.5 * noise)
            else:
                p.copy_(noise * (0.5 / p.shape[-1] ** 0.5 if p.dim() > 1 else 0.1))


def hf_and_augury(hf_config, tmp_path, seed: int = 0, dtype=torch.float32):
    """Random HF fp32 model + the augury model loaded from its saved checkpoint."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager").float().eval()
    randomize_hf(hf, seed, gemma=hf_config.model_type.startswith("gemma"))
    hf.save_pretrained(tmp_path)
    model, cfg = load_augury(tmp_path, dtype)
    return hf, model, cfg


def load_augury(path, dtype=torch.float32):
    """config.json + *.safetensors written by save_pretrained -> (augury model, ModelConfig)."""
    with open(path / "config.json") as f:
        cfg = ModelConfig.from_hf_dict(json.load(f))
    model = build_model(cfg, "cpu", dtype, max_positions=512)
    tensors: dict[str, torch.Tensor] = {}
    for p in sorted(glob.glob(str(path / "*.safetensors"))):
        tensors.update(load_file(p))
    model.load_weights(tensors.items())
    return model, cfg


@torch.no_grad()
def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab] fp32 logits of one full (uncached) forward."""
    out = hf(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].float()


class SimplePool:
    """Per-layer [num_slots, Hkv, D] K/V, NaN-filled so any read of an unwritten slot shows."""

    def __init__(self, model, num_blocks: int, block_size: int, dtype=torch.float32, device="cpu") -> None:
        cfg = model.cfg
        self.block_size = block_size
        self.group_of_layer = model.kv_group_of_layer()
        shape = (num_blocks * block_size, cfg.num_kv_heads, cfg.head_dim)
        self.k = [torch.full(shape, float("nan"), dtype=dtype, device=device) for _ in self.group_of_layer]
        self.v = [torch.full(shape, float("nan"), dtype=dtype, device=device) for _ in self.group_of_layer]

    def poison_block(self, group: str, block: int) -> None:
        lo, hi = block * self.block_size, (block + 1) * self.block_size
        for i, g in enumerate(self.group_of_layer):
            if g == group:
                self.k[i][lo:hi] = float("nan")
                self.v[i][lo:hi] = float("nan")


class Driver:
    """Feeds steps of (request, new token ids) through the model like an engine would:
    shuffled block ids per group, sliding blocks released (-1, poisoned, reused) once
    they leave the window."""

    def __init__(self, model, num_blocks: int = 64, block_size: int = 4, seed: int = 0, release: bool = True):
        self.model = model
        self.bs = block_size
        w = model.embed_tokens.weight
        self.device = w.device
        self.pool = SimplePool(model, num_blocks, block_size, dtype=w.dtype, device=w.device)
        self.windows = model.kv_group_windows()
        rng = random.Random(seed)
        self.free = {}
        for g in self.windows:
            ids = list(range(num_blocks))
            rng.shuffle(ids)
            self.free[g] = ids
        self.tables: dict[str, dict[str, list[int]]] = {}
        self.lens: dict[str, int] = {}
        self.release = release

    @torch.no_grad()
    def step(self, work: list[tuple[str, list[int]]]) -> list[torch.Tensor]:
        """work: [(request id, new token ids)] -> per request logits [num_new, vocab]."""
        specs, ids = [], []
        for rid, toks in work:
            nc = self.lens.get(rid, 0)
            tables = self.tables.setdefault(rid, {g: [] for g in self.windows})
            need = -(-(nc + len(toks)) // self.bs)
            for g, t in tables.items():
                while len(t) < need:
                    t.append(self.free[g].pop())
            specs.append(SeqSpec(num_cached=nc, num_new=len(toks), block_tables={g: list(t) for g, t in tables.items()}))
            ids.extend(toks)
        meta = build_attention_metadata(specs, self.bs, self.windows, self.device)
        hidden = self.model(torch.tensor(ids, device=self.device), meta.positions, meta, self.pool)
        logits = self.model.compute_logits(hidden).cpu()
        qs = meta.query_start
        for rid, toks in work:
            self.lens[rid] = self.lens.get(rid, 0) + len(toks)
            if self.release:
                self._release_out_of_window(rid)
        return [logits[qs[i] : qs[i + 1]] for i in range(len(work))]

    def _release_out_of_window(self, rid: str) -> None:
        for g, w in self.windows.items():
            if w is None:
                continue
            t = self.tables[rid][g]
            lo = max(0, self.lens[rid] - w + 1) // self.bs
            for i in range(min(lo, len(t))):
                if t[i] >= 0:
                    self.pool.poison_block(g, t[i])
                    self.free[g].append(t[i])  # popped next: reused by the next allocation
                    t[i] = -1


ATOL = 1e-4


def close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(a, b, atol=ATOL, rtol=1e-4, msg=lambda m: f"{what}: {m}")


def prompt(n: int, vocab: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def check_prefill(hf, model, n: int = 13) -> None:
    ids = prompt(n, model.cfg.vocab_size, 1)
    (got,) = Driver(model).step([("a", ids)])
    close(got, hf_logits(hf, ids), "prefill")


def check_decode(hf, model, n_prefill: int = 5, n_decode: int = 9, **driver_kw) -> None:
    ids = prompt(n_prefill + n_decode, model.cfg.vocab_size, 2)
    ref = hf_logits(hf, ids)
    d = Driver(model, **driver_kw)
    rows = [d.step([("a", ids[:n_prefill])])[0]]
    for i in range(n_prefill, len(ids)):
        rows.append(d.step([("a", ids[i : i + 1])])[0])
    close(torch.cat(rows), ref, "cached decode")


def check_ragged(hf, model, **driver_kw) -> None:
    """Three requests, different lengths and num_cached, prefill chunk + decode + verify window
    in one forward, then a second mixed step."""
    V = model.cfg.vocab_size
    seqs = {"a": prompt(20, V, 3), "b": prompt(15, V, 4), "c": prompt(11, V, 5)}
    refs = {r: hf_logits(hf, s) for r, s in seqs.items()}
    d = Driver(model, **driver_kw)
    got = {r: [] for r in seqs}
    # warm-up: a and b get some cache, c nothing
    for rid, lo, hi in (("a", 0, 6), ("b", 0, 10)):
        got[rid].append(d.step([(rid, seqs[rid][lo:hi])])[0])
    plan = [
        [("b", 10, 11), ("a", 6, 13), ("c", 0, 4)],  # decode, prefill chunk, fresh prefill
        [("c", 4, 7), ("a", 13, 14), ("b", 11, 15)],  # verify-like window, decode, chunk
        [("a", 14, 20), ("c", 7, 8)],
        [("c", 8, 11)],
    ]
    for work in plan:
        outs = d.step([(rid, seqs[rid][lo:hi]) for rid, lo, hi in work])
        for (rid, _, _), o in zip(work, outs):
            got[rid].append(o)
    for rid in seqs:
        close(torch.cat(got[rid]), refs[rid], f"ragged batch, request {rid}")


def check_bf16(hf, path, n: int = 24) -> None:
    """bf16 augury stays as close to HF fp32 as HF's own bf16 run does (ragged decode path)."""
    model16, _ = load_augury(path, torch.bfloat16)
    ids = prompt(n, model16.cfg.vocab_size, 7)
    ref = hf_logits(hf, ids)
    hf_err = (hf_logits(copy.deepcopy(hf).to(torch.bfloat16), ids) - ref).abs().max().item()
    d = Driver(model16)
    got = torch.cat([d.step([("a", ids[: n - 4])])[0]] + [d.step([("a", [t])])[0] for t in ids[n - 4 :]])
    assert got.dtype == torch.float32
    err = (got - ref).abs().max().item()
    assert err <= 2 * hf_err + 1e-2, (err, hf_err)
