"""Static SASS figures of GEMM configs, no GPU needed: registers, stack, and the main loop's instruction mix.

For each config it compiles the 8192^3 binary for sm_90a through the registry entry's ``compile`` with
``CUTE_DSL_KEEP=cubin``, reads the resource usage and the SASS with ``cuobjdump``, takes the backward branch
whose body holds the most math instructions (FFMA for the SIMT SGEMM, HMMA for the sm80-style HGEMM: the
k-tile loop) and prints its instruction counts. For SGEMM the FFMA share of that loop tracks the measured
speed (docs/notes/gemm.md): a SIMT GEMM is issue-bound, so every LDS, address or loop instruction in the
loop takes an FFMA's slot.

``cuobjdump`` comes with the CUDA toolkit, or from the pip wheel ``nvidia-cuda-cuobjdump`` (bin/ inside
``nvidia/cu13``); pass its path with ``--cuobjdump`` if it is not on PATH. Its ``-sass`` needs ``nvdisasm``
(pip wheel ``nvidia-cuda-nvdisasm``) on PATH or in ``NVDISASM_PATH``; without it the SASS is empty and every
config reads "no loop found".

    PYTHONPATH=. python scripts/probes/gemm_sass_mix.py '{}' '{"a_smem_major": "k", "num_stages": 4}'
    PYTHONPATH=. python scripts/probes/gemm_sass_mix.py --op hgemm '{}' '{"tile_m": 256, "tile_n": 128}'
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

_COMPILE = """
import json, sys
from cute_kernels import registry
from cute_kernels.ops.gemm import GemmProblem
op, variant, kw = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
spec = registry.get(op, variant)
dtype = "float32" if op == "sgemm" else "float16"
beta_zero = kw.pop("beta_zero", op != "sgemm")
align = kw.pop("align", 4 if op == "sgemm" else 8)
problem = GemmProblem(m=8192, n=8192, k=8192, dtype=dtype, beta_zero=beta_zero, a_align=align, b_align=align,
                      c_align=align)
config = spec.config_cls(**kw)
print(config.short())
spec.compile(config, problem, "sm_90a")
"""
MATH = {"sgemm": "FFMA", "hgemm": "HMMA"}
VARIANTS = {"sgemm": "simt_cpasync", "hgemm": "sm80_mma"}  # the registry entries whose k-tile loop is read


def _opcode(text: str) -> str:
    return re.sub(r"^@!?U?P[T0-9]+\s+", "", text).split()[0]


def analyse(op: str, kwargs: dict, cuobjdump: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, CUTE_DSL_KEEP="cubin", CUTE_DSL_DUMP_DIR=tmp, CUTE_DSL_ARCH="sm_90a")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
        run = subprocess.run([sys.executable, "-W", "ignore", "-c", _COMPILE, op, VARIANTS[op], json.dumps(kwargs)],
                             env=env, capture_output=True, text=True)
        if run.returncode:
            return f"{kwargs}: compile failed\n{run.stderr[-2000:]}"
        name = run.stdout.strip().splitlines()[-1]
        cubin = glob.glob(os.path.join(tmp, "*.cubin"))[0]
        usage = subprocess.run([cuobjdump, "-res-usage", cubin], capture_output=True, text=True).stdout
        sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True).stdout
    res = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    code = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            code.append((int(m.group(1), 16), m.group(2).strip()))
    best = None
    for addr, text in code:
        m = re.search(r"BRA (?:`\(\.L_x_\d+\) )?0x([0-9a-f]+)", text)
        if _opcode(text) == "BRA" and m and int(m.group(1), 16) < addr:
            body = [t for a, t in code if int(m.group(1), 16) <= a <= addr]
            math = sum(_opcode(t).split(".")[0] == MATH[op] for t in body)
            if best is None or math > best[0]:
                best = (math, body)
    local = sum(_opcode(t).startswith(("LDL", "STL")) for _, t in code)
    if best is None:
        return f"{name}: regs={res.group(1)} stack={res.group(2)} (no loop found)"
    math, body = best
    counts = collections.Counter(_opcode(t) for t in body)
    others = " ".join(f"{k}={v}" for k, v in counts.most_common() if k.split(".")[0] != MATH[op] and v >= 2)
    return (f"{name}: regs={res.group(1)} stack={res.group(2)} local_ld/st={local} | loop: {len(body)} instr, "
            f"{math} {MATH[op]} ({100 * math / len(body):.1f}%) | {others}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+", help="config kwargs as JSON (plus beta_zero, align)")
    parser.add_argument("--op", choices=sorted(MATH), default="sgemm",
                        help="sgemm (GemmConfig) or hgemm (the sm80-style HgemmConfig)")
    parser.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    args = parser.parse_args()
    for text in args.configs:
        print(analyse(args.op, json.loads(text), args.cuobjdump), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
