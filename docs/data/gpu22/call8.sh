set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-195} - ($(date +%s) - T0) )); }
V=attention_waits,w4m_km_all,w4m_km_gate_up,w4m_km_down,w4m_km_qkv,w4m_km_o_proj
timeout 80 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain \
  --int4-layout mma --layer-variants $V --rounds 2 --ctx 1100 --out $OUT/mma > $OUT/chain_mma.log 2>&1
grep "layer chain" $OUT/chain_mma.log | head -30
ENV=$(python docs/data/gpu21/pick.py $OUT/mma/gemv_gpu_int4.json w4mcfg 0.3)
echo "picked: $ENV"
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 32 ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 2 )) env "$@" > $OUT/e2e_$tag.log 2>&1; grep -h "'tok_s'" $OUT/e2e_$tag.log | sed "s/^/$tag /"; }
if [ -n "$ENV" ]; then
  run pick1 AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="$ENV" $R --weights int4 --out /tmp/a1
  run def1 AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a2
  run pick2 AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="$ENV" $R --weights int4 --out /tmp/a3
fi
[ $(left) -gt 25 ] && timeout $(( $(left) - 2 )) python -m pytest -q tests/layers/test_triton_gemv_w4m.py -k "prologue" > $OUT/cuda-tests-km.txt 2>&1; tail -2 $OUT/cuda-tests-km.txt
echo done $(left)
