# twenty-fourth session, device call 5: the w4m input-alignment guard (CUDA tests) and int4 end to end
set -x
AUGURY_TEST_DEVICE=cuda timeout 200 python -m pytest -q -p no:cacheprovider tests/layers/test_triton_gemv_w4m.py \
  tests/layers/test_triton_gemv_split.py > $OUT/pytest5.txt 2>&1; tail -4 $OUT/pytest5.txt
AUGURY_INT4_GEMV=1 timeout 100 python -m augury.bench.roofline --quick --cases b1 --skip-small --weights int4 --out /tmp/i4 > $OUT/e2e5_i4.log 2>&1
grep -h "'tok_s'" $OUT/e2e5_i4.log
