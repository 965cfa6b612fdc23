# twenty-fourth session, device call 2: weight tiles asked of the L2 before each product's PDL wait
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
AUGURY_TEST_DEVICE=cuda timeout 150 python -m pytest -q -p no:cacheprovider tests/layers/test_triton_gemv.py \
  tests/layers/test_triton_gemv_split.py -k "l2_hints or 8b_shapes or before_or_after" > $OUT/pytest2.txt 2>&1; tail -4 $OUT/pytest2.txt
V=attention_waits,l2w_1,l2w_2,l2w_3,l2w_qkv,l2w_o_proj,l2w_gate_up,l2w_down,defer_merge,defer_split_bn32,defer_split_bn32_l2,defer_split_l2,defer_split_bn32_w2,defer_split_bn64
timeout 200 python -m augury.bench.gemv_gpu --shapes "" --chains layer_chain --layer-variants $V --rounds 2 \
  --ctx 1100 --out $OUT/bf16 > $OUT/chain2_bf16.log 2>&1; grep "layer chain \[2" $OUT/chain2_bf16.log | tail -14
R="python -m augury.bench.roofline --quick --cases b1 --skip-small --weights native"
run() { tag=$1; shift; [ $(left) -gt 40 ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 2 )) env "$@" > $OUT/e2e2_$tag.log 2>&1; grep -h "'tok_s'" $OUT/e2e2_$tag.log | sed "s/^/$tag /"; }
C1="qkv:l2_tiles=1;o_proj:l2_tiles=1;gate_up:l2_tiles=1;down:l2_tiles=1"
C2="qkv:l2_tiles=2;o_proj:l2_tiles=2;gate_up:l2_tiles=2;down:l2_tiles=2;lm_head:l2_tiles=2"
for i in 1 2; do
  run base$i $R --out /tmp/b$i
  run l2a$i AUGURY_GEMV_CFG="$C1" $R --out /tmp/c$i
  run l2b$i AUGURY_GEMV_CFG="$C2" $R --out /tmp/d$i
done
echo done $(left)
