"""Where a first call's time goes: each case of ``tools.first_call`` in a fresh process with a warm disk cache
(filled by a first run), the first call under cProfile (cumulative and own time).

    PYTHONPATH=. python3 scripts/probes/first_call_profile.py [op ...] > first_call_profile.txt
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cute_kernels.tools.first_call import CASES, child_code  # noqa: E402

_PROFILED = """\
import cProfile, io, pstats
profiler = cProfile.Profile()
t0 = time.perf_counter()
profiler.enable()
{call}
torch.cuda.synchronize()
profiler.disable()
print(f"first call: {{1e3 * (time.perf_counter() - t0):.1f}} ms (under cProfile)")
for order in ("cumulative", "tottime"):
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(25)
    print(out.getvalue())
"""


def main(argv: list[str]) -> int:
    wanted = set(argv)
    for op, problem, setup, ours, _ in CASES:
        if wanted and op not in wanted:
            continue
        with tempfile.TemporaryDirectory() as cache_dir:
            env = dict(os.environ, CUTE_KERNELS_CACHE_DIR=cache_dir)
            code = child_code(setup, _PROFILED.format(call=ours))
            subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True)  # fills it
            done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
            print(f"## {op} {problem}\n\n{done.stdout}{done.stderr[-3000:]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
