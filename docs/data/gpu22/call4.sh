set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
timeout 170 python -m pytest -q tests/layers/test_triton_gemv_w4m.py tests/layers/test_triton_gemv_w4r.py \
  tests/layers/test_triton_gemv.py -k "llama3 or late or replays or prologue or rope or nibble" > $OUT/cuda-tests.txt 2>&1; tail -3 $OUT/cuda-tests.txt
V=attention_waits,w4m_late_all,w4m_pf1_all,w4m_d1024,w4m_q128,w4m_o64,w4m_g1024,w4m_w8_all
timeout 150 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain \
  --int4-layout mma --layer-variants $V --rounds 2 --ctx 1100 --out $OUT/mma > $OUT/chain_mma.log 2>&1
grep "layer chain" $OUT/chain_mma.log | head -30
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 40 ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 3 )) env "$@" > $OUT/e2e_$tag.log 2>&1; grep -h "'tok_s'" $OUT/e2e_$tag.log | sed "s/^/$tag /"; }
run mma1 AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a1
run rows1 AUGURY_INT4_GEMV=1 AUGURY_INT4_GEMV_LAYOUT=rows $R --weights int4 --out /tmp/a2
run mma2 AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a3
run bf16 $R --weights native --out /tmp/a4
echo done $(left)
