"""Best layer-chain variant of a gemv_gpu JSON -> the env string that selects it end to end."""
import json, sys
from augury.bench.gemv_gpu import LAYER_VARIANTS
path, key, margin = sys.argv[1], sys.argv[2], float(sys.argv[3])
v = json.load(open(path))["layer_chain"]["variants"]
base = v["attention_waits"]["with_attention_us"]
name, best = min(((n, r["with_attention_us"]) for n, r in v.items()), key=lambda t: t[1])
over = LAYER_VARIANTS[name].get(key) or {}
env = ";".join(p + ":" + ",".join(f"{f}={int(x)}" for f, x in d.items()) for p, d in over.items())
print(env if best < base - margin else "", end="")
print(f"best {name} {best:.1f} vs base {base:.1f} -> {env!r}", file=sys.stderr)
