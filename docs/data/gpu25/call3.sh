# twenty-fifth session, device call 3: ncu of the tensor-core int4 GEMV (gate_up, down; 2 / 4 tiles in flight;
# the loads-only probe), warp stall reasons and occupancy
set -x
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
timeout 300 $NCU --clock-control none -k regex:_w4_mma_kernel --launch-skip-before-match 0 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis --metrics dram__bytes_read.sum,smsp__inst_executed.sum \
  python docs/data/gpu25/ncu_probe.py > $OUT/ncu3.txt 2>&1
grep -E "^[0-9]|_w4_mma_kernel|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Issued Warp|Eligible Warps|Active Warps Per|Stall|Warp Cycles Per Issued|Waves Per SM|No Eligible" $OUT/ncu3.txt | head -150
