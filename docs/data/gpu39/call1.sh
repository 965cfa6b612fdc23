# thirty-ninth session, device call 1: L2 hints for the tensor-core int4 GEMV's weight tiles (W4MmaConfig.l2_ahead):
# registers, bitwise tests, per-product probe, layer chain, end to end against the default
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-540} - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv
timeout 60 python docs/data/gpu39/regs.py '{"gate_up": [{"l2_ahead":1},{"l2_ahead":3}], "down": [{"l2_ahead":2}], "qkv": [{"l2_ahead":2}], "o_proj": [{"l2_ahead":1}]}' > $OUT/regs1.log 2>&1; cat $OUT/regs1.log | grep -v Warn
AUGURY_TEST_DEVICE=cuda timeout 120 python -m pytest -q -p no:cacheprovider tests/layers/test_triton_gemv_w4m.py \
  -k "l2_hints or (each_prologue and 208)" > $OUT/pytest1.txt 2>&1; tail -3 $OUT/pytest1.txt
A='[{"l2_ahead":1},{"l2_ahead":2},{"l2_ahead":3},{"l2_ahead":4}]'
CF="{\"gate_up\": $A, \"down\": $A, \"qkv\": $A, \"o_proj\": [{\"l2_ahead\":1},{\"l2_ahead\":2}], \"lm_head\": [{\"l2_ahead\":2}]}"
O=$OUT; OUT=/tmp timeout 150 python docs/data/gpu25/w4m_probe.py "$CF" > $O/probe1.log 2>&1; cp /tmp/w4m_probe.json $O/probe1.json; grep -v Warn $OUT/probe1.log
timeout 150 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain --int4-layout mma \
  --layer-variants attention_waits,w4m_l2a1_all,w4m_l2a2_all,w4m_l2a3_all,w4m_l2a2_gd,w4m_l2a4_gd --rounds 2 --ctx 1100 \
  --out /tmp/chain1 > $OUT/chain1.log 2>&1
grep "layer chain" $OUT/chain1.log
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 45 ] || { echo "skip $tag"; return; }
  echo "=== $tag" >> $OUT/e2e1.log; timeout $(( $(left) - 2 )) env "$@" > /tmp/e2e.log 2>&1; cat /tmp/e2e.log >> $OUT/e2e1.log
  grep -h "'tok_s'" /tmp/e2e.log | sed "s/^/$tag /"; }
ALL2="qkv:l2_ahead=2;o_proj:l2_ahead=2;gate_up:l2_ahead=2;down:l2_ahead=2"
for i in 1 2; do
  run base$i AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a$i
  run l2a2_$i AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="$ALL2" $R --weights int4 --out /tmp/b$i
done
echo done $(left)
