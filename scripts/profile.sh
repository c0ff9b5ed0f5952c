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
# PROFILE_STALLS=1 adds the per-reason stall metrics (cycles a warp waits per issued instruction, by
# reason: barrier, long/short scoreboard, math pipe throttle, ...), which the text report does not print.
extra=()
if [ "${PROFILE_STALLS:-0}" = 1 ]; then
  extra=(--metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio')
fi
ncu --profile-from-start off --clock-control none ${extra[@]+"${extra[@]}"} \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --section Occupancy --section WarpStateStats \
    --section SchedulerStats --section InstructionStats --section LaunchStats --section ComputeWorkloadAnalysis \
    python3 "$(dirname "$0")/profile_kernels.py" "$@" 2>&1 | tee "$out/profile.txt"
