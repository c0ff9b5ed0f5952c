#!/usr/bin/env bash
# compute-sanitizer over every public op on small ragged shapes: the bad-input suite's cases (each op's
# misaligned, sliced, transposed, empty and NaN/Inf inputs, plus the errors) under memcheck, then racecheck
# (shared-memory hazards) and synccheck. Logs to $OUT (or ./.bench_out); the exit status is the tools'.
#   bash scripts/sanitize.sh [memcheck racecheck synccheck]
set -uo pipefail
# shellcheck disable=SC1091
source "$(dirname "$0")/gpu_deps.sh"  # wheels the lent machine lacks (apache-tvm-ffi)
out=${OUT:-.bench_out}
mkdir -p "$out"
tools=${*:-memcheck racecheck synccheck}
status=0
for tool in $tools; do
  # --report-api-errors no: cuda-python probes the driver for entry points this driver lacks
  # (cuGetProcAddress answers "invalid argument"); those host API errors are not kernel faults.
  compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 50 --report-api-errors no \
    python3 -m cute_kernels.bad_inputs > "$out/sanitize-$tool.log" 2>&1
  rc=$?
  echo "$tool: exit $rc; $(grep -a -c 'WRONG' "$out/sanitize-$tool.log") WRONG case(s); $(grep -a 'ERROR SUMMARY' "$out/sanitize-$tool.log" | tail -1)"
  [ $rc -ne 0 ] && status=1
done
exit $status
