#!/usr/bin/env bash
# Sweeps on a lent GPU machine, packed for the trip back: each op's sweep (CSV, Markdown, heatmaps) and the
# tuned tables it wrote go into one archive under $OUT, because the device tool returns only a limited
# number of files. Where the tree travelled without .git, write the commit first: git rev-parse --short HEAD > .gpu/commit
#   bash scripts/gpu_sweep.sh "hgemm" "sgemm --limit 60 --problems 1,2" ...
set -uo pipefail
# shellcheck disable=SC1091
source "$(dirname "$0")/gpu_deps.sh"  # wheels the lent machine lacks (apache-tvm-ffi)
out=${OUT:-.bench_out}
mkdir -p "$out/sweeps"
if [ -f .gpu/commit ]; then export CUTE_KERNELS_COMMIT=${CUTE_KERNELS_COMMIT:-$(cat .gpu/commit)}; fi
# --write-tuned writes each winner into the user's tuned tables (never into the package): point them into
# the archive, where they travel back to be merged into cute_kernels/tuned/ by hand.
export CUTE_KERNELS_TUNED_DIR="$out/sweeps/tuned"
status=0
for spec in "$@"; do
  op=${spec%% *}; rest=${spec#"$op"}
  # shellcheck disable=SC2086
  python3 -m cute_kernels sweep --op "$op" $rest --jobs "$(nproc)" --out "$out/sweeps/$op" --write-tuned \
    > "$out/sweeps/$op.log" 2>&1 || status=1
  grep -a "^|\|points:\|^tuned " "$out/sweeps/$op.log"
done
tar czf "$out/sweeps.tgz" -C "$out" sweeps && rm -rf "$out/sweeps"
exit $status
