"""GPU probe for the scan's look-back schedule (ScanConfig.lookback) and first-wave ramp (ramp_ns): the
op's current choice, it under the other ramps, the same tile under the other schedules, and neighbouring tile
shapes under every schedule, at float32 2^28, 2^24 and 250,000 elements.

Every config is first run into a poisoned output and judged by the registry's oracle (float64 reference,
at most twice torch's float32 error; ``tools.bench.check``); a config that fails is reported and not timed. The
rest of a problem's configs and torch.cumsum are timed in ONE ``bench.interleaved_times`` loop (the
functions alternate call by call, so clock drift hits all alike; medians). Inputs rotate as in
``bench.measure`` (``bench.input_rotation``): enough sets that 256 MB separates two uses of one set (at most
64), the rotation advancing with every call, whichever function makes it, so no call finds the input the
previous call read still in L2. Prints one Markdown table per problem.

    PYTHONPATH=. python scripts/probes/scan_probe.py [--reps 50]   # on a GPU, well under 90 s on an H200
    PYTHONPATH=. python scripts/probes/scan_probe.py --dry-run     # no GPU: NVRTC-compile every config for sm_90a
    PYTHONPATH=. python scripts/probes/scan_probe.py --size 65536:float64 --size 1024   # other flat scans

With ``--size`` the problems are those flat scans instead (any dtype); sizes and dtypes other than the three
float32 ones take the short-input neighbours (``SHORT_NEIGHBOURS``).

The dry run also prints each kernel's registers (from the cubin) and the CTAs per SM that registers,
shared memory and threads allow on an H200, the figure the schedule trades against (the dedicated warp
adds 32 threads per CTA).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from cute_kernels import registry, tuned  # noqa: E402
from cute_kernels.ops.scan import ScanConfig, ScanProblem  # noqa: E402
from cute_kernels.ops.scan.config import LOOKBACKS, RAMPS_NS  # noqa: E402
from cute_kernels.ops.scan.lookback import name_expression  # noqa: E402
from cute_kernels.runtime.device import shared_memory_limit  # noqa: E402
from cute_kernels.tools import bench  # noqa: E402
from cute_kernels.runtime import nvrtc  # noqa: E402

SIZES = (1 << 28, 1 << 24, 250_000)
# Neighbouring tile shapes (threads, items_per_thread, staged) timed beside the op's own choice, each under
# every schedule and without a ramp. 2^28: around the tuned 384x48 staged tile (72 KB, 3 CTAs/SM): 512x32
# (64 KB, 3), 512x24 (48 KB, 4), 256x48 and 256x32. 2^24 and 250k: register and staged tiles around the
# tuned ones (at 2^24 a wider ring: the tuned 512x32 registers makes 1024 tiles on 264 CTA slots, so tile
# size and CTAs per SM move the waves and the last one's tail).
NEIGHBOURS = {
    1 << 28: [(512, 32, True), (384, 48, True), (512, 24, True), (256, 48, True), (256, 32, True)],
    1 << 24: [(512, 32, True), (384, 32, True), (256, 32, False), (512, 48, True), (128, 32, False),
              (512, 32, False), (256, 24, False), (384, 24, False), (512, 24, False), (256, 16, False),
              (384, 16, False), (512, 16, False), (384, 16, True), (512, 16, True), (384, 24, True),
              (256, 32, True), (256, 48, True)],
    250_000: [(128, 32, False), (256, 16, False), (256, 16, True)],
}
# Short inputs (a few tiles: the look-back chain is the whole run) and any size not above: smaller tiles
# make more CTAs and a longer chain, larger ones fewer CTAs with more work each.
SHORT_NEIGHBOURS = [(128, 8, False), (128, 16, False), (256, 8, False), (256, 16, False), (512, 8, False),
                    (512, 16, False), (128, 32, False), (512, 32, False), (256, 16, True)]
H200 = {"smem_per_sm": 228 * 1024, "smem_per_cta_reserved": 1024, "regs_per_sm": 65536, "threads_per_sm": 2048,
        "ctas_per_sm": 32}


def configs_for(spec, problem: ScanProblem, current: ScanConfig) -> list[ScanConfig]:
    """The op's current config first, then it under the other ramps, then its shape under the other
    schedules, then the neighbours (without a ramp)."""
    neighbours = NEIGHBOURS.get(problem.length) if problem.dtype == torch.float32 else None
    shapes = [(current.threads, current.items_per_thread, current.staged)] + (neighbours or SHORT_NEIGHBOURS)
    out = [current] + [dataclasses.replace(current, ramp_ns=r) for r in RAMPS_NS if r != current.ramp_ns]
    for shape in shapes:
        for lookback in LOOKBACKS:
            config = ScanConfig(*shape, lookback)
            if config not in out and spec.supports(config, problem):
                out.append(config)
    return out


def label(config: ScanConfig, current: ScanConfig) -> str:
    where = "smem" if config.staged else "regs"
    text = f"{config.threads}x{config.items_per_thread} {where} {config.lookback}"
    if config.ramp_ns:
        text += f" ramp {config.ramp_ns / 1000:g} us"
    return text + " (op's choice)" if config == current else text


def ctas_per_sm(config: ScanConfig, dtype: torch.dtype, regs: int) -> int:
    """H200 occupancy: registers are allocated per warp in units of 256, shared memory per CTA plus 1 KB."""
    warps = config.block_threads // 32
    regs_per_warp = -(-regs * 32 // 256) * 256
    by_regs = H200["regs_per_sm"] // (regs_per_warp * warps)
    by_smem = H200["smem_per_sm"] // (config.shared_bytes(dtype) + H200["smem_per_cta_reserved"])
    by_threads = H200["threads_per_sm"] // config.block_threads
    return min(by_regs, by_smem, by_threads, H200["ctas_per_sm"])


def dry_run(spec, sizes) -> int:
    """Compile every config the GPU run would time (NVRTC, sm_90a), with the op's choice for the H200 from
    the tuned table (else the heuristic), and report registers and CTAs per SM."""
    count = 0
    t0 = time.perf_counter()
    for n, dtype in sizes:
        problem = ScanProblem(1, n, dtype)
        current = tuned.lookup(spec, problem, "sm_90") or spec.default_config(problem)
        print(f"\n### {str(dtype)[6:]} n={n}\n\n| config | kernel | registers | CTAs/SM (H200) |\n| --- | --- | --- | --- |")
        for config in configs_for(spec, problem, current):
            if config != current and config == dataclasses.replace(current, ramp_ns=config.ramp_ns):
                continue  # the op's choice under another ramp: the same kernel
            spec.compile(config, problem, "sm_90a")  # the op's own compile path (supports() first)
            expression = name_expression(config, problem)
            regs = nvrtc.resource_usage(spec.sources[0], [expression], "sm_90a")[expression].registers
            print(f"| {label(config, current)} | `{expression}` | {regs} | {ctas_per_sm(config, problem.dtype, regs)} |")
            count += 1
    print(f"\ncompiled {count} configs for sm_90a in {time.perf_counter() - t0:.1f} s")
    return 0


def probe(spec, reps: int, sizes) -> int:
    device = torch.device("cuda", torch.cuda.current_device())
    generator = torch.Generator(device=device).manual_seed(2026)
    failures = 0
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, reps={reps}")
    for n, dtype in sizes:
        t0 = time.perf_counter()
        problem = ScanProblem(1, n, dtype, shared_limit=shared_memory_limit(device.index))
        current = spec.choose_config(problem, device.index)
        configs = configs_for(spec, problem, current)
        verdicts, times = bench.race_configs(spec, problem, configs, reps=reps, device=device, generator=generator)
        torch_us = times["baseline"]
        print(f"\n### {str(dtype)[6:]} n={n} ({time.perf_counter() - t0:.1f} s)\n")
        print("| config | ours (us) | torch (us) | speed-up | verified |\n| --- | --- | --- | --- | --- |")
        for config in configs:
            name = label(config, current)
            if not verdicts[config]:
                failures += 1
                print(f"| {name} | - | {torch_us:.1f} | - | FAILED: {verdicts[config].detail} |")
                continue
            us = times[config]
            print(f"| {name} | {us:.1f} | {torch_us:.1f} | {torch_us / us:.3f}x | yes |")
        torch.cuda.empty_cache()
    return 1 if failures else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="compile every config for sm_90a; needs no GPU")
    parser.add_argument("--reps", type=int, default=50, help="timed calls per config (medians)")
    parser.add_argument("--size", action="append", default=[],
                        help="N[:dtype], flat scans to probe instead of float32 2^28, 2^24 and 250k (repeatable)")
    args = parser.parse_args(argv)
    sizes = [(int(n), getattr(torch, d or "float32")) for n, _, d in (s.partition(":") for s in args.size)]
    sizes = sizes or [(n, torch.float32) for n in SIZES]
    spec = registry.get("scan", "lookback")
    t0 = time.perf_counter()
    rc = dry_run(spec, sizes) if args.dry_run else probe(spec, args.reps, sizes)
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
