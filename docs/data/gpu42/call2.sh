# forty-second session, device call 2: the Gluon cp.async-staged int4 product probe against the engine's kernel
set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt; python3 -c "import triton, torch; print(triton.__version__, torch.__version__)" | tee -a $OUT/gpu.txt
timeout ${BUDGET:-400} python docs/data/gpu42/gluon_probe.py ${SHAPES:-gate_up,down,qkv,o_proj} 2>&1 | grep -v "leaked\|nanobind\|^ - " | tee $OUT/gluon.log | tail -60
