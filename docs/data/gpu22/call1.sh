set -x
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
python -c "import triton, torch; print(triton.__version__, torch.__version__)"
CF='{"gate_up": [[1024,4],[512,4],[1024,8],[2048,4],[512,8]], "down": [[512,4],[256,4],[512,8],[1024,4]], "qkv": [[512,4],[256,4],[512,8],[1024,4]], "o_proj": [[256,4],[128,4],[256,8],[512,4]], "lm_head": [[1024,4],[2048,4],[512,4]]}'
timeout 240 python docs/data/gpu22/w4m_probe.py "$CF" > $OUT/probe1.log 2>&1; tail -40 $OUT/probe1.log
