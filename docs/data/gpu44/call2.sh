# forty-fourth session, device call 2: the engine's Gluon-staged int4 product (`gluon_gemv_w4m`, opt-in per product
# through W4MmaConfig.gluon) -- its CUDA tests against the Triton kernel, the layer chain with it per product and
# for all four, then int4 B=1 end to end against the default, alternating. BUDGET: seconds this script may use.
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 170 python -m pytest -q -p no:cacheprovider -x tests/layers/test_gluon_gemv_w4m.py > $OUT/pytest.txt 2>&1
tail -5 $OUT/pytest.txt; grep -q " passed" $OUT/pytest.txt && ! grep -q "failed\|error" $OUT/pytest.txt || { grep -m5 "^E " $OUT/pytest.txt; echo "tests failed"; exit 1; }
V=attention_waits,w4m_gl_all,w4m_gl2_all,w4m_gl_gate_up,w4m_gl_down,w4m_gl_qkv,w4m_gl_o_proj
timeout 160 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain --int4-layout mma \
  --layer-variants $V --rounds 2 --ctx 1100 --out /tmp/chain > /tmp/chain.log 2>&1
grep "layer chain" /tmp/chain.log | tee $OUT/chain.log; tail -3 /tmp/chain.log
GL="gate_up:gluon=8,rows_per_program=896,num_warps=4;down:gluon=8,rows_per_program=256,num_warps=1"
GL="$GL;qkv:gluon=4,rows_per_program=128,num_warps=2;o_proj:gluon=4,rows_per_program=64,num_warps=1"
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 45 ] || { echo "skip $tag"; return; }
  echo "=== $tag" >> $OUT/e2e.log; timeout $(( $(left) - 2 )) env "$@" > /tmp/e2e.log 2>&1; cat /tmp/e2e.log >> $OUT/e2e.log
  grep -h "'tok_s'" /tmp/e2e.log | sed "s/^/$tag /"; }
for i in 1 2; do
  run gluon$i AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="$GL" $R --weights int4 --out /tmp/g$i
  run base$i AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a$i
done
echo done $(left)
