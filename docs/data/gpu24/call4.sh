# twenty-fourth session, device call 4: the final code end to end (bf16 and int4 B=1, attention's L2 hints on / off)
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-480} - ($(date +%s) - T0) )); }
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 40 ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 2 )) env "$@" > $OUT/e2e4_$tag.log 2>&1; grep -h "'tok_s'" $OUT/e2e4_$tag.log | sed "s/^/$tag /"; }
for i in 1 2; do
  run bf$i $R --weights native --out $OUT/bf$i
  run bfnol2$i AUGURY_ATTN_L2_PREFETCH=0 $R --weights native --out /tmp/n$i
  run i4$i AUGURY_INT4_GEMV=1 $R --weights int4 --out $OUT/i4$i
done
run bf3 $R --weights native --out /tmp/bf3
echo done $(left)
