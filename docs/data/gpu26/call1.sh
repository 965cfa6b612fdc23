# twenty-sixth session, device call 1: the persistent grid (W4MmaConfig.persistent): CUDA tests, the per-product
# probe, the layer chain, int4 B=1 end to end
set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
AUGURY_TEST_DEVICE=cuda timeout 90 python -m pytest -q -p no:cacheprovider tests/layers/test_triton_gemv_w4m.py \
  -k "persistent or cfg12 or cfg13 or cfg14 or cfg15 or bad_configs" > $OUT/pytest1.txt 2>&1; tail -3 $OUT/pytest1.txt
P4='{"persistent":4}'; P3F4='{"persistent":3,"prefetch":4}'; P3F3='{"persistent":3,"prefetch":3}'; P4F1='{"persistent":4,"prefetch":1}'
L='{"persistent":4,"lo":1}'; L4='{"persistent":3,"prefetch":4,"lo":1}'
CF="{\"gate_up\": [$P4,$P3F4,$P3F3,$L,$L4], \"down\": [$P4,$P3F4,$P3F3,$L,$L4], \"qkv\": [$P4,$P3F4,$P4F1],
 \"o_proj\": [$P4,$P3F4,$P4F1], \"lm_head\": [$P4,$P3F4]}"
timeout 110 python docs/data/gpu25/w4m_probe.py "$CF" > $OUT/probe1.log 2>&1; grep -v Warn $OUT/probe1.log | tail -30
timeout 150 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain --int4-layout mma \
  --layer-variants attention_waits,w4m_ps4_all,w4m_ps3pf4_all,w4m_ps4_down,w4m_ps4_gate_up,w4m_ps4_qkv,w4m_ps4_o_proj \
  --rounds 2 --ctx 1100 --out $OUT/chain1 > $OUT/chain1.log 2>&1
grep "layer chain" $OUT/chain1.log | tail -14
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 60 ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 2 )) env "$@" > $OUT/e2e1_$tag.log 2>&1; grep -h "'tok_s'" $OUT/e2e1_$tag.log | sed "s/^/$tag /"; }
PS="qkv:persistent=4;o_proj:persistent=4;gate_up:persistent=4;down:persistent=4"
for i in 1 2; do
  run i4base$i AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/a$i
  run i4ps4$i AUGURY_INT4_GEMV=1 AUGURY_W4M_CFG="$PS" $R --weights int4 --out /tmp/b$i
done
echo done $(left)
