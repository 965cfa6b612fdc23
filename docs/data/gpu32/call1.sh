# thirty-first session, device call 1: the final code on a GPU (only CPU code changed since the
# thirtieth: the argmax import in models/base.py is on every path): CUDA tests of the engine, graphs and
# layers, then bf16 B=1 three times and int4 B=1 once
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-480} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv
timeout 200 python -m pytest -q -x -p no:cacheprovider tests/engine/test_cuda_graphs.py tests/engine/test_burst.py \
  tests/layers/test_triton_rows.py tests/cpu_kernels/test_argmax.py > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log
R="python -m augury.bench.roofline --quick --skip-small"
run() { tag=$1; need=$2; shift 2; [ $(left) -gt $need ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 2 )) env "$@" > $OUT/e2e1_$tag.log 2>&1; grep -h "decode B=1\|bandwidth" $OUT/e2e1_$tag.log | sed "s/^/$tag /" | head -4; }
for i in 1 2 3; do run bf$i 45 $R --cases b1 --weights native --out $OUT/bf$i; done
run i4 60 AUGURY_INT4_GEMV=1 $R --cases b1 --weights int4 --out $OUT/i4
echo done $(left)
