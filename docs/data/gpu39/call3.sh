# thirty-ninth session, device call 3: cache hints on the int4 GEMV's weight loads (W4MmaConfig.weight_cache: .cg,
# evict-first, ld.global.nc with and without L1 allocation); end to end for the chain's best against the default
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-540} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
AUGURY_TEST_DEVICE=cuda timeout 150 python -m pytest -q -p no:cacheprovider tests/layers/test_triton_gemv_w4m.py \
  -k "hints or (each_prologue and (208 or 96)) or bad_configs" > $OUT/pytest3.txt 2>&1; tail -2 $OUT/pytest3.txt
A='[{"weight_cache":1},{"weight_cache":2},{"weight_cache":3},{"weight_cache":4},{"lo":1},{"lo":1,"weight_cache":3}]'
CF="{\"gate_up\": $A, \"down\": $A, \"qkv\": $A, \"o_proj\": $A, \"lm_head\": [{\"weight_cache\":3},{\"weight_cache\":4}]}"
O=$OUT; OUT=/tmp timeout 150 python docs/data/gpu25/w4m_probe.py "$CF" 2>&1 | grep -v Warn > $O/probe3.log; cat $O/probe3.log
timeout 150 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain --int4-layout mma \
  --layer-variants attention_waits,w4m_wc1_all,w4m_wc2_all,w4m_wc3_all,w4m_wc4_all \
  --rounds 2 --ctx 1100 --out /tmp/chain3 > /tmp/chain3.log 2>&1
grep "layer chain" /tmp/chain3.log | tee $OUT/chain3.log
BEST=$(python docs/data/gpu39/pick.py $OUT/chain3.log); echo "best: $BEST"
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 45 ] || { echo "skip $tag"; return; }
  echo "=== $tag" >> $OUT/e2e3.log; timeout $(( $(left) - 2 )) env "$@" > /tmp/e2e.log 2>&1; cat /tmp/e2e.log >> $OUT/e2e3.log
  grep -h "'tok_s'" /tmp/e2e.log | sed "s/^/$tag /"; }
if [ -n "$BEST" ]; then
  for i in 1 2; do
    run base$i AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a$i
    run best$i AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="$BEST" $R --weights int4 --out /tmp/b$i
  done
fi
echo done $(left)
