"""`augury bench SCENARIO` — parse flags, run one scenario, print the table (or --json), write outputs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SCENARIO_NAMES = ("prefill", "decode", "batch", "spec", "server")


def _ints(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(",") if x.strip())


def _names(s: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in s.split(",") if x.strip() and x.strip() != "none")


def add_bench_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    b = sub.add_parser("bench", help="benchmark augury against llama.cpp, HF transformers and the physical limit",
                       description="Run one benchmark scenario; progress on stderr; results as a table, "
                                   "JSON, markdown and PNG under --out.")
    b.add_argument("scenario", choices=SCENARIO_NAMES)
    b.add_argument("--model", default="smollm2", help="registered name or .gguf path (peers load the same file)")
    b.add_argument("--weights", default="int4", choices=["native", "int8", "int4"],
                   help="augury's weight bits (int4 matches the Q4 GGUF llama.cpp runs)")
    b.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    b.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    b.add_argument("--threads", type=int, default=2, help="threads for every engine (torch and llama.cpp)")
    b.add_argument("--reps", type=int, default=5, help="measured repetitions after the warm-up")
    b.add_argument("--warmup", type=int, default=1)
    b.add_argument("--peers", default="llama.cpp,hf,limit", help="comma list of llama.cpp,hf,limit (or none)")
    b.add_argument("--out", default="bench-out", help="directory for <scenario>.json/.md/.png")
    b.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of the table")
    b.add_argument("--no-plot", action="store_true")
    b.add_argument("--kv-budget", default=None)
    b.add_argument("--compile", action="store_true",
                   help="torch.compile augury's forward (as `augury serve --compile`; the first start compiles)")
    g = b.add_argument_group("scenario sizes")
    g.add_argument("--prefill-lens", type=_ints, default=(1024, 4096))
    g.add_argument("--decode-tokens", type=int, default=256)
    g.add_argument("--batch-sizes", type=_ints, default=(1, 4, 8, 16, 64))
    g.add_argument("--batch-tokens", type=int, default=128)
    g.add_argument("--hf-max-batch", type=int, default=16)
    g.add_argument("--spec-sets", type=_names, default=("grounded", "chat"))
    g.add_argument("--spec-methods", type=_names, default=("ngram", "layerskip"))
    g.add_argument("--spec-max-tokens", type=int, default=128)
    g.add_argument("--spec-layers", type=int, default=None)
    g.add_argument("--pld-tokens", type=_ints, default=(10,), help="llama.cpp prompt-lookup draft sizes")
    g.add_argument("--clients", type=_ints, default=(1, 4, 16), help="server: concurrent streaming clients")
    g.add_argument("--server-tokens", type=int, default=128)
    b.set_defaults(func=run_bench)
    return b


def options_from_args(a: argparse.Namespace):
    from augury.bench.options import BenchOptions

    o = BenchOptions(model=a.model, weights=a.weights, dtype=a.dtype, device=a.device, threads=a.threads,
                     reps=a.reps, warmup=a.warmup, out=Path(a.out), peers=_names(a.peers), kv_budget=a.kv_budget,
                     compile=a.compile,
                     prefill_lens=a.prefill_lens, decode_tokens=a.decode_tokens, batch_sizes=a.batch_sizes,
                     batch_tokens=a.batch_tokens, hf_max_batch=a.hf_max_batch, spec_sets=a.spec_sets,
                     spec_methods=a.spec_methods, spec_max_tokens=a.spec_max_tokens, spec_layers=a.spec_layers,
                     pld_tokens=a.pld_tokens, server_clients=a.clients, server_tokens=a.server_tokens)
    o.validate()
    return o


def run_bench(a: argparse.Namespace) -> int:
    from augury.bench.report import render_table, write_outputs

    opts = options_from_args(a)
    rep = run_scenario(a.scenario, opts)
    paths = write_outputs(rep, opts.out, plot=not a.no_plot)
    if a.json:
        print(rep.to_json())
    else:
        print(render_table(rep))
    print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    return 0


def run_scenario(name: str, opts):
    import torch

    from augury.bench.load import build_setup, close_setup
    from augury.bench.machine import machine_info
    from augury.bench.runner import log

    if name == "server":
        from augury.bench.server import run_server_scenario

        return run_server_scenario(opts)
    from augury.bench.scenarios import SCENARIOS

    machine = machine_info(torch.device(opts.device), opts.threads)  # the revision the run started on
    setup = build_setup(opts, name)
    try:
        log(f"scenario {name}: engines {[setup.augury.name, *setup.peers]}"
            + (" + limit" if setup.limit else "") + f", {opts.reps} reps")
        rep = SCENARIOS[name](setup)
    finally:
        close_setup(setup)
    rep.machine = machine
    return rep


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="augury")
    add_bench_parser(p.add_subparsers(dest="cmd", required=True))
    a = p.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
