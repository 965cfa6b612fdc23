# twenty-sixth session, device call 4: the targets re-read at this session's final code (no kernel default
# changed): bf16 B=1 three times, bf16 prefill 1k, SmolLM2 B=1 with its host time
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-500} - ($(date +%s) - T0) )); }
R="python -m augury.bench.roofline --quick --skip-small"
run() { tag=$1; need=$2; shift 2; [ $(left) -gt $need ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 2 )) env "$@" > $OUT/e2e4_$tag.log 2>&1; grep -h "'tok_s'\|tflop\|host" $OUT/e2e4_$tag.log | sed "s/^/$tag /" | head -8; }
for i in 1 2 3; do run bf$i 60 $R --cases b1 --weights native --out $OUT/bf$i; done
run prefill 120 $R --cases prefill --weights native --out $OUT/prefill
run small 60 python -m augury.bench.roofline --quick --only-small --cases b1,host --out $OUT/small
echo done $(left)
