"""From a layer-chain log: the fastest w4m_* variant (mean of its rounds) if it beats the base (attention_waits),
printed as its AUGURY_W4M_CFG string; nothing otherwise."""
import re, sys
from collections import defaultdict
from augury.bench.gemv_gpu import LAYER_VARIANTS

t = defaultdict(list)
for name, us in re.findall(r"layer chain \[\d+/\d+\], (\S+): ([\d.]+) us per layer", open(sys.argv[1]).read()):
    t[name].append(float(us))
mean = {k: sum(v) / len(v) for k, v in t.items()}
base = mean.get("attention_waits", float("inf"))
best = min((k for k in mean if k.startswith("w4m_")), key=mean.get, default=None)
print({k: round(v, 2) for k, v in mean.items()}, file=sys.stderr)
if best and mean[best] < base:
    cfg = LAYER_VARIANTS[best]["w4mcfg"]
    print(";".join(f"{p}:" + ",".join(f"{f}={int(v)}" for f, v in fs.items()) for p, fs in cfg.items()))
