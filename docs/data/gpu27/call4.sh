# twenty-seventh session, device call 4: the many-row steps with RMSNorm on the bf16 rows and its weight product in Triton -- their CUDA tests,
# the CUDA-graph engine tests and the model tests on the GPU; greedy equality and the 1k prefill off/on in one
# engine (rows_ab.py); B=64 eager with them on and off
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-500} - ($(date +%s) - T0) )); }
timeout 150 python -m pytest -q tests/layers/test_triton_rows.py tests/engine/test_cuda_graphs.py \
  -p no:cacheprovider > $OUT/pytest4.txt 2>&1; grep -E "passed|failed|Error" $OUT/pytest4.txt | tail -5
AUGURY_TEST_DEVICE=cuda timeout 100 python -m pytest -q tests/models tests/layers/test_rope.py -p no:cacheprovider \
  >> $OUT/pytest4.txt 2>&1; grep -E "passed|failed|Error" $OUT/pytest4.txt | tail -5
ROUNDS=3 timeout 180 python docs/data/gpu27/rows_ab.py llama3-8b cuda > $OUT/rows_ab4.log 2>&1
grep -v Warn $OUT/rows_ab4.log | tail -22
timeout 150 python docs/data/gpu27/prefill_gaps.py llama3-8b cuda > $OUT/gaps.log 2>&1
grep -v Warn $OUT/gaps.log | grep -v "rms_norm bf16-in.*mismatches 0 " | tail -40 | cut -c1-300
grep -c "mismatches 0 " $OUT/gaps.log
for on in 1 0; do
  [ $(left) -lt 70 ] && break
  mkdir -p $OUT/b64_$on
  AUGURY_TRITON_ROWS=$on timeout $(( $(left) - 5 )) python -m augury.bench.roofline --quick --skip-small --weights native \
    --cases b64 --revision "$REV rows=$on" --out $OUT/b64_$on > $OUT/b64_$on.log 2>&1; grep -v Warn $OUT/b64_$on.log | tail -2
done
echo done $(left)
