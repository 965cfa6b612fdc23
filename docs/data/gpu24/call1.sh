# twenty-fourth session, device call 1: attention's L2 hints before the PDL wait (correctness, chain, end to end)
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
AUGURY_TEST_DEVICE=cuda timeout 150 python -m pytest -q -p no:cacheprovider tests/layers/test_triton_paged_decode.py \
  -k "l2_prefetch or programmatic or one_launch_on_the_gpu or bf16_8b or probe" > $OUT/pytest.txt 2>&1; tail -4 $OUT/pytest.txt
V=attention_waits,attention_waits_no_l2,defer_merge,defer_merge_no_l2,defer_split_r64,defer_split_r256,defer_split_w8,defer_split_bn8,defer_split_bn32,defer_split_w2
timeout 170 python -m augury.bench.gemv_gpu --shapes "" --chains layer_chain --layer-variants $V --rounds 2 \
  --ctx 1100 --out $OUT/bf16 > $OUT/chain_bf16.log 2>&1; grep "layer chain \[2" $OUT/chain_bf16.log | tail -12
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 40 ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 2 )) env "$@" > $OUT/e2e_$tag.log 2>&1; grep -h "'tok_s'" $OUT/e2e_$tag.log | sed "s/^/$tag /"; }
run bf_on $R --weights native --out /tmp/b1
run bf_off AUGURY_ATTN_L2_PREFETCH=0 $R --weights native --out /tmp/b2
run i4_on AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a1
run bf_on2 $R --weights native --out /tmp/b3
run i4_off AUGURY_INT4_GEMV=1 AUGURY_ATTN_L2_PREFETCH=0 $R --weights int4 --out /tmp/a2
echo done $(left)
