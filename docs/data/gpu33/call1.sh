# thirty-third session, device call 1: every GPU target of issue 5 re-read at the final code (a572ccd; the last
# code commit is 06c565a) in one machine start: the CUDA tests, bf16 B=1 and int4 B=1 twice each (alternating),
# bf16 B=64 and the bf16 1k prefill (eager), SmolLM2 B=1 with its per-step host time
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv
timeout 150 python -m pytest -q -p no:cacheprovider tests/engine/test_cuda_graphs.py tests/engine/test_burst.py \
  tests/layers/test_triton_rows.py tests/cpu_kernels/test_argmax.py > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log
R="python -m augury.bench.roofline --quick --skip-small --revision a572ccd"
run() { tag=$1; need=$2; shift 2; [ $(left) -gt $need ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 2 )) env "$@" > $OUT/e2e1_$tag.log 2>&1
  grep -h "'tok_s'\|bandwidth\|host" $OUT/e2e1_$tag.log | sed "s/^/$tag /" | head -6; }
for i in 1 2; do
  run bf$i 45 $R --cases b1 --weights native --out $OUT/bf$i
  run i4_$i 60 AUGURY_INT4_GEMV=1 $R --cases b1 --weights int4 --out $OUT/i4_$i
done
run b64 90 $R --cases b64 --weights native --out $OUT/b64
run prefill 60 $R --cases prefill --weights native --out $OUT/prefill
run small 50 python -m augury.bench.roofline --quick --only-small --cases b1,host --revision a572ccd --out $OUT/small
echo done $(left)
