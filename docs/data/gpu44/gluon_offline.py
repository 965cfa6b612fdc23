"""Compile the engine's Gluon int4 product (`augury.layers.gluon_gemv_w4m._g4m_kernel`) for sm_90 on a machine
without a GPU, for each epilogue (plain, residual, rope + K/V); print registers, shared memory, spills and the
loop's barriers. Run under the local Triton and, with PYTHONPATH at an unpacked 3.6 wheel, the device image's."""
import os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from augury.layers import gluon_gemv_w4m as G

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
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
    c = triton.compile(GluonASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": w, "num_stages": 1})
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(c.asm["cubin"])
    sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
    res_u = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True).stdout
    ops = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass, re.M)
    cnt = lambda p: sum(1 for o in ops if o.startswith(p))
    reg, shm = re.search(r"REG:\d+", res_u).group(0), re.search(r"SHARED:\d+", res_u).group(0)
    print(f"triton {triton.__version__} {name} NB={nb} W={w} S={s}: {reg} {shm} instr {len(ops)} BAR {cnt('BAR')} LDGSTS {cnt('LDGSTS')} "
          f"HMMA {cnt('HMMA')} STL {cnt('STL')} ATOM {cnt('ATOM') + cnt('RED')}", flush=True)
