"""Experiment, not kept (thirty-seventh session): the AVX2 attention's stolen chunks in whole rows (H units)
against 1/16 of a share, and the static split. Needs a temporary patch: parallel_steal(..., align) with
chunk = min(share, roundup(chunk, align)) and attention.cpp passing align = H when AUGURY_TMP_ROWCHUNK is set.
Log: rowchunk_ab.log (AVX2 build on a Zen 4 host; written by an earlier form of this script, same modes).
Usage: python docs/data/cpu37/rowchunk_ab.py [reps] [tokens]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu36"))
from sched_ab import ab  # noqa: E402

V = "AUGURY_TMP_ROWCHUNK"
ab([("static", False, {V: None}), ("stealing", True, {V: None}), ("stealing-rows", True, {V: "1"})],
   int(sys.argv[1]) if len(sys.argv) > 1 else 12, int(sys.argv[2]) if len(sys.argv) > 2 else 96)
