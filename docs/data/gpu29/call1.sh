# twenty-ninth session, device call 1: the targets re-read at HEAD (030e4fd; no GPU code changed since 5a6f53a,
# whose qkv rope epilogue was checked offline only) and the CUDA tests not yet run on a GPU (RMSNorm at the
# default row steps)
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-540} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv
timeout 90 python -m pytest -q tests/layers/test_triton_rows.py tests/layers/test_rope.py -p no:cacheprovider > $OUT/pytest1.txt 2>&1
grep -E "passed|failed|Error" $OUT/pytest1.txt | tail -3
R="python -m augury.bench.roofline --quick --skip-small"
run() { tag=$1; need=$2; shift 2; [ $(left) -gt $need ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 2 )) env "$@" > $OUT/e2e1_$tag.log 2>&1; grep -h "'tok_s'\|tflop\|host\|bandwidth" $OUT/e2e1_$tag.log | sed "s/^/$tag /" | head -8; }
for i in 1 2; do
  run bf$i 45 $R --cases b1 --weights native --out $OUT/bf$i
  run i4_$i 60 AUGURY_INT4_GEMV=1 $R --cases b1 --weights int4 --out $OUT/i4_$i
done
run bf3 45 $R --cases b1 --weights native --out $OUT/bf3
run small 60 python -m augury.bench.roofline --quick --only-small --cases b1,host --out $OUT/small
echo done $(left)
