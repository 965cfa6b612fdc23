# fortieth session, device call 2 (call 1 never started): the same, shorter (fewer variants, one end-to-end pair)
# chain (with tiles staged through shared memory by one- and two-warp programs), end to end against the default
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
AUGURY_TEST_DEVICE=cuda timeout 70 python -m pytest -q -p no:cacheprovider tests/layers/test_triton_paged_decode.py \
  -k "warming or l2_prefetch" > $OUT/pytest2.txt 2>&1; tail -2 $OUT/pytest2.txt
V=attention_waits,attention_warms_o,w4m_w1st4_down,w4m_w2st4_down,w4m_w2st4_gate_up,w4m_st4_gate_up
timeout 160 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain --int4-layout mma \
  --layer-variants $V --rounds 2 --ctx 1100 \
  --out /tmp/chain2 > /tmp/chain2.log 2>&1
grep "layer chain" /tmp/chain2.log | tee $OUT/chain2.log; tail -3 /tmp/chain2.log
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 30 ] || { echo "skip $tag"; return; }
  echo "=== $tag" >> $OUT/e2e2.log; timeout $(( $(left) - 2 )) env "$@" > /tmp/e2e.log 2>&1; cat /tmp/e2e.log >> $OUT/e2e2.log
  grep -h "'tok_s'" /tmp/e2e.log | sed "s/^/$tag /"; }
for i in 1; do
  run i4base$i AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a$i
  run i4warm$i AUGURY_INT4_GEMV=1 AUGURY_ATTN_WARM_O=1 $R --weights int4 --out /tmp/b$i
done
OLD="qkv:weight_cache=0;o_proj:weight_cache=0;gate_up:weight_cache=0;down:weight_cache=0;lm_head:weight_cache=0"
run i4wc0 AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="$OLD" $R --weights int4 --out /tmp/c
echo done $(left)
