"""Compile the Gluon probe kernel for sm_90 on a machine without a GPU; print its registers, shared memory and the
loop's instruction mix (barriers, cp.async, shared loads, mmas) from the SASS. argv: NB W S [more triples]."""
import re, subprocess, sys, tempfile, os
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def sass_counts(fn, sig, consts, attrs, num_warps):
    """`fn` compiled for sm_90 offline -> (registers, shared memory, SASS, {op prefix: count})."""
    c = triton.compile(GluonASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": num_warps, "num_stages": 1})
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(c.asm["cubin"])
    sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
    res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True).stdout
    ops = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass, re.M)
    cnt = {p: sum(1 for o in ops if o.startswith(p))
           for p in ("BAR", "LDGSTS", "LDGDEPBAR", "DEPBAR", "LDS", "HMMA", "STL", "LDL", "ATOM", "RED")}
    cnt["instr"] = len(ops)
    return re.search(r"REG:\d+", res).group(0), re.search(r"SHARED:\d+", res).group(0), sass, c, cnt


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    import gluon_w4m as G

    args = [int(a) for a in sys.argv[1:]] or [896, 4, 4]
    for nb, w, s in zip(args[0::3], args[1::3], args[2::3]):
        fn = G._g4m_kernel
        sig = {"w_ptr": "*i32", "sz_ptr": "*i32", "op_ptr": "*i32", "ws_ptr": "*fp32", "N": "i32", "NT": "i32",
               "NB": "constexpr", "W": "constexpr", "S": "constexpr", "WC": "constexpr", "PDL": "constexpr"}
        consts = {"NB": nb, "W": w, "S": s, "WC": 2, "PDL": True}
        names = fn.arg_names
        attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in ("w_ptr", "sz_ptr", "op_ptr", "ws_ptr", "N", "NT")}
        reg, shm, sass, c, n = sass_counts(fn, sig, consts, attrs, w)
        print(f"NB={nb} W={w} S={s}: {reg} {shm} instr {n['instr']} BAR {n['BAR']} LDGSTS {n['LDGSTS']} "
              f"LDGDEPBAR {n['LDGDEPBAR']} DEPBAR {n['DEPBAR']} LDS {n['LDS']} HMMA {n['HMMA']} STL {n['STL']} "
              f"LDL {n['LDL']}", flush=True)
        if os.environ.get("DUMP"):
            open(f"/tmp/g4m_{nb}_{w}_{s}.sass", "w").write(sass)
            open(f"/tmp/g4m_{nb}_{w}_{s}.ttgir", "w").write(c.asm["ttgir"])
