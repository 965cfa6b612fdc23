# forty-fourth session, device call 2: the engine's Gluon-staged int4 product (`gluon_gemv_w4m`, opt-in per product
# through W4MmaConfig.gluon) -- its CUDA tests against the Triton kernel, the layer chain with it per product and
# for all four, and int4 B=1 end to end against the default, alternating (a pair, the chain, a second pair). BUDGET: seconds this script may use.
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
# the LM head's shape left out here (its host-side quantization takes a while; the e2e runs keep it on Triton)
timeout ${TEST_S:-150} python -m pytest -q -p no:cacheprovider -x tests/layers/test_gluon_gemv_w4m.py -k "not 128256" > $OUT/pytest.txt 2>&1
tail -4 $OUT/pytest.txt; ! grep -qE "[0-9]+ (failed|error)" $OUT/pytest.txt || { grep -m8 "^E " $OUT/pytest.txt; echo "tests failed"; exit 1; }
GL="gate_up:gluon=8,rows_per_program=896,num_warps=4;down:gluon=8,rows_per_program=256,num_warps=1"
GL="$GL;qkv:gluon=4,rows_per_program=128,num_warps=2;o_proj:gluon=4,rows_per_program=64,num_warps=1"
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 45 ] || { echo "skip $tag"; return; }
  echo "=== $tag" >> $OUT/e2e.log; timeout $(( $(left) - 2 )) env "$@" > /tmp/e2e.log 2>&1; cat /tmp/e2e.log >> $OUT/e2e.log
  grep -h "'tok_s'" /tmp/e2e.log | sed "s/^/$tag /"; }
chain() { V=attention_waits,w4m_gl_all,w4m_gl2_all,w4m_gl_gate_up,w4m_gl_down,w4m_gl_qkv,w4m_gl_o_proj
  t=$(( $(left) - 200 )); [ $t -gt 150 ] && t=150; [ $t -gt 60 ] || { echo "skip chain"; return; }
  timeout $t python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain --int4-layout mma \
    --layer-variants $V --rounds 2 --ctx 1100 --out /tmp/chain > /tmp/chain.log 2>&1
  grep "layer chain" /tmp/chain.log | tee $OUT/chain.log; tail -3 /tmp/chain.log; }
# the end-to-end pair first (the target's number), then the chain, then the second pair
run gluon1 AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="$GL" $R --weights int4 --out /tmp/g1
run base1 AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a1
chain
run gluon2 AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="$GL" $R --weights int4 --out /tmp/g2
run base2 AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a2
echo done $(left)
