"""GPU probe for linear_scan's rows schedule (ScanConfig.lookback="rows": a CTA per row scans its tiles in
order, no look-back) against the look-back tiles, on batches of rows: where does one schedule win?

For each problem: the op's choice, every rows-schedule candidate the problem supports, and the look-back
kernel at the op's choice's neighbours (256 x 16 and 128 x 8 in registers); beside them the copy-bandwidth
yardstick of issue 25, ``torch.add(a, x, out=h)`` (reads a and x, writes h: the bytes the scan moves).
Every config is first run into a poisoned output and judged by the registry's oracle (``tools.bench.check``);
a config that fails is reported and not timed. The rest, torch.add and the registry's torch baseline are
timed in ONE ``bench.interleaved_times`` loop, inputs rotating as in ``bench.measure`` (medians).

    PYTHONPATH=. python scripts/probes/linear_scan_rows_probe.py [--reps 50]     # on a GPU
    PYTHONPATH=. python scripts/probes/linear_scan_rows_probe.py --dry-run       # no GPU: compile for sm_90a
    PYTHONPATH=. python scripts/probes/linear_scan_rows_probe.py --problem 64x16384 --problem 256x2048:bfloat16:reverse:h0
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from cute_kernels import registry  # noqa: E402
from cute_kernels.ops.scan import ScanConfig  # noqa: E402
from cute_kernels.ops.scan.linear import LinearScanProblem  # noqa: E402
from cute_kernels.runtime.device import SM90_SHARED_BYTES, shared_memory_limit  # noqa: E402
from cute_kernels.tools import bench  # noqa: E402

# Batches from few long rows to many short ones: where the rows schedule's CTAs (one per row) fill the
# GPU and where they leave it idle, and the zoo's and the report's batched problems.
PROBLEMS = ("16x1048576", "32x16384", "32x65536", "64x16384", "128x16384", "64x65536", "256x4096", "1024x1024",
            "4096x512", "512x8192", "4096x4096", "64x4096:bfloat16:reverse:h0", "256x2048:bfloat16:reverse:h0")
LOOKBACK_NEIGHBOURS = ((256, 16), (128, 8))


def parse_problem(text: str, shared_limit: int) -> LinearScanProblem:
    shape, *flags = text.split(":")
    rows, length = (int(v) for v in shape.split("x"))
    dtype = next((getattr(torch, f) for f in flags if hasattr(torch, f)), torch.float32)
    return LinearScanProblem(rows, length, dtype, reverse="reverse" in flags, h0="h0" in flags,
                             shared_limit=shared_limit)


def configs_for(spec, problem: LinearScanProblem, current: ScanConfig) -> list[ScanConfig]:
    out = [current]
    shapes = [(c.threads, c.items_per_thread) for c in spec.candidates() if c.lookback == "rows"]
    for config in ([ScanConfig(t, i, False, "rows") for t, i in shapes]
                   + [ScanConfig(t, i, False, "inline") for t, i in LOOKBACK_NEIGHBOURS]):
        if config not in out and spec.supports(config, problem):
            out.append(config)
    return out


def label(config: ScanConfig, current: ScanConfig) -> str:
    text = f"{config.threads}x{config.items_per_thread} {'smem' if config.staged else 'regs'} {config.lookback}"
    if config.ramp_ns:
        text += f" ramp {config.ramp_ns / 1000:g} us"
    return text + " (op's choice)" if config == current else text


def dry_run(spec, problems) -> int:
    t0 = time.perf_counter()
    count = 0
    for problem in problems:
        for config in configs_for(spec, problem, spec.default_config(problem)):
            spec.compile(config, problem, "sm_90a")
            count += 1
    print(f"compiled {count} (problem, config) pairs for sm_90a in {time.perf_counter() - t0:.1f} s")
    return 0


def probe(spec, reps: int, problems) -> int:
    device = torch.device("cuda", torch.cuda.current_device())
    generator = torch.Generator(device=device).manual_seed(2026)
    failures = 0
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, reps={reps}")
    for problem in problems:
        t0 = time.perf_counter()
        current = spec.choose_config(problem, device.index)
        configs = configs_for(spec, problem, current)
        add = {"torch.add(a, x)": lambda inputs, out: torch.add(inputs["a"], inputs["x"], out=out)}
        verdicts, times = bench.race_configs(spec, problem, configs, reps=reps, device=device, generator=generator,
                                             others=add)
        add_us, base_us = times["torch.add(a, x)"], times["baseline"]
        print(f"\n### {problem.rows} x {problem.length} {str(problem.dtype)[6:]}"
              f"{' reverse' if problem.reverse else ''}{' h0' if problem.h0 else ''}"
              f" ({time.perf_counter() - t0:.1f} s): torch.add {add_us:.2f} us, torch baseline {base_us:.1f} us\n")
        print("| config | ours (us) | of add's bandwidth | vs torch baseline | verified |\n| --- | --- | --- | --- | --- |")
        for config in configs:
            name = label(config, current)
            if not verdicts[config]:
                failures += 1
                print(f"| {name} | - | - | - | FAILED: {verdicts[config].detail} |")
                continue
            us = times[config]
            print(f"| {name} | {us:.2f} | {100 * add_us / us:.0f}% | {base_us / us:.1f}x | yes |")
        torch.cuda.empty_cache()
    return 1 if failures else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="compile every config for sm_90a; needs no GPU")
    parser.add_argument("--reps", type=int, default=50, help="timed calls per config (medians)")
    parser.add_argument("--problem", action="append", default=[],
                        help="ROWSxLENGTH[:dtype][:reverse][:h0] (repeatable; default: a spread of batches)")
    args = parser.parse_args(argv)
    shared_limit = shared_memory_limit(torch.cuda.current_device()) if not args.dry_run else SM90_SHARED_BYTES
    problems = [parse_problem(p, shared_limit) for p in (args.problem or PROBLEMS)]
    spec = registry.get("linear_scan", "lookback")
    t0 = time.perf_counter()
    rc = dry_run(spec, problems) if args.dry_run else probe(spec, args.reps, problems)
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
