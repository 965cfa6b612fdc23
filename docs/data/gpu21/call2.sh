set -x
T0=$(date +%s); left() { echo $(( 560 - ($(date +%s) - T0) )); }
V4=attention_waits,w4_down_rpp256,w4_down_rpp128,w4_down_st1,w4_down_rpp256_st1,w4_qkv_st1,w4_qkv_rpp256,w4_late_all,w4_late_down,w4_late_qkv
timeout 200 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain \
  --int4-layout rows --layer-variants $V4 --rounds 2 --ctx 1100 --out $OUT/i4 > $OUT/chain_int4.log 2>&1
grep "layer chain" $OUT/chain_int4.log
timeout 120 python -m augury.bench.gemv_gpu --shapes "" --chains layer_chain \
  --layer-variants attention_waits,late_all,late_qkv,late_o_proj,late_gate_up,late_down --rounds 2 --ctx 1100 \
  --out $OUT/bf > $OUT/chain_bf16.log 2>&1
grep "layer chain" $OUT/chain_bf16.log
timeout 100 python -m pytest -q tests/layers/test_triton_gemv_w4r.py tests/layers/test_triton_gemv.py -k "late or before_or_after" > $OUT/tests.txt 2>&1
tail -3 $OUT/tests.txt
E4=$(python .devrun/pick.py $OUT/i4/gemv_gpu_int4.json w4cfg 1.0)
EB=$(python .devrun/pick.py $OUT/bf/gemv_gpu_bf16.json cfg 0.3)
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 100 ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 5 )) env "$@" > $OUT/e2e_$tag.log 2>&1; grep -h "'tok_s'" $OUT/e2e_$tag.log | sed "s/^/$tag /"; }
[ -n "$E4" ] && run i4best AUGURY_INT4_GEMV=1 AUGURY_INT4_GEMV_LAYOUT=rows AUGURY_W4R_CFG="$E4" $R --weights int4 --out /tmp/a
[ -n "$EB" ] && run bfbest AUGURY_GEMV_CFG="$EB" $R --weights native --out /tmp/b
[ -n "$EB" ] && run bfbase AUGURY_GEMV_CFG= $R --weights native --out /tmp/c
[ -n "$E4" ] && run i4tg AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/d
echo done $(left)
