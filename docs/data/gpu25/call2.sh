# twenty-fifth session, device call 2: a tile's mmas in 2 or 4 accumulator chains; one-warp programs
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
AUGURY_TEST_DEVICE=cuda timeout 100 python -m pytest -q -p no:cacheprovider tests/layers/test_triton_gemv_w4m.py \
  -k "each_prologue or bad_configs" > $OUT/pytest2.txt 2>&1; tail -3 $OUT/pytest2.txt
BIG='[{"chains":2},{"chains":4},{"chains":2,"prefetch":3},{"chains":4,"prefetch":4},{"num_warps":1,"rows_per_program":128},{"num_warps":1,"rows_per_program":128,"chains":2},{"num_warps":1,"rows_per_program":64},{"num_warps":2,"rows_per_program":256,"chains":2}]'
CF='{"gate_up": '$BIG', "down": '$BIG',
 "qkv": [{"chains":2},{"chains":4},{"num_warps":1,"rows_per_program":64},{"num_warps":1,"rows_per_program":128},{"num_warps":1,"rows_per_program":128,"chains":2}],
 "o_proj": [{"chains":2},{"chains":4},{"num_warps":1,"rows_per_program":32},{"num_warps":1,"rows_per_program":64},{"num_warps":2,"rows_per_program":64},{"num_warps":1,"rows_per_program":32,"chains":2}],
 "lm_head": [{"chains":2},{"chains":4},{"chains":2,"prefetch":4},{"num_warps":1,"rows_per_program":64},{"num_warps":1,"rows_per_program":128}]}'
timeout 150 python docs/data/gpu25/w4m_probe.py "$CF" > $OUT/probe2.log 2>&1; cat $OUT/probe2.log | tail -45
timeout 120 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain --int4-layout mma \
  --layer-variants attention_waits,w4m_ch2_all,w4m_ch4_all,w4m_ch2_gate_up,w4m_ch2_down,w4m_ch4_gate_up,w4m_ch4_down,w4m_w1_all \
  --rounds 2 --ctx 1100 --out $OUT/chain2 > $OUT/chain2.log 2>&1
grep "layer chain" $OUT/chain2.log | tail -24
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 40 ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 2 )) env "$@" > $OUT/e2e2_$tag.log 2>&1; grep -h "'tok_s'" $OUT/e2e2_$tag.log | sed "s/^/$tag /"; }
C2="qkv:chains=2;o_proj:chains=2;gate_up:chains=2;down:chains=2"
C4="qkv:chains=4;o_proj:chains=4;gate_up:chains=4;down:chains=4"
for i in 1 2; do
  run i4base$i AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a$i
  run i4ch2$i AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="$C2" $R --weights int4 --out /tmp/b$i
  run i4ch4$i AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="$C4" $R --weights int4 --out /tmp/c$i
done
echo done $(left)
