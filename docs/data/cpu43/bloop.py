"""Forty-third session: the batch bench's shape (32-token prompts, 128 tokens each) in a loop, for perf/py-spy.
Usage: python docs/data/cpu43/bloop.py B REPS   (prints each repetition's BatchTiming: tokens, total seconds,
and all_first_s, the time until every sequence had its first token, i.e. the prompts' prefill)"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu29"))
from b8loop import load  # noqa: E402

B = int(sys.argv[1]); N = int(sys.argv[2]) if len(sys.argv) > 2 else 4
p, prompts = load(B)
for rep in range(N):
    print(f"B={B} {p.generate_batch(prompts, 128)}", flush=True)
p.close()
