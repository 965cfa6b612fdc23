# twenty-seventh session, device call 2: at the session's code, the compiled bf16 1k prefill (the 71.8% of
# ac3b8f9 was compiled; call 1's 58.4% is eager, so no regression is shown yet) and B=64 eager
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-500} - ($(date +%s) - T0) )); }
export TORCHINDUCTOR_CACHE_DIR=/tmp/ind
mkdir -p $OUT/pf $OUT/b64
timeout 300 python -m augury.bench.roofline --compile --quick --skip-small --weights native --cases prefill \
  --revision "$REV" --out $OUT/pf > $OUT/pf-compile.log 2>&1; grep -v Warn $OUT/pf-compile.log | tail -5
timeout $(( $(left) - 5 )) python -m augury.bench.roofline --quick --skip-small --weights native --cases b64 \
  --revision "$REV" --out $OUT/b64 > $OUT/b64-eager.log 2>&1; grep -v Warn $OUT/b64-eager.log | tail -5
echo done $(left)
