"""Each op's host path on tiny problems: what a repeated call costs the host, and where that time goes.

For each tiny call of the report's dispatch table (``tools.report.tiny_calls``: 64^3 GEMMs, a 1x1x64x64
attention, a 16^3 volume with a 3^3 kernel, 1024 scan elements), through the public ops on one GPU:

- eager wall time per call, launches included (``tools.bench.wall_us_per_call``, three tries), with
  torch's equivalent beside it;
- the host path alone: the same call under ``runtime.dry_run.dry_run()`` (the switch ``ck.precompile``
  sets), where the op runs its checks, problem, config choice and compile-cache lookups and every launch
  path returns just before the driver (or TVM-FFI) call: the Python part of the dispatch (best of five);
- with ``--profile``: cProfile of the repeated eager calls, by own time and cumulative;
- with ``--decode``: also the decode steps through a transposed fp16 weight, ``x @ w.t()`` with 8, 24 and 64
  rows against 4096 x 4096 and 2048 x 4096 weights (8 rows on the GEMV variant; 24 and 64 on the Hopper
  kernel, which reads x and w.t() as they lie).

Host figures on the lent machines vary by 2x between runs; compare within one run.

    PYTHONPATH=. python3 scripts/probes/host_path.py [--profile] [--decode] [--calls 2000] > host_path.txt
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402


def host_path_us(fn, calls: int, tries: int = 5) -> float:
    """Microseconds per call of ``fn`` with launches switched off: best of ``tries`` runs of ``calls``."""
    from cute_kernels.runtime.dry_run import dry_run

    best = float("inf")
    with dry_run():
        fn()  # validates, compiles and loads (the eager warm-up already did)
        for _ in range(tries):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def profile(fn, calls: int) -> str:
    """cProfile of ``calls`` eager calls: the top functions by own time, then by cumulative time."""
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    text = []
    for order, limit, keep in (("tottime", 22, 6000), ("cumulative", 30, 7000)):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(order).print_stats(limit)
        text.append(s.getvalue()[-keep:])
    return "\n".join(text)


def decode_calls():
    """(op, problem, ours eager, torch's): ``x @ w.t()`` in fp16 for decode-sized rows, on fresh inputs."""
    import cute_kernels as ck

    calls = []
    for rows, n, k in ((8, 4096, 4096), (24, 4096, 4096), (64, 2048, 4096)):
        x = torch.randn(rows, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16)
        calls.append(("hgemm", f"x @ w.t() {rows}x{n}x{k}", lambda x=x, w=w: ck.hgemm(x, w.t()),
                      lambda x=x, w=w: x @ w.t()))
    return calls


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed or profiled run")
    parser.add_argument("--profile", action="store_true", help="also print cProfile of the eager calls")
    parser.add_argument("--decode", action="store_true", help="also decode steps through a transposed weight")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (the ops check that their tensors are on one)")
    from cute_kernels.tools.bench import wall_us_per_call

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| op | problem | eager wall/call (us, 3 tries) | host path alone (us) | torch eager (us, 3 tries) |")
    print("| --- | --- | --- | --- | --- |")
    from cute_kernels.tools.report import tiny_calls

    runs = [(op, problem, eager, torch_fn) for op, problem, eager, _, torch_fn in tiny_calls()]
    if args.decode:
        runs += decode_calls()
    for op, problem, eager, torch_fn in runs:
        for _ in range(20):
            eager()
        torch.cuda.synchronize()
        walls = " / ".join(f"{wall_us_per_call(eager):.1f}" for _ in range(3))
        theirs = " / ".join(f"{wall_us_per_call(torch_fn):.1f}" for _ in range(3))
        print(f"| {op} | {problem} | {walls} | {host_path_us(eager, args.calls):.1f} | {theirs} |", flush=True)
    if args.profile:
        for op, problem, eager, _ in runs:
            print(f"\n## {op} {problem}: cProfile of {args.calls} eager calls\n")
            print(profile(eager, args.calls), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
