# thirtieth session, device call 1 (the twenty-ninth's call 2, which got no machine): more samples of bf16 B=1 at the line (call 1: 89.2 / 90.0 / 90.1%), one more
# int4 B=1; no GPU code changed since call 1
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-480} - ($(date +%s) - T0) )); }
R="python -m augury.bench.roofline --quick --skip-small"
run() { tag=$1; need=$2; shift 2; [ $(left) -gt $need ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 2 )) env "$@" > $OUT/e2e1_$tag.log 2>&1; grep -h "'tok_s'\|bandwidth" $OUT/e2e1_$tag.log | sed "s/^/$tag /" | head -4; }
for i in 1 2 3 4 5; do run bf$i 45 $R --cases b1 --weights native --out $OUT/bf$i; done
run i4_3 60 AUGURY_INT4_GEMV=1 $R --cases b1 --weights int4 --out $OUT/i4_3
echo done $(left)
