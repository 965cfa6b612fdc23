set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-470} - ($(date +%s) - T0) )); }
timeout 90 python docs/data/gpu23/check_defer.py > $OUT/check-call1.txt 2>&1; tail -8 $OUT/check-call1.txt
V=attention_waits,defer_merge
timeout 100 python -m augury.bench.gemv_gpu --shapes "" --chains layer_chain --layer-variants $V,defer_split_r64,defer_split_r256,defer_split_w8,defer_split_bn8 --rounds 2 \
  --ctx 1100 --out $OUT/bf16 > $OUT/chain_bf16.log 2>&1; grep "layer chain" $OUT/chain_bf16.log | tail -12
timeout 80 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain --int4-layout mma \
  --layer-variants $V --rounds 2 --ctx 1100 --out $OUT/mma > $OUT/chain_mma.log 2>&1; grep "layer chain" $OUT/chain_mma.log | tail -4
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 32 ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 2 )) env "$@" > $OUT/e2e_$tag.log 2>&1; grep -h "'tok_s'" $OUT/e2e_$tag.log | sed "s/^/$tag /"; }
run bf_on $R --weights native --out /tmp/b1
run bf_off AUGURY_DEFER_MERGE=0 $R --weights native --out /tmp/b2
run i4_on AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a1
run i4_off AUGURY_INT4_GEMV=1 AUGURY_DEFER_MERGE=0 $R --weights int4 --out /tmp/a2
run bf_on2 $R --weights native --out /tmp/b3
run i4_on2 AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a3
echo done $(left)
