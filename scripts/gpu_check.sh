#!/usr/bin/env bash
# One go on a GPU machine: the GPU test tier (parallel), then the benchmark report (verified, baseline
# interleaved) for every registry entry, then the bad-input table. Logs and the report go to $OUT when it
# is set (the device tool's output folder), else to ./.bench_out.
# Where the tree travels without .git, write the commit first: git rev-parse --short HEAD > .gpu/commit
#   bash scripts/gpu_check.sh [pytest args...]
# The whole tier takes about 530 s on the H200 with -n 14, so tests and report together overrun the
# device tool's 600 s per command. Split them with GPU_CHECK_PARTS (default "tests,report"), and the tests
# into interleaved shards with GPU_CHECK_SHARD (pytest --shard K/N, tests/conftest.py):
#   GPU_CHECK_PARTS=tests GPU_CHECK_SHARD=1/2 bash scripts/gpu_check.sh    # half the tier ...
#   GPU_CHECK_PARTS=tests GPU_CHECK_SHARD=2/2 bash scripts/gpu_check.sh    # ... and the other half
#   GPU_CHECK_PARTS=report bash scripts/gpu_check.sh                       # report and bad-input table
#   GPU_CHECK_PARTS=tests bash scripts/gpu_check.sh -m quick               # the quick tier (iteration)
#   GPU_CHECK_PARTS=tests GPU_CHECK_TESTS="tests/test_scan_gpu.py tests/x.py::test_y" bash scripts/gpu_check.sh
#                                                                   # only these files or tests (a change's own)
#   GPU_CHECK_PARTS=report GPU_CHECK_ZOO=1 bash scripts/gpu_check.sh       # the report with its shape zoo
#   GPU_CHECK_PARTS=host bash scripts/gpu_check.sh     # only the report's dispatch and first-call tables, into
#                                                      # $OUT/host.md (a few minutes: for a small device budget)
# The report compiles its kernels ahead in worker processes (bench --jobs, 8 on a lent machine) before it
# times anything. A cold zoo report outlasted one 600 s command before that (cut on an H100:
# docs/notes/method.md), so the report can also resume: GPU_CHECK_CHECKPOINT names a carried file of the
# rows measured so far (bench --checkpoint); the run copies it to $OUT/report-checkpoint.jsonl, adds each
# row there as it is measured, and a cut run's file comes back with what it finished. Copy it over the
# carried one and run again until the report is written:
#   GPU_CHECK_PARTS=report GPU_CHECK_ZOO=1 GPU_CHECK_CHECKPOINT=.gpu/report-checkpoint.jsonl \
#       timeout 570 bash scripts/gpu_check.sh
set -uo pipefail
# shellcheck disable=SC1091
source "$(dirname "$0")/gpu_deps.sh"  # wheels the lent machine lacks (apache-tvm-ffi)
out=${OUT:-.bench_out}
# The commit the report names: a lent machine may hold a stale .git, so .gpu/commit (written just before the
# tree travelled) wins when it is there.
if [ -f .gpu/commit ]; then export CUTE_KERNELS_COMMIT=${CUTE_KERNELS_COMMIT:-$(cat .gpu/commit)}; fi
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$out/gpu.txt"
parts=",${GPU_CHECK_PARTS:-tests,report},"
tests=0; bench=0; bad=0; host=0
if [[ $parts == *,tests,* ]]; then
  jobs=$(( $(nproc) / 2 )); [ "$jobs" -lt 1 ] && jobs=1
  shard=(); if [ -n "${GPU_CHECK_SHARD:-}" ]; then shard=(--shard "$GPU_CHECK_SHARD"); fi
  # Verbose into the log, so that a run cut short by the device's time limit still names each test that
  # failed before the cut (pytest's summary comes only at the end); the console gets the failures and the
  # closing lines.
  read -r -a selected <<< "${GPU_CHECK_TESTS:-tests}"
  python3 -m pytest "${selected[@]}" -v -p no:cacheprovider --timeout=900 -n "$jobs" --dist loadgroup --durations=15 "${shard[@]}" "$@" 2>&1 \
    | tee "$out/tests.log" | grep --line-buffered -E "FAILED|ERROR|^=|passed|failed|s call "
  tests=${PIPESTATUS[0]}
fi
if [[ $parts == *,report,* ]]; then
  zoo=(); if [ -n "${GPU_CHECK_ZOO:-}" ]; then zoo=(--zoo); fi
  checkpoint=()
  if [ -n "${GPU_CHECK_CHECKPOINT:-}" ]; then
    if [ -f "$GPU_CHECK_CHECKPOINT" ]; then cp "$GPU_CHECK_CHECKPOINT" "$out/report-checkpoint.jsonl"; fi
    checkpoint=(--checkpoint "$out/report-checkpoint.jsonl")
  fi
  python3 -m cute_kernels bench "${zoo[@]}" "${checkpoint[@]}" --write "$out/benchmarks.md" 2>&1 | tee "$out/bench.log"
  bench=${PIPESTATUS[0]}
  # The bad-input table docs/ record (every op's careless calls and how each ended).
  python3 -m cute_kernels.tools.bad_inputs > "$out/bad-inputs.md" 2>&1
  bad=$?
fi
if [[ $parts == *,host,* && $parts != *,report,* ]]; then
  # The user's host figures (issue 21) as the report measures them, without its GPU-time rows.
  python3 -c "from cute_kernels.tools import report; print(report.host_sections())" 2>&1 | tee "$out/host.md"
  host=${PIPESTATUS[0]}
fi
if [[ $parts != *,tests,* && $parts != *,report,* && $parts != *,host,* ]]; then
  echo "gpu_check: GPU_CHECK_PARTS=$GPU_CHECK_PARTS names none of tests, report and host" >&2
  exit 2
fi
echo "gpu_check: tests exit $tests, bench exit $bench, bad-input table exit $bad, host tables exit $host"
# The device tool brings back at most 8 files from $OUT, and a report with its zoo writes more (markdown,
# CSVs, charts, logs): then everything goes into one archive, which comes back whole, beside the test log
# and the report (the files are deleted only once the archive is there).
if [ -n "${OUT:-}" ] && [ "$(find "$OUT" -type f | wc -l)" -gt 8 ]; then
  archive=$(mktemp --suffix=.tar.gz)
  if tar -C "$OUT" -czf "$archive" . && mv "$archive" "$OUT/gpu_check.tar.gz"; then
    find "$OUT" -mindepth 1 ! -name gpu_check.tar.gz ! -name tests.log ! -name benchmarks.md -delete
  fi
fi
exit $(( tests || bench || bad || host ))
