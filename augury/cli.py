"""`augury serve | generate | pull | models | bench` — argument parsing only."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from augury.config import ConfigError, EngineConfig


def _add_engine_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and engine")
    g.add_argument("--model", default="smollm2", help="registered name (see `augury models`), HF directory or .gguf path")
    g.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--weights", default="native", choices=["native", "int8", "int4"],
                   help="weight-only quantization of the linear layers")
    g.add_argument("--kv-budget", default=None, help="KV pool size: bytes (2GiB) or a fraction of free memory (0.3)")
    g.add_argument("--max-batch", type=int, default=16, help="most requests decoded together")
    g.add_argument("--max-batched-tokens", type=int, default=512, help="per-step token budget (prefill chunk)")
    g.add_argument("--max-model-len", type=int, default=None, help="context window cap")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--threads", type=int, default=None, help="CPU threads (torch intra-op)")
    g.add_argument("--quiet", action="store_true", help="no progress bars")
    g.add_argument("--decode-burst", type=int, default=None,
                   help="greedy decode steps computed per engine step when every request is plain greedy "
                        "(default: 8 with CUDA graphs, off on CPU; 0 = off)")
    g.add_argument("--compile", action="store_true",
                   help="torch.compile the forward (dynamic shapes; the first start compiles for minutes, cached afterwards)")
    pc = p.add_argument_group("prefix cache")
    pc.add_argument("--prompt-cache-bytes", default=None,
                    help="RAM kept for finished requests' KV blocks (e.g. 2GiB; default: whatever the KV pool holds)")
    pc.add_argument("--ssd-cache-dir", default=None, help="persist prefix KV blocks here (survives restarts)")
    pc.add_argument("--ssd-cache-bytes", default="16GiB", help="disk budget of --ssd-cache-dir (LRU by bytes)")
    kv = p.add_argument_group("KV cache codec")
    kv.add_argument("--kv-bits", type=int, default=None, help="affine KV quantization bits (2..8), mlx-lm style")
    kv.add_argument("--kv-group-size", type=int, default=None, help="KV quantization group size (default 64; turbo keys 32)")
    kv.add_argument("--quantized-kv-start", type=int, default=0, help="tokens kept native before encoding")
    kv.add_argument("--kv-quant", default=None, help="KV codec: native | affine8 | affine4 | turbo[:k8v3|k4v3|rk4v3] (+qjl: 1-bit key residual)")
    kv.add_argument("--kv-extra-codecs", default=None,
                    help="more codecs a request's kv_cache may choose, comma-separated (e.g. native,turbo:k4v3)")
    kv.add_argument("--kv-extra-share", type=float, default=0.25,
                    help="fraction of the KV budget for the extra codecs (and native blocks of --quantized-kv-start)")
    sp = p.add_argument_group("speculative decoding")
    sp.add_argument("--spec", default="off", choices=["off", "ngram", "draft-model", "layerskip"],
                    help="default method for requests (each request may override or turn it off)")
    sp.add_argument("--draft-model", default=None, help="draft model (name or path) for --spec draft-model")
    sp.add_argument("--draft-weights", default="native", choices=["native", "int8", "int4"],
                    help="weight quantization of the draft model")
    sp.add_argument("--num-draft-tokens", type=int, default=10, help="most draft tokens per round")
    sp.add_argument("--spec-layers", type=int, default=None, help="layerskip: target layers used to draft")
    sp.add_argument("--no-adaptive-draft", action="store_true", help="always draft --num-draft-tokens")


def _engine_config(a: argparse.Namespace, **extra: Any) -> EngineConfig:
    cfg = EngineConfig(
        model=a.model, device=a.device, dtype=a.dtype, weights=a.weights, kv_budget=a.kv_budget,
        block_size=a.block_size, max_num_seqs=a.max_batch, max_num_batched_tokens=a.max_batched_tokens,
        max_model_len=a.max_model_len, enable_prefix_caching=not a.no_prefix_caching, threads=a.threads,
        progress=not a.quiet, compile=a.compile, decode_burst=a.decode_burst, spec=a.spec, draft_model=a.draft_model, draft_weights=a.draft_weights,
        num_draft_tokens=a.num_draft_tokens, spec_layers=a.spec_layers, spec_adaptive=not a.no_adaptive_draft,
        kv_bits=a.kv_bits, kv_group_size=a.kv_group_size, quantized_kv_start=a.quantized_kv_start,
        kv_quant=a.kv_quant, kv_extra_codecs=a.kv_extra_codecs, kv_extra_share=a.kv_extra_share,
        prompt_cache_bytes=a.prompt_cache_bytes, ssd_cache_dir=a.ssd_cache_dir, ssd_cache_bytes=a.ssd_cache_bytes,
        **extra,
    )
    cfg.validate()
    return cfg


def _peak_memory_bytes(engine: Any) -> int:
    import torch

    if engine.loaded.device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(engine.loaded.device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def cmd_generate(a: argparse.Namespace) -> int:
    from augury.engine.engine import Engine
    from augury.engine.types import SamplingParams

    cfg = _engine_config(a)
    engine = Engine.build(cfg)
    try:
        tok = engine.tokenizer
        if a.chat is not None:
            ids = tok.encode_chat([{"role": "user", "content": a.chat}])
        else:
            ids = tok.encode(a.prompt)
        params = SamplingParams(max_tokens=a.max_tokens, temperature=a.temp, top_p=a.top_p, top_k=a.top_k,
                                seed=a.seed, stop=a.stop or [])
        t0 = time.monotonic()
        handle = engine.submit(ids, params)
        text, out_ids, last = [], [], None
        for out in handle:
            text.append(out.text)
            out_ids.extend(out.token_ids)
            last = out
            if not a.json and out.text:
                sys.stdout.write(out.text)
                sys.stdout.flush()
        wall = time.monotonic() - t0
        assert last is not None
        if last.finish_reason == "error":
            print(f"\nerror: {last.error}", file=sys.stderr)
            return 1
        n_out = last.completion_tokens
        prefill_s = last.prefill_s or 0.0
        decode_s = last.decode_s or 0.0
        stats = {
            "ttft_s": last.ttft_s or 0.0,
            "prefill_tokens_per_s": (last.prompt_tokens - last.cached_tokens) / prefill_s if prefill_s else 0.0,
            "decode_tokens_per_s": (n_out - 1) / decode_s if decode_s and n_out > 1 else 0.0,
            "peak_memory_bytes": _peak_memory_bytes(engine),
            "wall_s": wall,
        }
        if a.json:
            print(json.dumps({
                "text": "".join(text), "token_ids": out_ids, "finish_reason": last.finish_reason,
                "usage": {"prompt_tokens": last.prompt_tokens, "completion_tokens": n_out,
                      **({"speculation": last.speculation} if last.speculation else {})},
                "stats": stats,
            }))
        else:
            print(file=sys.stdout)
            print(
                f"[{last.finish_reason}] prompt {last.prompt_tokens} tok, generated {n_out} tok | "
                f"TTFT {stats['ttft_s'] * 1000:.0f} ms | prefill {stats['prefill_tokens_per_s']:.1f} tok/s | "
                f"decode {stats['decode_tokens_per_s']:.1f} tok/s | peak mem {stats['peak_memory_bytes'] / 2**20:.0f} MiB",
                file=sys.stderr,
            )
        return 0
    finally:
        engine.shutdown()


def cmd_pull(a: argparse.Namespace) -> int:
    from augury.weights.registry import pull

    path = pull(a.name)
    print(f"{a.name}: {path}")
    return 0


def cmd_models(a: argparse.Namespace) -> int:
    from augury.weights.registry import list_models

    rows = list_models()
    if a.json:
        print(json.dumps(rows, default=str))
        return 0
    for r in rows:
        state = "installed" if r.get("installed") else f"not installed (augury pull {r['name']})"
        print(f"{r['name']:<16} {state:<40} {r.get('description', '')}")
    print("--model also takes an HF model directory or a .gguf file path.")
    return 0


def cmd_serve(a: argparse.Namespace) -> int:
    from augury.engine.engine import Engine
    from augury.server.app import run_server
    from augury.server.config import ServerConfig

    scfg = ServerConfig(host=a.host, port=a.port, api_key=a.api_key or os.environ.get("AUGURY_API_KEY"),
                        max_body_bytes=a.max_body_bytes, tool_parser=a.tool_parser,
                        default_max_tokens=a.default_max_tokens)
    scfg.validate()
    cfg = _engine_config(a, max_queue=a.max_queue)
    engine = Engine.build(cfg)
    try:
        print(f"augury: serving {engine.model_id} on http://{a.host}:{a.port} (OpenAI /v1, Anthropic /v1/messages, "
              f"chat page /)", file=sys.stderr)
        run_server(engine, scfg)
    finally:
        engine.shutdown()
    return 0


def cmd_cache(a: argparse.Namespace) -> int:
    from augury.cache.admin import clear_dir, dir_stats

    if not a.ssd_cache_dir:
        print("augury: error: give --ssd-cache-dir DIR", file=sys.stderr)
        return 2
    out = dir_stats(a.ssd_cache_dir) if a.action == "stats" else clear_dir(a.ssd_cache_dir)
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:<14} {v}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="augury", description="Local LLM inference engine and OpenAI/Anthropic server")
    sub = p.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="generate text from a prompt")
    _add_engine_flags(g)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="raw completion prompt")
    src.add_argument("--chat", help="one user message, rendered through the chat template")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temp", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=cmd_generate)

    s = sub.add_parser("serve", help="OpenAI- and Anthropic-compatible HTTP server")
    _add_engine_flags(s)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--api-key", default=None, help="require this key (Bearer or x-api-key) on every route but /health")
    s.add_argument("--max-queue", type=int, default=256, help="waiting requests before 429")
    s.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024, help="request body size limit")
    s.add_argument("--tool-parser", default="auto", choices=["auto", "hermes", "llama3_json", "pythonic"])
    s.add_argument("--default-max-tokens", type=int, default=None,
                   help="max_tokens when a request gives none (default: the rest of the context)")
    s.set_defaults(func=cmd_serve)

    pl = sub.add_parser("pull", help="install a registered model's package")
    pl.add_argument("name")
    pl.set_defaults(func=cmd_pull)

    c = sub.add_parser("cache", help="inspect or clear the SSD prefix cache")
    c.add_argument("action", choices=["stats", "clear"])
    c.add_argument("--ssd-cache-dir", default=os.environ.get("AUGURY_SSD_CACHE_DIR"), help="the cache directory")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_cache)

    m = sub.add_parser("models", help="list registered models")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_models)

    from augury.eval.cli import add_eval_fit_parsers

    add_eval_fit_parsers(sub)

    from augury.bench.cli import add_bench_parser

    add_bench_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"augury: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
