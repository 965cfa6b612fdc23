"""Measure what one more verify token costs, so the draft policy knows when to stop.

At start-up (only when speculation is configured) the engine times forwards of
T tokens (one request: a decode token plus T-1 draft slots after a 256-token
context) for T in 1..64. The draft policy reads from that curve what a verify step of
1 + n tokens per request costs relative to a plain decode step at the current batch size,
and picks the n with the best expected tokens per unit of time.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass

import torch

from augury.layers.attention import SeqSpec, build_attention_metadata

# dense at verify sizes: the CPU int4 kernel takes rows in chunks of 8, so its cost steps at 9.
# Each size costs a forward per repetition (for SmolLM2 float32 ~0.2 s: the weights are read
# whatever T is), and this runs at every engine start with speculation configured, so it keeps
# the sizes the interpolation needs (11 sizes x 4 rounds had made 8.6 of a 10.7 s start-up)
SIZES = (1, 2, 4, 8, 9, 16, 32, 64)
# A chat-sized context: on the CPU each verify row is attended on its own (bitwise exactness),
# so a row's cost grows with the context, and a curve measured at 64 tokens made long windows
# look cheaper than they are at real lengths (grounded set, SmolLM2 int4: ngram 1.64-1.74x plain
# with the 64-token curve, 1.66-1.82x with this one, same runs)
CONTEXT = 256
CALIB_ID = "__spec_calibration__"


@dataclass
class StepCostCurve:
    sizes: tuple[int, ...]
    seconds: tuple[float, ...]  # median forward time for each size

    def cost(self, tokens: int) -> float:
        """Interpolated forward time for `tokens` tokens (clamped at the ends)."""
        s, t = self.sizes, self.seconds
        if tokens <= s[0]:
            return t[0]
        if tokens >= s[-1]:
            slope = (t[-1] - t[-2]) / (s[-1] - s[-2])
            return t[-1] + slope * (tokens - s[-1])
        i = bisect_left(s, tokens)
        f = (tokens - s[i - 1]) / (s[i] - s[i - 1])
        return t[i - 1] + f * (t[i] - t[i - 1])

    def marginal(self, tokens: int, batch: int) -> float:
        """Cost of one more token at `tokens` in the step, relative to a decode step of `batch`."""
        return max(0.0, self.cost(tokens + 1) - self.cost(tokens)) / max(self.cost(batch), 1e-9)


def measure_step_costs(model: torch.nn.Module, pool, blocks, windows, device: torch.device,
                       reps: int = 3, max_len: int | None = None) -> StepCostCurve | None:
    """None when the pool cannot spare the scratch blocks (the policy keeps its default).
    `max_len` (the engine's context window): positions stay below it, so an engine with a short
    window measures fewer sizes after a shorter context instead of running past its rope table."""
    sizes = SIZES if max_len is None else tuple(T for T in SIZES if T < max_len)
    context = CONTEXT if max_len is None else min(CONTEXT, max_len - sizes[-1])
    if len(sizes) < 2:  # no curve to interpolate
        return None
    got = blocks.admit(CALIB_ID, list(range(context + sizes[-1])), max_new=1 << 30)
    if got is None:
        return None
    try:
        tables = blocks.block_tables(CALIB_ID)
        best = [float("inf")] * len(sizes)
        with torch.inference_mode():
            # built in inference mode like the runner's: a compiled forward guards on how its
            # input tensors were made, and calibration would otherwise cost it a recompile
            metas = [build_attention_metadata([SeqSpec(context, T, tables)], blocks.block_size, windows, device,
                                              getattr(pool, "class_ranges", None)) for T in sizes]
            # sizes round-robin and the fastest of each: a load spike on a shared machine, or a
            # size's cold first call (no separate warm-up round), then costs one sample, not a
            # whole size (which the monotone fix below would spread to every larger size)
            for r in range(reps):
                for i, (T, meta) in enumerate(zip(sizes, metas)):
                    ids = torch.ones(T, dtype=torch.long, device=device)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    t0 = time.perf_counter()
                    h = model(ids, meta.positions, meta, pool)
                    model.compute_logits(h).sum().item()
                    best[i] = min(best[i], time.perf_counter() - t0)
        # costs never fall with more tokens
        for i in range(1, len(best)):
            best[i] = max(best[i], best[i - 1])
        return StepCostCurve(sizes, tuple(best))
    finally:
        blocks.free(CALIB_ID)
