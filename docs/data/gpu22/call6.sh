set -x
timeout 200 python -m pytest -q tests/layers/test_triton_gemv_w4m.py tests/layers/test_triton_gemv_w4r.py -k "llama3 or late or replays or prologue or fused or nibble or rope" > $OUT/cuda-tests-final.txt 2>&1; tail -3 $OUT/cuda-tests-final.txt
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
for i in 1 2; do timeout 90 env AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a$i > $OUT/e2e_final$i.log 2>&1; grep -h "'tok_s'" $OUT/e2e_final$i.log; done
