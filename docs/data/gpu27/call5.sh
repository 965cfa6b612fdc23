# twenty-seventh session, device call 5: which many-row steps pay in the eager 1k prefill (host-bound in parts:
# call 4's gaps) -- every AUGURY_TRITON_ROWS setting interleaved over 8 rounds in one engine; B=64 eager (CUDA
# graphs: no host cost) with all of them and without the weight product
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-500} - ($(date +%s) - T0) )); }
timeout 60 python -m pytest -q tests/layers/test_triton_rows.py -p no:cacheprovider > $OUT/pytest5.txt 2>&1
grep -E "passed|failed|Error" $OUT/pytest5.txt | tail -3
VARIANTS="0;silu_mul,rope;silu_mul,rope,norm;1" ROUNDS=8 timeout 200 python docs/data/gpu27/rows_ab.py llama3-8b cuda \
  > $OUT/rows_ab5.log 2>&1
grep -v Warn $OUT/rows_ab5.log | tail -22
for on in silu_mul,rope,norm 1; do
  [ $(left) -lt 70 ] && break
  d=b64_$(echo $on | tr -c 'a-z0-9\n' _); mkdir -p $OUT/$d
  AUGURY_TRITON_ROWS=$on timeout $(( $(left) - 5 )) python -m augury.bench.roofline --quick --skip-small --weights native \
    --cases b64 --revision "$REV rows=$on" --out $OUT/$d > $OUT/$d.log 2>&1; grep -v Warn $OUT/$d.log | tail -2
done
echo done $(left)
