"""Experiment, not kept (thirty-seventh session): int4_mm's activation rows quantized inside the parallel
region (parallel_quantize.patch, kernels.h parallel_steal_after) against on the caller before it. Needs
that patch plus a switch in int4_mm: AUGURY_TMP_SERIALPRE set = quantize on the caller, then parallel_steal.
Log: parallel_quantize_ab_avx2.log (AVX2 build on a Zen 4 host; written by an earlier form of this script,
same modes: 0 static, 1 stealing + serial quantize, 2 stealing + parallel quantize).
Usage: python docs/data/cpu37/parallel_quantize_ab.py [reps] [tokens]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu36"))
from sched_ab import ab  # noqa: E402

V = "AUGURY_TMP_SERIALPRE"
ab([("static", False, {V: "1"}), ("stealing", True, {V: "1"}), ("stealing+parallel-quantize", True, {V: None})],
   int(sys.argv[1]) if len(sys.argv) > 1 else 15, int(sys.argv[2]) if len(sys.argv) > 2 else 96)
