# twenty-fifth session, device call 1: three and four tiles in flight per warp in the tensor-core int4 GEMV
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
AUGURY_TEST_DEVICE=cuda timeout 150 python -m pytest -q -p no:cacheprovider tests/layers/test_triton_gemv_w4m.py \
  > $OUT/pytest1.txt 2>&1; tail -3 $OUT/pytest1.txt
CF='{"gate_up": [{"prefetch":3},{"prefetch":4},{"prefetch":4,"rows_per_program":1024},{"prefetch":4,"rows_per_program":256},{"lo":1},{"prefetch":4,"lo":1}],
 "down": [{"prefetch":3},{"prefetch":4},{"prefetch":4,"rows_per_program":1024},{"prefetch":4,"rows_per_program":256},{"lo":1},{"prefetch":4,"lo":1}],
 "qkv": [{"prefetch":4,"rows_per_program":256},{"prefetch":3,"rows_per_program":256},{"num_warps":4,"rows_per_program":256},{"prefetch":4,"rows_per_program":512},{"lo":1},{"prefetch":4,"rows_per_program":256,"lo":1}],
 "o_proj": [{"prefetch":4,"rows_per_program":256},{"prefetch":2,"rows_per_program":256},{"prefetch":4,"rows_per_program":256,"num_warps":2},{"prefetch":4,"rows_per_program":512},{"lo":1},{"prefetch":4,"rows_per_program":256,"lo":1}],
 "lm_head": [{"prefetch":3},{"prefetch":4},{"prefetch":4,"rows_per_program":512},{"prefetch":4,"lo":1}]}'
timeout 150 python docs/data/gpu25/w4m_probe.py "$CF" > $OUT/probe1.log 2>&1; cat $OUT/probe1.log | tail -45
timeout 150 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain --int4-layout mma \
  --layer-variants attention_waits,w4m_pf3_all,w4m_pf4_all,w4m_pf4_gate_up,w4m_pf4_down,w4m_pf3_gate_up,w4m_pf3_down,w4m_pf4_q256,w4m_pf4_o256,w4m_pf4_big \
  --rounds 2 --ctx 1100 --out $OUT/chain1 > $OUT/chain1.log 2>&1
grep "layer chain" $OUT/chain1.log | tail -24
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 40 ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 2 )) env "$@" > $OUT/e2e1_$tag.log 2>&1; grep -h "'tok_s'" $OUT/e2e1_$tag.log | sed "s/^/$tag /"; }
for i in 1 2; do
  run i4base$i AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a$i
  run i4pf4gd$i AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="gate_up:prefetch=4;down:prefetch=4" $R --weights int4 --out /tmp/b$i
done
echo done $(left)
