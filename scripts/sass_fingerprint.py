"""SASS fingerprints of a sample of every registry entry's kernels, compiled for sm_90a with no GPU.

A change that should leave the kernels alone (a restructuring, a comment, a host-side fix) proves it by
printing the same fingerprints before and after: for each entry, the default config of each standard
problem plus a few candidates, compiled through the entry's own ``compile``; each binary's SASS read with
``cuobjdump -sass`` and reduced to its instructions (addresses, file names and line tables dropped), then
hashed.

    PYTHONPATH=. python scripts/sass_fingerprint.py --cuobjdump /path/to/cuobjdump > after.json
    python scripts/sass_fingerprint.py --compare before.json after.json

``cuobjdump`` and the ``nvdisasm`` it calls come with the CUDA toolkit or the pip wheels
``nvidia-cuda-cuobjdump`` / ``nvidia-cuda-nvdisasm`` (``nvidia/cu13/bin``); nvdisasm must be on PATH.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")


def sass_instructions(cubin_path: str, cuobjdump: str) -> list[str]:
    run = subprocess.run([cuobjdump, "-sass", cubin_path], capture_output=True, text=True, check=True)
    code = [m.group(1) for line in run.stdout.splitlines() if (m := _INSTRUCTION.match(line))]
    if not code:
        raise RuntimeError(f"cuobjdump printed no SASS for {cubin_path} (is nvdisasm on PATH?)")
    return code


def _digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def sample(spec, per_entry: int) -> list[tuple]:
    """(problem, config) pairs: each standard problem's default config, then ``per_entry`` candidates that
    the first standard problem supports, spread evenly over the sweep space."""
    pairs = [(p, spec.default_config(p)) for p in spec.standard_problems()]
    first = spec.standard_problems()[0]
    supported = spec.supported_candidates(first)
    step = max(1, len(supported) // max(per_entry, 1))
    pairs += [(first, c) for c in supported[::step][:per_entry]]
    return pairs


def fingerprints(per_entry: int, cuobjdump: str, op: str | None = None) -> dict[str, str]:
    dump = tempfile.mkdtemp(prefix="sass_fingerprint_")
    os.environ.update(CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="cubin", CUTE_DSL_DUMP_DIR=dump,
                      CUTE_KERNELS_DISK_CACHE="0")
    import cute_kernels as ck

    out: dict[str, str] = {}
    for spec in ck.registry.list(op):
        for problem, config in sample(spec, per_entry):
            name = f"{spec.op}/{spec.variant} {config} {problem}"
            if name in out:
                continue
            binary = spec.compile(config, problem, "sm_90a")
            if spec.backend == "nvrtc":
                with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                    f.write(binary.data)
                    f.flush()
                    out[name] = _digest(sass_instructions(f.name, cuobjdump))
                continue
            # The DSL names its dump after the kernel, so each compile's files are read and removed at once.
            new = sorted(glob.glob(os.path.join(dump, "**", "*.cubin"), recursive=True))
            if not new:
                continue  # a compile key an earlier pair already built
            out[name] = _digest([i for path in new for i in sass_instructions(path, cuobjdump)])
            for path in new:
                os.unlink(path)
            print(f"{name}: {out[name]}", file=sys.stderr, flush=True)
    shutil.rmtree(dump, ignore_errors=True)
    return out


def compare(before_path: str, after_path: str) -> int:
    before, after = (json.load(open(p)) for p in (before_path, after_path))
    differ = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    only = sorted(before.keys() ^ after.keys())
    for k in differ:
        print(f"DIFFERS  {k}")
    for k in only:
        print(f"ONLY IN {'before' if k in before else 'after'}  {k}")
    print(f"{len(before.keys() & after.keys()) - len(differ)} identical, {len(differ)} differ, {len(only)} unmatched")
    return 1 if differ or only else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-entry", type=int, default=3, help="candidates per entry beyond the defaults")
    parser.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--op", help="only this op's entries (default: every entry)")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    json.dump(fingerprints(args.per_entry, args.cuobjdump, args.op), sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
