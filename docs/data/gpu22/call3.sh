set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-540} - ($(date +%s) - T0) )); }
timeout 150 python -m pytest -q tests/layers/test_triton_gemv_w4m.py > $OUT/cuda-tests-w4m.txt 2>&1; tail -3 $OUT/cuda-tests-w4m.txt
V=attention_waits,w4m_early_all,w4m_pf1_all,w4m_pf2_all,w4m_d256,w4m_q512,w4m_o256,w4m_g256
timeout 170 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain \
  --int4-layout mma --layer-variants $V --rounds 2 --ctx 1100 --out $OUT/mma > $OUT/chain_mma.log 2>&1
grep "layer chain" $OUT/chain_mma.log | head -30
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 40 ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 3 )) env "$@" > $OUT/e2e_$tag.log 2>&1; grep -h "'tok_s'" $OUT/e2e_$tag.log | sed "s/^/$tag /"; tail -2 $OUT/e2e_$tag.log; }
run mma1 AUGURY_INT4_GEMV=1 AUGURY_INT4_GEMV_LAYOUT=mma $R --weights int4 --out /tmp/a1
run rows1 AUGURY_INT4_GEMV=1 AUGURY_INT4_GEMV_LAYOUT=rows $R --weights int4 --out /tmp/a2
run mma2 AUGURY_INT4_GEMV=1 AUGURY_INT4_GEMV_LAYOUT=mma $R --weights int4 --out /tmp/a3
echo done $(left)
