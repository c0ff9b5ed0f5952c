#!/usr/bin/env bash
# Run a branch beside main in one device call. The device tool sends the working tree (main) only, so a
# branch travels as a tarball of the files it adds or changes, which this script unpacks over a copy of the
# tree on the lent machine before running a command there (its tests, a probe) with that copy first on
# PYTHONPATH. Deleted files are not carried: a branch that deletes files is not run this way.
#   here:    bash scripts/gpu_branch.sh pack BRANCH          # writes .gpu/branches/BRANCH.tgz (carried with .gpu)
#   device:  bash scripts/gpu_branch.sh run BRANCH COMMAND...  # COMMAND runs in /tmp/branch_BRANCH
# Main's own tree stays where it is, so a probe can time main's kernel and the branch's in one call:
#   for tree in $PWD /tmp/branch_B; do (cd $tree && PYTHONPATH=$tree:$PYTHONPATH python3 scripts/probes/...); done
set -euo pipefail
what=${1:?pack or run}; branch=${2:?branch name}; shift 2
tarball=".gpu/branches/${branch//\//_}.tgz"
case $what in
  pack)
    mkdir -p .gpu/branches
    if [ -n "$(git diff --name-only --diff-filter=D main "$branch")" ]; then
      echo "gpu_branch: $branch deletes files; a tarball of changed files cannot carry that" >&2; exit 1
    fi
    files=$(git diff --name-only --diff-filter=AM main "$branch")
    if [ -z "$files" ]; then echo "gpu_branch: $branch changes no file against main" >&2; exit 1; fi
    # The files as the branch has them, without checking it out.
    git archive --format=tar "$branch" $files | gzip > "$tarball"
    echo "gpu_branch: $tarball ($(echo "$files" | wc -l) files, $(du -h "$tarball" | cut -f1))"
    ;;
  run)
    dest="/tmp/branch_${branch//\//_}"
    rm -rf "$dest" && mkdir -p "$dest"
    tar --exclude=./.gpu -cf - . | tar -xf - -C "$dest"
    tar -xzf "$tarball" -C "$dest"
    cd "$dest"
    PYTHONPATH="$dest:${PYTHONPATH:-}" "$@"
    ;;
  *) echo "gpu_branch: pack or run, not $what" >&2; exit 2 ;;
esac
