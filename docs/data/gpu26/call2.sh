# twenty-sixth session, device call 2: the CUDA tests call 1's 90 s cut off; ncu of the persistent grid against the
# grid form (gate_up, down; with products and loads only)
set -x
AUGURY_TEST_DEVICE=cuda timeout 200 python -m pytest -q -p no:cacheprovider tests/layers/test_triton_gemv_w4m.py \
  -k "4096-14336 and persistent or persistent_grid_replays or loads_16_byte" > $OUT/pytest2.txt 2>&1; tail -3 $OUT/pytest2.txt
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
timeout 300 $NCU --clock-control none -k regex:_w4_mma --launch-skip-before-match 0 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis --metrics dram__bytes_read.sum,smsp__inst_executed.sum,sm__cycles_active.avg,sm__cycles_elapsed.avg \
  python docs/data/gpu26/ncu_probe.py '[{"persistent": 4}, {"persistent": 4, "lo": 1}, {"lo": 1}]' > $OUT/ncu2.txt 2>&1
grep -E "^[0-9]|_w4_mma|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Issued Warp|Eligible Warps|Active Warps Per|Stall|Warp Cycles Per Issued|Waves Per SM|No Eligible|inst_executed|cycles_active|cycles_elapsed" $OUT/ncu2.txt | head -200
