# thirty-ninth session, device call 4: evict-first on the int4 GEMV's weight loads as the default (CUDA tests, chain,
# end to end against the old default), and the same hint for the bf16 GEMV (GemvConfig.weight_cache, opt-in)
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
AUGURY_TEST_DEVICE=cuda timeout 240 python -m pytest -q -p no:cacheprovider tests/layers/test_triton_gemv_w4m.py \
  tests/layers/test_triton_gemv.py > $OUT/pytest4.txt 2>&1; tail -2 $OUT/pytest4.txt
timeout 100 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain --int4-layout mma \
  --layer-variants attention_waits,w4m_wc0_all --rounds 2 --ctx 1100 --out /tmp/chain4 > /tmp/chain4.log 2>&1
grep "layer chain" /tmp/chain4.log | tee $OUT/chain4.log
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 30 ] || { echo "skip $tag"; return; }
  echo "=== $tag" >> $OUT/e2e4.log; timeout $(( $(left) - 2 )) env "$@" > /tmp/e2e.log 2>&1; cat /tmp/e2e.log >> $OUT/e2e4.log
  grep -h "'tok_s'" /tmp/e2e.log | sed "s/^/$tag /"; }
OLD="qkv:weight_cache=0;o_proj:weight_cache=0;gate_up:weight_cache=0;down:weight_cache=0;lm_head:weight_cache=0"
EF="qkv:weight_cache=2;o_proj:weight_cache=2;gate_up:weight_cache=2;down:weight_cache=2;lm_head:weight_cache=2"
for i in 1 2; do
  run i4new$i AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a$i
  run i4old$i AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="$OLD" $R --weights int4 --out /tmp/b$i
  run bfbase$i $R --weights native --out /tmp/c$i
  run bfef$i AUGURY_GEMV_CFG="$EF" $R --weights native --out /tmp/d$i
done
run i4head0 AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="lm_head:weight_cache=0" $R --weights int4 --out /tmp/e
echo done $(left)
