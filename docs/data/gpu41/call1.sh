# forty-first session, device call 1: the fortieth session's experiments (never measured: the device would not start)
# -- attention warming o_proj's int4 weight into the L2 (AUGURY_ATTN_WARM_O), tiles staged through shared memory by
# one- and two-warp programs -- in the layer chain; then end to end: the default, warming on, and the chain's
# per-product winners (pick.py) with warming on if it won the chain. BUDGET: seconds this script may use.
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-520} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
AUGURY_TEST_DEVICE=cuda timeout 70 python -m pytest -q -p no:cacheprovider tests/layers/test_triton_paged_decode.py \
  -k "warming or l2_prefetch" > $OUT/pytest1.txt 2>&1; tail -2 $OUT/pytest1.txt
V=attention_waits,attention_warms_o,w4m_w1st4_down,w4m_w1st3_down,w4m_w1st6_down,w4m_w1_down,w4m_w2st4_down
V=$V,w4m_st4_down,w4m_w2st4_gate_up,w4m_st4_gate_up,w4m_w1st4_o_proj,w4m_st4_qkv
timeout 230 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain --int4-layout mma \
  --layer-variants $V --rounds 2 --ctx 1100 --out /tmp/chain1 > /tmp/chain1.log 2>&1
grep "layer chain" /tmp/chain1.log | tee $OUT/chain1.log; tail -3 /tmp/chain1.log
mapfile -t P < <(python docs/data/gpu41/pick.py $OUT/chain1.log 2> $OUT/pick1.log); cat $OUT/pick1.log
BEST=${P[0]}; WARM=${P[1]}; echo "best: [$BEST] warm: [$WARM]"
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 40 ] || { echo "skip $tag"; return; }
  echo "=== $tag" >> $OUT/e2e1.log; timeout $(( $(left) - 2 )) env "$@" > /tmp/e2e.log 2>&1; cat /tmp/e2e.log >> $OUT/e2e1.log
  grep -h "'tok_s'" /tmp/e2e.log | sed "s/^/$tag /"; }
W=0; [ -n "$WARM" ] && W=1
for i in 1 2; do
  run base$i AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a$i
  run warm$i AUGURY_INT4_GEMV=1 AUGURY_ATTN_WARM_O=1 $R --weights int4 --out /tmp/b$i
  [ -n "$BEST" ] && run best$i AUGURY_INT4_GEMV=1 AUGURY_ATTN_WARM_O=$W AUGURY_W4M_CFG="$BEST" $R --weights int4 --out /tmp/c$i
done
echo done $(left)
