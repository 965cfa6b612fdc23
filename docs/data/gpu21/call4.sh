set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-300} - ($(date +%s) - T0) )); }
V4=attention_waits,w4_early_all,w4_d128,w4_d512,w4_d256_st3,w4_q_st1,w4_q256,w4_g512,w4_g2048,w4_o128,w4_o512
timeout 130 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain \
  --int4-layout rows --layer-variants $V4 --rounds 2 --ctx 1100 --out $OUT/i4 > $OUT/chain_int4.log 2>&1
grep "layer chain" $OUT/chain_int4.log
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 35 ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 3 )) env "$@" > $OUT/e2e_$tag.log 2>&1; grep -h "'tok_s'" $OUT/e2e_$tag.log | sed "s/^/$tag /"; }
run rowsdef1 AUGURY_INT4_GEMV=1 AUGURY_INT4_GEMV_LAYOUT=rows $R --weights int4 --out /tmp/a1
timeout 60 python -m pytest -q tests/layers/test_triton_gemv_w4r.py -k "llama3 or late or replays" > $OUT/tests.txt 2>&1; tail -2 $OUT/tests.txt
run rowsdef2 AUGURY_INT4_GEMV=1 AUGURY_INT4_GEMV_LAYOUT=rows $R --weights int4 --out /tmp/a2
echo done $(left)
