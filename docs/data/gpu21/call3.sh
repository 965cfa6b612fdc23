set -x
T0=$(date +%s); left() { echo $(( ${BUDGET:-480} - ($(date +%s) - T0) )); }
V4=attention_waits,w4_late_all,w4_late_all_d256,w4_late_all_d256_st1,w4_late_all_q256,w4_late_all_d256_q256,w4_late_but_down,w4_late_but_down_d256,no_pdl
timeout 150 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain \
  --int4-layout rows --layer-variants $V4 --rounds 2 --ctx 1100 --out $OUT/i4 > $OUT/chain_int4.log 2>&1
grep "layer chain" $OUT/chain_int4.log
E4=$(python .devrun/pick.py $OUT/i4/gemv_gpu_int4.json w4cfg 0)
R="python -m augury.bench.roofline --quick --cases b1 --skip-small"
run() { tag=$1; shift; [ $(left) -gt 40 ] || { echo "skip $tag"; return; }
  timeout $(( $(left) - 3 )) env "$@" > $OUT/e2e_$tag.log 2>&1; grep -h "'tok_s'" $OUT/e2e_$tag.log | sed "s/^/$tag /"; }
for i in 1 2; do
  run rows$i AUGURY_INT4_GEMV=1 AUGURY_INT4_GEMV_LAYOUT=rows AUGURY_W4R_CFG="$E4" $R --weights int4 --out /tmp/a$i
  run tg$i AUGURY_INT4_GEMV=1 $R --weights int4 --out /tmp/d$i
done
[ $(left) -gt 60 ] && timeout 70 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain \
  --int4-layout tinygemm --layer-variants attention_waits,w4t_late_all --rounds 2 --ctx 1100 --out $OUT/i4t > $OUT/chain_int4_tg.log 2>&1
grep "layer chain" $OUT/chain_int4_tg.log
for i in 1 2 3; do run bf$i AUGURY_GEMV_CFG= $R --weights native --out /tmp/b$i; done
echo "E4=$E4" done $(left)
