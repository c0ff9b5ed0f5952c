"""The first call in a new process: each op's first call timed in a fresh Python process, with an empty
disk cache (cold: compile or load, then run) and again with the cache that run filled (warm), beside torch's
own first call of the equivalent op in a fresh process. Inputs are made (and the CUDA context created)
before the clock starts; the clock stops after a synchronisation, so a figure is host time plus GPU time of
that one call. The second call of the same process is the steady state the first call is compared with.

    python -m cute_kernels.tools.first_call          # the Markdown table
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

# (op, problem, setup (makes the inputs), our call, torch's equivalent call)
CASES = [
    ("sgemm", "1024^3 fp32", "a = r(1024, 1024); b = r(1024, 1024)", "ck.sgemm(a, b)", "torch.mm(a, b)"),
    ("hgemm", "512^3 fp16", "a = r(512, 512, dtype=h); b = r(512, 512, dtype=h)", "ck.hgemm(a, b)", "torch.mm(a, b)"),
    ("hgemm", "4096^3 fp16", "a = r(4096, 4096, dtype=h); b = r(4096, 4096, dtype=h)", "ck.hgemm(a, b)",
     "torch.mm(a, b)"),
    ("attention", "1x16x1024x128 fp16", "q, k, v = (r(1, 16, 1024, 128, dtype=h) for _ in range(3))",
     "ck.attention(q, k, v)", "F.scaled_dot_product_attention(q, k, v)"),
    ("conv3d", "128^3, 3^3 fp32", "x = r(128, 128, 128); w = r(3, 3, 3)", "ck.conv3d(x, w)",
     "F.conv3d(x[None, None], w[None, None])"),
    ("scan", "1M fp32", "x = r(1 << 20)", "ck.scan(x)", "torch.cumsum(x, 0)"),
    # torch has no linear recurrence: its side is the registry's baseline, the chunked doubling in torch ops.
    ("linear_scan", "64x16384 fp32",
     "spec = ck.registry.get('linear_scan'); p = spec.standard_problems()[0]; inputs = spec.make_inputs(p, 'cuda'); "
     "a, x = inputs['a'], inputs['x']", "ck.linear_scan(a, x)", "spec.baseline(p, inputs)"),
]

# What every child process runs before its timed part: the imports, an input maker, the case's setup, and
# a synchronisation, so that the CUDA context and the inputs exist before any clock starts.
_PRELUDE = """\
import json, time
import torch
import torch.nn.functional as F
import cute_kernels as ck
h = torch.float16
def r(*shape, dtype=torch.float32):
    return torch.randn(shape, device="cuda", dtype=dtype)
{setup}
torch.cuda.synchronize()
"""

_TIMED = """\
times = []
for _ in range(2):
    t0 = time.perf_counter()
    {call}
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
print(json.dumps(times))
"""


def child_code(setup: str, body: str) -> str:
    """The source a fresh process runs for one case: the prelude with ``setup``, then ``body`` (which may
    be the timed loop, or a profiler around the call as in scripts/probes/first_call_profile.py)."""
    return _PRELUDE.format(setup=setup) + textwrap.dedent(body)


def _run_child(setup: str, call: str, cache_dir: str, *, warm_up: bool = True) -> tuple[float, float]:
    """(first, second) call seconds of ``call`` in a fresh process whose disk cache is ``cache_dir``.
    ``warm_up=False`` for torch's side: its process imports cute_kernels too (the prelude), and our imports'
    background thread (``runtime.warm_up``) must not run beside torch's first call."""
    # The CuTe DSL keeps a file cache of its own (by default under the temporary directory, shared by every
    # run): beside ours, so that a cold cache is cold for it too.
    env = dict(os.environ, CUTE_KERNELS_CACHE_DIR=cache_dir, CUTE_DSL_CACHE_DIR=os.path.join(cache_dir, "cute-dsl"))
    env.pop("CUTE_KERNELS_DISK_CACHE", None)
    env.pop("CUTE_DSL_DISABLE_FILE_CACHING", None)
    if not warm_up:
        env["CUTE_KERNELS_WARM_UP"] = "0"
    code = child_code(setup, _TIMED.format(call=call))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"first-call child for {call!r} failed:\n{done.stderr[-2000:]}")
    first, second = json.loads(done.stdout.strip().splitlines()[-1])
    return first, second


def measure(remember=None) -> list[dict]:
    """One row per case: cold and warm first calls of ours, torch's first call, and each one's second call.
    ``remember(key, measure)``: a row an earlier run measured, else ``measure()``'s (the report's checkpoint)."""
    rows = []
    for op, problem, setup, ours, theirs in CASES:
        def one(op=op, problem=problem, setup=setup, ours=ours, theirs=theirs) -> dict:
            with tempfile.TemporaryDirectory(prefix="cute_kernels-first-call-") as cache_dir:
                cold, steady = _run_child(setup, ours, cache_dir)
                warm, _ = _run_child(setup, ours, cache_dir)
                torch_first, torch_steady = _run_child(setup, theirs, cache_dir, warm_up=False)
            return dict(op=op, problem=problem, cold_s=cold, warm_s=warm, steady_s=steady,
                        torch_first_s=torch_first, torch_steady_s=torch_steady)

        rows.append(one() if remember is None else remember(f"{op} {problem}", one))
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| op | problem | ours, first call, cold cache (ms) | ours, first call, warm cache (ms) "
             "| ours, second call (ms) | warm first call beyond the second (ms) | torch, first call (ms) "
             "| torch, second call (ms) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['problem']} | {1e3 * r['cold_s']:.1f} | {1e3 * r['warm_s']:.1f} "
                     f"| {1e3 * r['steady_s']:.2f} | {1e3 * (r['warm_s'] - r['steady_s']):.1f} "
                     f"| {1e3 * r['torch_first_s']:.1f} | {1e3 * r['torch_steady_s']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(measure()))
