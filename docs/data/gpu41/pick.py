"""From a layer-chain log: for each product, the fastest w4m_* variant that changes only that product, if its mean
over the rounds beats the base (attention_waits) by more than 0.3 us a layer; printed as one AUGURY_W4M_CFG string
joining them (empty if none), then "warm" if attention_warms_o beat the base by as much (forty-first session)."""
import re, sys
from collections import defaultdict
from augury.bench.gemv_gpu import LAYER_VARIANTS

t = defaultdict(list)
for name, us in re.findall(r"layer chain \[\d+/\d+\], (\S+): ([\d.]+) us per layer", open(sys.argv[1]).read()):
    t[name].append(float(us))
mean = {k: sum(v) / len(v) for k, v in t.items()}
base = mean.get("attention_waits", float("inf"))
print({k: round(v, 2) for k, v in mean.items()}, file=sys.stderr)
best: dict[str, tuple[float, dict]] = {}
for k, us in mean.items():
    cfg = LAYER_VARIANTS.get(k, {}).get("w4mcfg")
    if not k.startswith("w4m_") or not cfg or len(cfg) != 1 or us >= base - 0.3:
        continue
    (product, fields), = cfg.items()
    if product not in best or us < best[product][0]:
        best[product] = (us, fields)
print({p: (round(u, 2), f) for p, (u, f) in best.items()}, file=sys.stderr)
print(";".join(f"{p}:" + ",".join(f"{f}={int(v)}" for f, v in fs.items()) for p, (_, fs) in best.items()))
print("warm" if mean.get("attention_warms_o", float("inf")) < base - 0.3 else "")
