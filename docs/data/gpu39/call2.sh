# thirty-ninth session, device call 2: L2 hints only before the PDL wait (W4MmaConfig.l2_first), and ahead of the
# cp.async stages (which load nothing before the wait); end to end for the chain's best against the default
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
AUGURY_TEST_DEVICE=cuda timeout 120 python -m pytest -q -p no:cacheprovider tests/layers/test_triton_gemv_w4m.py \
  -k "l2_hints or (each_prologue and 208)" > $OUT/pytest2.txt 2>&1; tail -2 $OUT/pytest2.txt
timeout 60 python docs/data/gpu39/regs.py '{"gate_up": [{"l2_first":2},{"l2_ahead":2},{"stages":3},{"stages":3,"l2_first":2}], "down": [{"l2_first":2},{"stages":3}]}' 2>&1 | grep -v Warn | tee $OUT/regs2.log
A='[{"l2_first":1},{"l2_first":2},{"l2_ahead":1},{"stages":3},{"stages":3,"l2_first":2},{"stages":4,"l2_first":3}]'
CF="{\"gate_up\": $A, \"down\": $A, \"qkv\": $A, \"o_proj\": $A}"
O=$OUT; OUT=/tmp timeout 150 python docs/data/gpu25/w4m_probe.py "$CF" 2>&1 | grep -v Warn > $O/probe2.log; cat $O/probe2.log
timeout 170 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain --int4-layout mma \
  --layer-variants attention_waits,w4m_l2f1_all,w4m_l2f2_all,w4m_st3_all,w4m_st3f2_all,w4m_st4f3_all,w4m_st2f1_all \
  --rounds 2 --ctx 1100 --out /tmp/chain2 > /tmp/chain2.log 2>&1
grep "layer chain" /tmp/chain2.log | tee $OUT/chain2.log
BEST=$(python docs/data/gpu39/pick.py $OUT/chain2.log); echo "best: $BEST"
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 45 ] || { echo "skip $tag"; return; }
  echo "=== $tag" >> $OUT/e2e2.log; timeout $(( $(left) - 2 )) env "$@" > /tmp/e2e.log 2>&1; cat /tmp/e2e.log >> $OUT/e2e2.log
  grep -h "'tok_s'" /tmp/e2e.log | sed "s/^/$tag /"; }
for i in 1 2; do
  run base$i AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a$i
  [ -n "$BEST" ] && run best$i AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="$BEST" $R --weights int4 --out /tmp/b$i
done
echo done $(left)
