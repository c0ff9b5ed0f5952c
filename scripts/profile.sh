#!/usr/bin/env bash
# Nsight Compute counters for the given targets (see scripts/profile_kernels.py for the target syntax): speed
# of light, memory (with the shared-memory bank-conflict table), occupancy, where warps stall, issue slots and
# the instruction mix. ncu works on the H200
# machines; the clocks are left alone. Output: $OUT/profile.txt (or ./.bench_out).
#   bash scripts/profile.sh scan:268435456:512:48:1 hgemm:8192 sgemm:4096
set -euo pipefail
# shellcheck disable=SC1091
source "$(dirname "$0")/gpu_deps.sh"  # wheels the lent machine lacks (apache-tvm-ffi)
out=${OUT:-.bench_out}
mkdir -p "$out"
ncu --profile-from-start off --clock-control none \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --section Occupancy --section WarpStateStats \
    --section SchedulerStats --section InstructionStats --section LaunchStats --section ComputeWorkloadAnalysis \
    python3 "$(dirname "$0")/profile_kernels.py" "$@" 2>&1 | tee "$out/profile.txt"
