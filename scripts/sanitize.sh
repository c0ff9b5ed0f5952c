#!/usr/bin/env bash
# compute-sanitizer over every kernel on small ragged shapes: the bad-input suite's cases (each op's
# misaligned, sliced, transposed, empty and NaN/Inf inputs, plus the errors; default configs), then
# scripts/sanitize_kernels.py (every variant and main-loop schedule, named configs, partial tiles everywhere),
# under memcheck, then racecheck (shared-memory hazards) and synccheck. Logs to $OUT (or ./.bench_out); the exit status is the tools'.
#   bash scripts/sanitize.sh [memcheck racecheck synccheck]
set -uo pipefail
# shellcheck disable=SC1091
source "$(dirname "$0")/gpu_deps.sh"  # wheels the lent machine lacks (apache-tvm-ffi)
out=${OUT:-.bench_out}
mkdir -p "$out"
tools=${*:-memcheck racecheck synccheck}
status=0
for tool in $tools; do
  for suite in bad_inputs kernels; do
    if [ "$suite" = bad_inputs ]; then cmd=(python3 -m cute_kernels.tools.bad_inputs)
    else cmd=(python3 "$(dirname "$0")/sanitize_kernels.py"); fi
    log="$out/sanitize-$tool-$suite.log"
    # --report-api-errors no: cuda-python probes the driver for entry points this driver lacks
    # (cuGetProcAddress answers "invalid argument"); those host API errors are not kernel faults.
    compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 50 --report-api-errors no \
      "${cmd[@]}" > "$log" 2>&1
    rc=$?
    echo "$tool $suite: exit $rc; $(grep -a -c 'WRONG\|RAISED' "$log") wrong or raising case(s);" \
      "$(grep -a 'SUMMARY' "$log" | tail -1)"
    [ $rc -ne 0 ] && status=1
  done
done
exit $status
