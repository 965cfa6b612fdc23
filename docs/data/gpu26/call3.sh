# twenty-sixth session, device call 3: down's persistent grid at three programs a multiprocessor (what its 136
# registers on the device allow, ncu call 2), the small products persistent; layer chain; end to end
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-500} - ($(date +%s) - T0) )); }
CF='{"down": [{"persistent":3},{"persistent":3,"prefetch":1},{"persistent":4,"prefetch":1}], "qkv": [{"persistent":4}], "o_proj": [{"persistent":4}]}'
timeout 150 python docs/data/gpu25/w4m_probe.py "$CF" > $OUT/probe3.log 2>&1; grep -v Warn $OUT/probe3.log | tail -30
timeout 120 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain --int4-layout mma \
  --layer-variants attention_waits,w4m_ps3_down,w4m_ps3pf1_down --rounds 2 --ctx 1100 --out $OUT/chain3 > $OUT/chain3.log 2>&1
grep "layer chain" $OUT/chain3.log | tail -6
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 60 ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 2 )) env "$@" > $OUT/e2e3_$tag.log 2>&1; grep -h "'tok_s'" $OUT/e2e3_$tag.log | sed "s/^/$tag /"; }
for i in 1 2; do
  run i4base$i AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a$i
  run i4ps3d$i AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="down:persistent=3" $R --weights int4 --out /tmp/b$i
done
echo done $(left)
