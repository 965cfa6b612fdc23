# twenty-fifth session, device call 5: the final code (gate_up in 896-row chunks by default): CUDA tests of the
# int4 GEMVs whose epilogue changed, int4 and bf16 B=1 end to end
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-400} - ($(date +%s) - T0) )); }
AUGURY_TEST_DEVICE=cuda timeout 150 python -m pytest -q -p no:cacheprovider tests/layers/test_triton_gemv_w4m.py \
  tests/layers/test_triton_gemv_int4.py > $OUT/pytest5.txt 2>&1; tail -3 $OUT/pytest5.txt
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 40 ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 2 )) env "$@" > $OUT/e2e5_$tag.log 2>&1; grep -h "'tok_s'" $OUT/e2e5_$tag.log | sed "s/^/$tag /"; }
run i4a AUGURY_INT4_GEMV=1 $R --weights int4 --out $OUT/i4a
run bf $R --weights native --out $OUT/bf
run i4b AUGURY_INT4_GEMV=1 $R --weights int4 --out $OUT/i4b
echo done $(left)
