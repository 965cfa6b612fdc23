# twenty-seventh session, device call 1: the register cap (W4MmaConfig.maxnreg) at 3-4 tiles in flight, its CUDA
# test and the per-product probe; where the bf16 1k prefill's time goes (58.7% now against 71.8% at ac3b8f9)
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-500} - ($(date +%s) - T0) )); }
timeout 100 python -m pytest -q -x tests/layers/test_triton_gemv_w4m.py -k "capped or llama3_8b_shapes_match" \
  -p no:cacheprovider > $OUT/pytest1.txt 2>&1; tail -4 $OUT/pytest1.txt
CF='{"gate_up": [{"prefetch":3}, {"prefetch":3,"maxnreg":128}, {"prefetch":4,"maxnreg":128}], "down": [{"prefetch":3,"maxnreg":128}, {"prefetch":4,"maxnreg":128}], "lm_head": [{"prefetch":3,"maxnreg":128}]}'
timeout 170 python docs/data/gpu25/w4m_probe.py "$CF" > $OUT/probe1.log 2>&1; grep -v Warn $OUT/probe1.log | tail -24
timeout $(( $(left) - 5 )) python docs/data/gpu27/prefill_profile.py llama3-8b cuda > $OUT/prefill1.log 2>&1
grep -v Warn $OUT/prefill1.log | tail -36
echo done $(left)
