"""Argument parsing for `augury eval kv` and `augury fit` (wired in by augury.cli)."""

from __future__ import annotations

import argparse
import sys


def _add_kv_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-bits", type=int, default=None, help="affine KV bits (mlx-lm's --kv-bits)")
    p.add_argument("--kv-group-size", type=int, default=None, help="KV quantization group size")
    p.add_argument("--kv-quant", default=None,
                   help="KV codec: native | affine8 | affine4 | turbo[:k8v3] (suffix +qjl: 1-bit key residual)")


def add_eval_fit_parsers(sub) -> None:
    e = sub.add_parser("eval", help="quality evaluations")
    esub = e.add_subparsers(dest="eval_cmd", required=True)
    kv = esub.add_parser("kv", help="KV codecs: bits, compression, KL vs native, greedy agreement, passkey")
    kv.add_argument("--model", default="smollm2")
    kv.add_argument("--device", default="cpu")
    kv.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    kv.add_argument("--schemes", default=None, help="comma-separated codec names (default: the standard set)")
    kv.add_argument("--passage-tokens", type=int, default=128)
    kv.add_argument("--passages", type=int, default=None, help="use the first N fixed passages (default: all)")
    kv.add_argument("--passkey-ctx", type=int, default=2048, help="passkey prompt length in tokens")
    kv.add_argument("--passkey-trials", type=int, default=3, help="0 skips the passkey check")
    kv.add_argument("--json", action="store_true", help='print {"schemes": [...]}')
    kv.add_argument("--out", default=None, help="also write the JSON document to this file")
    kv.set_defaults(func=cmd_eval_kv)

    f = sub.add_parser("fit", help="memory needed at a context/batch/codec, and the longest context that fits")
    f.add_argument("--model", default="smollm2")
    f.add_argument("--ctx", type=int, required=True)
    f.add_argument("--batch", type=int, default=1)
    f.add_argument("--kv", default=None, help="KV codec name (same as --kv-quant)")
    _add_kv_flags(f)
    f.add_argument("--weights", default="native", choices=["native", "int8", "int4"])
    f.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    f.add_argument("--budget", default=None, help="memory budget (e.g. 24GiB) for the longest-context answer")
    f.add_argument("--max-batched-tokens", type=int, default=512)
    f.add_argument("--json", action="store_true")
    f.set_defaults(func=cmd_fit)


def cmd_eval_kv(a: argparse.Namespace) -> int:
    import time

    from augury.config import EngineConfig
    from augury.engine.loader import load_model
    from augury.eval.kv import DEFAULT_SCHEMES, evaluate_kv, format_table, run_meta, to_json

    schemes = tuple(s.strip() for s in a.schemes.split(",")) if a.schemes else DEFAULT_SCHEMES
    lm = load_model(EngineConfig(model=a.model, device=a.device, dtype=a.dtype, progress=not a.json))
    t0 = time.perf_counter()
    meta = run_meta(lm, a.model, a.dtype, a.passages, a.passage_tokens, a.passkey_ctx, a.passkey_trials)
    done = []

    def save(partial: bool) -> str:
        meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
        doc = to_json(done, {**meta, "partial": True} if partial else meta)
        if a.out:  # rewritten after every scheme: a long CPU run that is stopped keeps what it measured
            with open(a.out, "w") as f:
                f.write(doc + "\n")
        return doc

    def progress(r) -> None:
        done.append(r)
        save(partial=True)
        if not a.json:
            print(f"  {r.name} done", file=sys.stderr)

    res = evaluate_kv(lm, schemes, a.passage_tokens, a.passkey_ctx, a.passkey_trials, progress=progress,
                      num_passages=a.passages)
    doc = save(partial=False)
    print(doc if a.json else format_table(res))
    return 0


def cmd_fit(a: argparse.Namespace) -> int:
    import json

    import torch

    from augury.fit import fit, format_report
    from augury.kv.codecs import codec_from_flags
    from augury.kv.pool import parse_bytes
    from augury.weights.loader import load_checkpoint

    cfg = load_checkpoint(a.model, progress=False).model_config()
    codec = codec_from_flags(a.kv_bits, a.kv_group_size, a.kv or a.kv_quant)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[a.dtype]
    budget = parse_bytes(a.budget) if a.budget else None
    r = fit(cfg, a.ctx, a.batch, codec, a.weights, dtype, budget, prefill_chunk=a.max_batched_tokens)
    print(json.dumps(r.as_dict(), indent=2) if a.json else format_report(a.model, a.ctx, a.batch, r))
    return 0
