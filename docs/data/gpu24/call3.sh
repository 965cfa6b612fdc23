# twenty-fourth session, device call 3: the int4 (tensor-core) o_proj merging attention's partials, fixed
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
timeout 90 python docs/data/gpu23/check_defer.py 1100 200 4000 > $OUT/check3.txt 2>&1; tail -6 $OUT/check3.txt
AUGURY_TEST_DEVICE=cuda timeout 170 python -m pytest -q -p no:cacheprovider tests/layers/test_triton_gemv_split.py \
  tests/layers/test_triton_gemv_w4m.py > $OUT/pytest3.txt 2>&1; tail -4 $OUT/pytest3.txt
timeout 120 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain --int4-layout mma \
  --layer-variants attention_waits,defer_merge,attention_waits_no_l2 --rounds 2 --ctx 1100 --out $OUT/mma > $OUT/chain3_mma.log 2>&1
grep "layer chain" $OUT/chain3_mma.log | tail -6
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 40 ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 2 )) env "$@" > $OUT/e2e3_$tag.log 2>&1; grep -h "'tok_s'" $OUT/e2e3_$tag.log | sed "s/^/$tag /"; }
for i in 1 2; do
  run i4def$i AUGURY_INT4_GEMV=1 AUGURY_DEFER_MERGE=int4 $R --weights int4 --out /tmp/a$i
  run i4base$i AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/b$i
done
run bf$i $R --weights native --out /tmp/c1
echo done $(left)
