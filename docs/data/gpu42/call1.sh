# forty-second session, device call 1: int4 B=1 end to end with evict-first (the default) against the old plain
# loads (weight_cache=0), alternating, and bf16 B=1 once, on whichever card comes (asked for as nvidia-h200: the
# H200's int4 fraction with evict-first is still unread). Then, with what time is left, the Gluon probe if present.
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-420} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee $OUT/gpu.txt
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
OLD="qkv:weight_cache=0;o_proj:weight_cache=0;gate_up:weight_cache=0;down:weight_cache=0;lm_head:weight_cache=0"
run() { tag=$1; shift; [ $(left) -gt 40 ] || { echo "skip $tag"; return; }
  echo "=== $tag" >> $OUT/e2e.log; timeout $(( $(left) - 2 )) env "$@" > /tmp/e2e.log 2>&1; cat /tmp/e2e.log >> $OUT/e2e.log
  grep -h "'tok_s'" /tmp/e2e.log | sed "s/^/$tag /"; }
run int4_1 AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a1
run int4wc0_1 AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="$OLD" $R --weights int4 --out /tmp/b1
run int4_2 AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a2
run int4wc0_2 AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="$OLD" $R --weights int4 --out /tmp/b2
run bf16_1 $R --weights native --out /tmp/n1
if [ -f docs/data/gpu42/gluon_probe.py ] && [ $(left) -gt 60 ]; then
  timeout $(( $(left) - 5 )) python docs/data/gpu42/gluon_probe.py > $OUT/gluon.log 2>&1; tail -40 $OUT/gluon.log
fi
echo done $(left)
