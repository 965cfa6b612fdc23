"""`augury eval kv`: what each KV codec costs in bits and in model quality.

For every scheme: stored bits per K/V element (scales and zeros included),
compression vs a bf16 cache, mean KL(native || scheme) of next-token
distributions over teacher-forced passages, greedy (argmax) agreement with
native on the same positions, and passkey retrieval at long context.

Teacher forcing is one forward per passage: attention writes each token's K/V
through the codec before reading, so position t sees encoded K/V of tokens
<= t, exactly what token-by-token decoding would see.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import torch

from augury.eval.passages import PASSAGES, PASSKEY_FILLER
from augury.kv.block_manager import KVGroup
from augury.kv.codecs import EncodedStore, KVCodec, parse_codec
from augury.kv.pool import KVPool
from augury.layers.attention import SeqSpec, build_attention_metadata

DEFAULT_SCHEMES = ("native", "affine8", "affine4", "affine4-rk", "turbo:k8v3", "turbo:k8v4", "turbo:k4v3",
                   "turbo:rk4v3", "turbo:rk4v4", "turbo:ck4v3", "turbo:rk5v3", "turbo:rk3v3", "turbo:ck3v3",
                   "turbo:ck2v3",
                   # QJL 1-bit key residual (+1 + 16/head_dim key bits): compare rk4v3+qjl with rk5v3,
                   # rk3v3+qjl with rk4v3, ck2v3+qjl (a biased base) with ck3v3
                   "turbo:rk4v3+qjl", "turbo:rk3v3+qjl", "turbo:ck2v3+qjl")
BLOCK = 16


@dataclass
class SchemeResult:
    name: str
    codec_id: str
    bits_per_element: float
    compression: float  # vs a bf16 cache
    kl: float  # mean KL(native || scheme), nats per position
    greedy_agreement: float  # fraction of positions whose argmax matches native
    passkey: float  # fraction of passkey trials retrieved
    layer_codecs: dict[str, str] = field(default_factory=dict)  # layer group ("full"/"sliding") -> codec id


class SequenceRunner:
    """One sequence at a time through the model over a pool of the given codec."""

    def __init__(self, model: torch.nn.Module, cfg, dtype: torch.dtype, device: torch.device, max_tokens: int):
        self.model, self.cfg, self.dtype, self.device = model, cfg, dtype, device
        self.windows = model.kv_group_windows()
        self.num_blocks = -(-max_tokens // BLOCK) + 1
        self.tables = {g: list(range(self.num_blocks)) for g in self.windows}

    def pool(self, codec: KVCodec) -> KVPool:
        groups = [KVGroup(g, self.num_blocks, w) for g, w in self.windows.items()]
        return KVPool.allocate(self.cfg, groups, BLOCK, self.dtype, self.device, codec)

    @torch.inference_mode()
    def forward(self, pool: KVPool, ids: list[int], num_cached: int, last_only: bool = False) -> torch.Tensor:
        """ids: tokens at positions [num_cached, num_cached + len(ids)) -> logits [len(ids), V] float32
        (or [1, V] for the last position: a 2k-token prompt times a 262k vocabulary is 2 GB of logits)."""
        meta = build_attention_metadata([SeqSpec(num_cached, len(ids), self.tables)], BLOCK, self.windows,
                                        self.device)
        h = self.model(torch.tensor(ids, dtype=torch.long, device=self.device), meta.positions, meta, pool)
        return self.model.compute_logits(h[-1:] if last_only else h).float()

    def greedy(self, codec: KVCodec, prompt: list[int], n: int) -> list[int]:
        pool = self.pool(codec)
        logits = self.forward(pool, prompt, 0, last_only=True)
        out = [int(logits[-1].argmax())]
        for i in range(n - 1):
            logits = self.forward(pool, [out[-1]], len(prompt) + i, last_only=True)
            out.append(int(logits[-1].argmax()))
        return out


def layer_codecs(pool: KVPool) -> dict[str, str]:
    """Which codec each layer group (full / sliding-window) actually stores its K/V with, read off the pool."""
    out: dict[str, str] = {}
    for name, k, v in zip(pool.group_of_layer, pool.k, pool.v):
        kid = k.codec.id if isinstance(k, EncodedStore) else "native" if isinstance(k, torch.Tensor) else "mixed"
        vid = v.codec.id if isinstance(v, EncodedStore) else "native" if isinstance(v, torch.Tensor) else "mixed"
        cid = "native" if kid == vid == "native" else f"k={kid};v={vid}"
        prev = out.setdefault(name, cid)
        if prev != cid:  # layers of one group disagree: say so rather than pick one
            out[name] = f"{prev}|{cid}"
    return out


def passkey_prompts(tokenizer, ctx_tokens: int, depths=(0.2, 0.5, 0.8)) -> list[tuple[list[int], str]]:
    """(prompt ids, key) with the key sentence at each relative depth of ~ctx_tokens of filler."""
    per = len(tokenizer.encode(PASSKEY_FILLER * 10)) / 10
    reps = max(1, int(ctx_tokens / per))
    out = []
    for i, d in enumerate(depths):
        key = str(10000 + (7919 * (i + 3)) % 89999)
        before = int(reps * d)
        text = (PASSKEY_FILLER * before + f"The pass key is {key}. Remember it. {key} is the pass key. "
                + PASSKEY_FILLER * (reps - before) + "What is the pass key? The pass key is")
        out.append((tokenizer.encode(text), key))
    return out


def evaluate_kv(loaded, schemes=DEFAULT_SCHEMES, passage_tokens: int = 128, passkey_ctx: int = 2048,
                passkey_trials: int = 3, progress=None, num_passages: int | None = None) -> list[SchemeResult]:
    """`loaded` is an engine LoadedModel. Schemes are codec names (see augury.kv.codecs.policy).
    num_passages: use the first N of the fixed passages (None = all)."""
    tok, cfg = loaded.tokenizer, loaded.config
    texts = [tok.encode(p)[:passage_tokens] for p in PASSAGES[:num_passages]]
    keys = passkey_prompts(tok, passkey_ctx, (0.2, 0.5, 0.8)[:passkey_trials]) if passkey_trials else []
    longest = max([len(t) for t in texts] + [len(p) + 16 for p, _ in keys])
    runner = SequenceRunner(loaded.model, cfg, loaded.dtype, loaded.device, longest)
    codecs = [parse_codec(s) for s in schemes]
    for c in codecs:
        c.check_head_dim(cfg.head_dim)
    native = parse_codec("native")
    ref = [torch.log_softmax(runner.forward(runner.pool(native), t, 0), -1) for t in texts]
    results = []
    for name, codec in zip(schemes, codecs):
        kls, agree, n = 0.0, 0, 0
        for t, lp_ref in zip(texts, ref):
            lp = torch.log_softmax(runner.forward(runner.pool(codec), t, 0), -1)
            kls += float((lp_ref.exp() * (lp_ref - lp)).sum(-1).clamp_min(0).sum())
            agree += int((lp.argmax(-1) == lp_ref.argmax(-1)).sum())
            n += lp.shape[0]
        hits = 0
        for prompt, key in keys:
            text = tok.decode(runner.greedy(codec, prompt, 8))
            hits += int(key in text)
        bits = 16.0 if codec.is_native else codec.bits_per_element(cfg.head_dim, torch.bfloat16)
        r = SchemeResult(name, codec.id, round(bits, 4), round(16.0 / bits, 3), kls / n, agree / n,
                         hits / len(keys) if keys else float("nan"), layer_codecs(runner.pool(codec)))
        results.append(r)
        if progress:
            progress(r)
    return results


def _sliding_note(r: SchemeResult) -> str:
    """What the sliding-window layers stored: '-' (model has none), 'same' (as full layers) or their codec."""
    if "sliding" not in r.layer_codecs:
        return "-"
    return "same" if r.layer_codecs["sliding"] == r.layer_codecs.get("full", r.codec_id) else r.layer_codecs["sliding"]


def run_meta(loaded, model: str, dtype: str, num_passages: int | None, passage_tokens: int, passkey_ctx: int,
             passkey_trials: int) -> dict:
    """The settings a JSON result was measured under (so two files can be compared honestly)."""
    cfg = loaded.config
    n_sliding = sum(1 for i in range(cfg.num_layers) if cfg.is_sliding(i))
    return {"model": model, "dtype": dtype, "passages": len(PASSAGES[:num_passages]),
            "passage_tokens": passage_tokens, "passkey_ctx": passkey_ctx, "passkey_trials": passkey_trials,
            "head_dim": cfg.head_dim, "num_layers": cfg.num_layers, "sliding_layers": n_sliding,
            "sliding_window": cfg.sliding_window}


def format_table(results: list[SchemeResult]) -> str:
    rows = [f"{'scheme':<16} {'bits/elem':>9} {'vs bf16':>8} {'mean KL':>10} {'greedy':>7} {'passkey':>8}  sliding"]
    for r in results:
        rows.append(f"{r.name:<16} {r.bits_per_element:>9.3f} {r.compression:>7.2f}x {r.kl:>10.5f} "
                    f"{r.greedy_agreement:>7.3f} {r.passkey:>8.2f}  {_sliding_note(r)}")
    return "\n".join(rows)


def to_json(results: list[SchemeResult], meta: dict | None = None) -> str:
    """{"schemes": [...]} plus, when given, the run's settings under "meta"."""
    doc: dict = {"schemes": [asdict(r) for r in results]}
    if meta:
        doc["meta"] = meta
    return json.dumps(doc, indent=2)
