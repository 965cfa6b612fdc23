"""Prefix-cache benchmark: TTFT cold vs RAM hit vs SSD hit after a restart, and decode
speed with the SSD tier on and off.

    python -m augury.bench.prefix_cache [--model smollm2] [--sizes 1024 4096 8191] [--repeats 3]

Cold, RAM-hit and SSD-hit runs of one prompt size alternate within each repeat
(the machine may be shared: medians are reported). "SSD hit after restart"
uses a freshly built engine over the same cache directory; by default the block
files are also dropped from the OS page cache first (posix_fadvise DONTNEED),
so the read really comes from the disk. Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from typing import Any

TEXT = ("The history of computing is a story of abstraction: each generation of engineers hides the "
        "details of the last behind a simpler interface, and each interface becomes the foundation for "
        "the next. Punched cards gave way to terminals, terminals to windows, windows to browsers. ")


def make_prompt(tok: Any, n: int, tag: int) -> list[int]:
    """Exactly n ids of ordinary text; `tag` picks a distinct first token (so cold is cold:
    not even a partial first block is shared)."""
    head = tok.encode("", add_special_tokens=True) + [1000 + tag * 7919 % 20000]
    body = tok.encode(TEXT * (n // 30 + 2), add_special_tokens=False)
    return (head + body)[:n]


def drop_page_cache(root: str) -> int:
    """Ask the OS to forget the cached pages of every block file (they are fsynced, so clean)."""
    n = 0
    for d, _, fs in os.walk(root):
        for f in fs:
            try:
                fd = os.open(os.path.join(d, f), os.O_RDONLY)
            except FileNotFoundError:  # a temp file renamed under us
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            finally:
                os.close(fd)
    return n


def ttft(engine: Any, ids: list[int]) -> tuple[float, int]:
    from augury.engine.types import SamplingParams

    r = engine.generate(ids, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    return r.ttft_s, r.cached_tokens


def decode_rate(engine: Any, ids: list[int], n: int) -> float:
    from augury.engine.types import SamplingParams

    r = engine.generate(ids, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    return (r.completion_tokens - 1) / r.decode_s if r.decode_s else 0.0


def main(argv: list[str] | None = None) -> int:
    from augury.engine.engine import Engine

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    # 8191: SmolLM2 has 8192 positions and a prompt must leave room for one token
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 8191])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--decode-repeats", type=int, default=5)
    ap.add_argument("--kv-budget", default="2GiB")
    ap.add_argument("--ssd-cache-dir", default=None, help="default: a temporary directory (removed after)")
    ap.add_argument("--keep-page-cache", action="store_true", help="do not drop block files from the OS cache")
    ap.add_argument("--json", default="prefix_cache_bench.json")
    a = ap.parse_args(argv)

    tmp = None
    root = a.ssd_cache_dir
    if root is None:
        tmp = tempfile.TemporaryDirectory(prefix="augury-bench-cache-", ignore_cleanup_errors=True)
        root = tmp.name
    kw = dict(progress=False, kv_budget=a.kv_budget, max_model_len=max(a.sizes) + 64)
    res: dict[str, Any] = {"model": a.model, "sizes": a.sizes, "repeats": a.repeats, "ttft": {}, "decode": {}}

    # phase 1: cold vs RAM hit, alternating; every prompt is also written through to the SSD tier
    e = Engine.from_model(a.model, ssd_cache_dir=root, **kw)
    tok = e.tokenizer
    prompts = {n: [make_prompt(tok, n, 1000 * n + r) for r in range(a.repeats)] for n in a.sizes}
    ttft(e, make_prompt(tok, 64, 1))  # warm-up
    rows: dict[int, dict[str, list[float]]] = {n: {"cold": [], "ram": [], "ssd": []} for n in a.sizes}
    for r in range(a.repeats):
        for n in a.sizes:
            e.flush_cache()  # the writer must not compete with the measurement
            t, c = ttft(e, prompts[n][r])
            assert c == 0, "cold run hit the cache"
            rows[n]["cold"].append(t)
            e.flush_cache()
            t, c = ttft(e, prompts[n][r])
            assert c == n - 1, f"RAM hit cached {c} of {n}"
            rows[n]["ram"].append(t)
    e.flush_cache()
    ssd_stats = e.cache_stats()
    e.shutdown()

    # phase 2: restart (fresh engine, empty RAM), every prompt restored from the SSD tier
    e = Engine.from_model(a.model, ssd_cache_dir=root, **kw)
    ttft(e, make_prompt(tok, 64, 2))
    for r in range(a.repeats):
        for n in a.sizes:
            e.flush_cache()
            if not a.keep_page_cache:
                drop_page_cache(root)
            t, c = ttft(e, prompts[n][r])
            assert c == n - 1 or c >= (n - 1) // 16 * 16, f"SSD hit cached {c} of {n}"
            rows[n]["ssd"].append(t)

    # decode speed: SSD tier on (this engine) vs off, alternating, fresh prompts
    off = Engine.from_model(a.model, **kw)
    dec: dict[str, list[float]] = {"ssd_on": [], "ssd_off": []}
    for r in range(a.decode_repeats):
        order = [("ssd_on", e), ("ssd_off", off)] if r % 2 == 0 else [("ssd_off", off), ("ssd_on", e)]
        for name, eng in order:
            eng.flush_cache()
            dec[name].append(decode_rate(eng, make_prompt(tok, 256, 50_000 + 10 * r + (name == "ssd_on")),
                                         a.decode_tokens))
    e.flush_cache()
    e.shutdown()
    off.shutdown()
    if tmp is not None:
        tmp.cleanup()

    med = statistics.median
    print(f"\nprefix cache, {a.model}: TTFT median of {a.repeats} (ms); SSD hit = fresh engine"
          f"{'' if a.keep_page_cache else ', block files dropped from the page cache'}")
    print(f"{'prompt':>7} {'cold':>9} {'RAM hit':>9} {'SSD hit':>9} {'RAM/cold':>9} {'SSD/cold':>9}")
    for n in a.sizes:
        c, rm, s = med(rows[n]["cold"]), med(rows[n]["ram"]), med(rows[n]["ssd"])
        res["ttft"][str(n)] = {"cold_s": rows[n]["cold"], "ram_s": rows[n]["ram"], "ssd_s": rows[n]["ssd"],
                               "median_cold_s": c, "median_ram_s": rm, "median_ssd_s": s,
                               "ram_over_cold": rm / c, "ssd_over_cold": s / c}
        print(f"{n:>7} {c * 1e3:>9.1f} {rm * 1e3:>9.1f} {s * 1e3:>9.1f} {rm / c:>8.1%} {s / c:>8.1%}")
    on, of = med(dec["ssd_on"]), med(dec["ssd_off"])
    res["decode"] = {"ssd_on_tok_s": dec["ssd_on"], "ssd_off_tok_s": dec["ssd_off"],
                     "median_on": on, "median_off": of, "tokens": a.decode_tokens}
    res["ssd_after_phase1"] = ssd_stats
    print(f"decode ({a.decode_tokens} tokens, median of {a.decode_repeats}): SSD tier on {on:.1f} tok/s, "
          f"off {of:.1f} tok/s ({on / of - 1:+.1%})")
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
