#!/usr/bin/env bash
# Hardware counters for the scan kernel at 2^28 float32 elements (ncu works on the Firecracker H200 machines;
# leave the clocks alone). Reports DRAM throughput, occupancy and where warps stall.
#   bash scripts/profile_scan.sh [threads items staged]      e.g. 512 32 1
set -euo pipefail
threads=${1:-512}; items=${2:-32}; staged=${3:-1}
out=${OUT:-.bench_out}
mkdir -p "$out"
ncu --clock-control none --kernel-name regex:scan_kernel --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
    --section SchedulerStats \
    python3 - "$threads" "$items" "$staged" <<'PY' 2>&1 | tee "$out/profile_scan_${threads}x${items}_s${staged}.txt"
import sys
import torch
import cute_kernels as ck
threads, items, staged = int(sys.argv[1]), int(sys.argv[2]), bool(int(sys.argv[3]))
x = torch.randn(1 << 28, device="cuda")
out = torch.empty_like(x)
config = ck.ScanConfig(threads, items, staged)
for _ in range(3):
    ck.scan(x, out=out, config=config)
torch.cuda.synchronize()
PY
