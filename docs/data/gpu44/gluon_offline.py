"""Compile the engine's Gluon int4 product (`augury.layers.gluon_gemv_w4m._g4m_kernel`) for sm_90 on a machine
without a GPU, for each epilogue (plain, residual, rope + K/V); print registers, shared memory, spills and the
loop's barriers. Run under the local Triton and, with PYTHONPATH at an unpacked 3.6 wheel, the device image's."""
import os, sys
import triton
from augury.layers import gluon_gemv_w4m as G

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "gpu42"))
from gluon_offline import sass_counts  # noqa: E402

fn = G._g4m_kernel
names = fn.arg_names
ptrs = {"w_ptr": "*i32", "sz_ptr": "*i32", "op_ptr": "*i32", "r_ptr": "*bf16", "y_ptr": "*bf16", "ws_ptr": "*fp32",
        "cnt_ptr": "*i32", "cos_ptr": "*bf16", "sin_ptr": "*bf16", "kp_ptr": "*bf16", "vp_ptr": "*bf16",
        "slot_ptr": "*i64"}
ints = ["N", "NT", "s_kslot", "s_kh", "s_vslot", "s_vh", "n_q", "n_qk"]
cases = [  # (name, NB, W, S, RESIDUAL, ROPE_KV, NSPLIT)
    ("gate_up", 896, 4, 8, False, False, 16), ("down", 256, 1, 8, True, False, 56),
    ("qkv", 128, 2, 4, False, True, 16), ("o_proj", 64, 1, 4, True, False, 16)]
for name, nb, w, s, res, rope, nsplit in cases[:int(os.environ.get("CASES", 4))]:
    consts = {"NB": nb, "W": w, "S": s, "WC": 2, "PDL": True, "RESIDUAL": res, "ROPE_KV": rope, "HALF": 64,
              "PP": 64, "NSPLIT": nsplit}
    sig = {a: ptrs.get(a, "i32" if a in ints else "constexpr") for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in ptrs if a != "slot_ptr"}
    reg, shm, _, _, n = sass_counts(fn, sig, consts, attrs, w)
    print(f"triton {triton.__version__} {name} NB={nb} W={w} S={s}: {reg} {shm} instr {n['instr']} BAR {n['BAR']} "
          f"LDGSTS {n['LDGSTS']} HMMA {n['HMMA']} STL {n['STL']} ATOM {n['ATOM'] + n['RED']}", flush=True)
