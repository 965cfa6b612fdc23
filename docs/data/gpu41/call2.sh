# forty-first session, device call 2: the int4 B=1 default end to end, twice, and bf16 B=1 once, on whichever card
# comes (asked for as nvidia-h200: the int4 target is stated on the H200, last read there before evict-first)
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-300} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 40 ] || { echo "skip $tag"; return; }
  echo "=== $tag" >> $OUT/e2e2.log; timeout $(( $(left) - 2 )) env "$@" > /tmp/e2e.log 2>&1; cat /tmp/e2e.log >> $OUT/e2e2.log
  grep -h "'tok_s'" /tmp/e2e.log | sed "s/^/$tag /"; }
run int4_1 AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a1
run bf16_1 $R --weights native --out /tmp/n1
run int4_2 AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a2
echo done $(left)
