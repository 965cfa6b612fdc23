# twenty-fifth session, device call 4: row chunks that are not a power of two (gate_up in one wave of 512
# programs, the LM head in 5.06 waves instead of 15.18)
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
AUGURY_TEST_DEVICE=cuda timeout 100 python -m pytest -q -p no:cacheprovider tests/layers/test_triton_gemv_w4m.py \
  -k "each_prologue or bad_configs" > $OUT/pytest4.txt 2>&1; tail -3 $OUT/pytest4.txt
CF='{"gate_up": [{"rows_per_program":896},{"rows_per_program":896,"prefetch":1},{"rows_per_program":448},{"rows_per_program":448,"prefetch":1},{"rows_per_program":896,"prefetch":3}],
 "lm_head": [{"rows_per_program":768},{"rows_per_program":768,"prefetch":1},{"rows_per_program":384},{"rows_per_program":384,"prefetch":1},{"rows_per_program":640}]}'
timeout 100 python docs/data/gpu25/w4m_probe.py "$CF" > $OUT/probe4.log 2>&1; cat $OUT/probe4.log | tail -16
timeout 100 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain --int4-layout mma \
  --layer-variants attention_waits,w4m_g896,w4m_g448 --rounds 2 --ctx 1100 --out $OUT/chain4 > $OUT/chain4.log 2>&1
grep "layer chain" $OUT/chain4.log | tail -6
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 40 ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 2 )) env "$@" > $OUT/e2e4_$tag.log 2>&1; grep -h "'tok_s'" $OUT/e2e4_$tag.log | sed "s/^/$tag /"; }
for i in 1 2; do
  run i4base$i AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a$i
  run i4g896$i AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="gate_up:rows_per_program=896" $R --weights int4 --out /tmp/b$i
  run i4g896h768$i AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="gate_up:rows_per_program=896;lm_head:rows_per_program=768" $R --weights int4 --out /tmp/c$i
done
echo done $(left)
