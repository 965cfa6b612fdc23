set -x
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $OUT/smi.txt 2>&1
timeout 400 python -m augury.bench.gemv_gpu --weights int4 --shapes "" --chains layer_chain \
  --int4-layout tttt,rrrr,trrr,rtrr,rrtr,rrrt --layer-variants attention_waits --rounds 2 --ctx 1100 \
  --out $OUT > $OUT/chain.log 2>&1
tail -30 $OUT/chain.log
timeout 120 python -m pytest -q -x tests/layers/test_triton_gemv_w4r.py > $OUT/tests.txt 2>&1
tail -5 $OUT/tests.txt
