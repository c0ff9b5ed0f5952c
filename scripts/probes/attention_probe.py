"""GPU probe for flash2_mma's key loops (FlashConfig.mainloop): the classic loop against the lean ones.

For fp16 B=4 H=16 S=4096 at d=128 (non-causal and causal) and d=64, every config below that supports()
accepts is checked once against the project's oracle (float64 reference, at most twice the error of torch's
FLASH_ATTENTION output on the same inputs, as ``KernelSpec.verify`` does), then all of a problem's configs
and torch SDPA restricted to the FLASH_ATTENTION backend are timed together with
``tools.bench.interleaved_times`` (medians; the baseline interleaved with every config, rep by rep; input
sets rotated as ``tools.bench.measure`` does). A Markdown table goes to stdout (and to ``$OUT/attention_probe.md``
when ``$OUT`` is set). A config that fails the check is reported and not timed.

The kernels are compiled first, in parallel worker processes that fill the NVRTC disk cache, so the GPU
process only loads cubins.

    PYTHONPATH=. python scripts/probes/attention_probe.py [--reps 30] [--jobs 16]
    PYTHONPATH=. python scripts/probes/attention_probe.py --dry-run   # no GPU: compile every config for sm_90a
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import math
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from cute_kernels import registry  # noqa: E402
from cute_kernels.ops.attention import AttentionProblem, FlashConfig  # noqa: E402
from cute_kernels.ops.attention.flash2_mma import flash_name_expression  # noqa: E402
from cute_kernels.ops.attention.spec import reference_and_scale  # noqa: E402
from cute_kernels.runtime import oracle  # noqa: E402
from cute_kernels.tools import bench  # noqa: E402

VARIANT = ("attention", "flash2_mma")
FC = FlashConfig
PROBLEMS = {
    "d128": AttentionProblem(4, 16, 4096, 4096, 128, torch.float16),
    "d128 causal": AttentionProblem(4, 16, 4096, 4096, 128, torch.float16, causal=True),
    "d64": AttentionProblem(4, 16, 4096, 4096, 64, torch.float16),
}
# Per problem: the classic default first (the reference row), then the lean loops on the same tile where
# supports() allows it, and cheap neighbours (block_n, warps). Configs supports() refuses are listed as such.
CONFIGS = {
    "d128": [FC(128, 64, 4), FC(128, 64, 4, "lean"), FC(128, 64, 4, "lean_eager"), FC(128, 32, 4, "lean"),
             FC(128, 32, 4, "lean_eager"), FC(128, 64, 8, "lean"), FC(128, 64, 8)],
    "d128 causal": [FC(128, 64, 4), FC(128, 64, 4, "lean"), FC(128, 32, 4, "lean_eager")],
    "d64": [FC(128, 128, 4), FC(128, 128, 4, "lean"), FC(128, 64, 4, "lean"), FC(128, 64, 4, "lean_eager"),
            FC(128, 64, 4)],
}


def label(config: FlashConfig) -> str:
    return f"{config.mainloop} {config.block_m}x{config.block_n} w{config.warps}"


def plan(arch_shared_limit: int | None = None):
    """[(problem name, problem, [supported configs], [(config, reason) refused])]."""
    spec = registry.get(*VARIANT)
    out = []
    for name, problem in PROBLEMS.items():
        if arch_shared_limit is not None:
            problem = dataclasses.replace(problem, shared_limit=arch_shared_limit)
        ok, refused = [], []
        for config in CONFIGS[name]:
            reason = spec.why_unsupported(config, problem)
            (ok.append(config) if reason is None else refused.append((config, reason)))
        out.append((name, problem, ok, refused))
    return out


def _compile_one(job) -> tuple[str, float]:
    """Worker: compile one (config, problem) for ``arch`` into the NVRTC disk cache; returns (name, seconds)."""
    config, problem, arch = job
    start = time.perf_counter()
    registry.get(*VARIANT).compile(config, problem, arch)
    return flash_name_expression(config, problem), time.perf_counter() - start


def compile_all(jobs: list, workers: int) -> None:
    """Compile every distinct kernel in worker processes (spawned: no CUDA state is inherited)."""
    unique = {flash_name_expression(c, p) + arch: (c, p, arch) for c, p, arch in jobs}
    start = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, min(workers, len(unique))), mp_context=ctx) as pool:
        for name, seconds in pool.map(_compile_one, unique.values()):
            print(f"compiled {name} ({seconds:.1f} s)", flush=True)
    print(f"{len(unique)} kernels compiled in {time.perf_counter() - start:.1f} s", flush=True)


def dry_run(workers: int) -> int:
    """No GPU: compile every config the probe would time, for sm_90a, and list what it would run."""
    planned = plan()
    compile_all([(c, p, "sm_90a") for _, p, configs, _ in planned for c in configs], workers)
    for name, _, configs, refused in planned:
        print(f"{name}: would time {', '.join(label(c) for c in configs)}")
        for config, reason in refused:
            print(f"{name}: skips {label(config)}: {reason}")
    return 0


def probe(reps: int, workers: int) -> int:
    from cute_kernels.runtime.device import arch as device_arch
    from cute_kernels.runtime.device import shared_memory_limit
    from cute_kernels.runtime import nvrtc

    device = torch.device("cuda", torch.cuda.current_device())
    arch = device_arch(device.index)
    planned = plan(shared_memory_limit(device.index))
    if nvrtc.cache_dir() is not None:  # with the disk cache off, the workers' cubins would be lost
        compile_all([(c, p, arch) for _, p, configs, _ in planned for c in configs], workers)
    spec = registry.get(*VARIANT)
    generator = torch.Generator(device=device).manual_seed(0)
    lines = [f"GPU: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, reps {reps}", "",
             "| problem | config | ours (us) | torch FLASH (us) | speed-up | vs classic default | check |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    failures = 0
    for name, problem, configs, refused in planned:
        copies = bench.cold_input_sets(spec.bytes(problem))
        sets = [spec.make_inputs(problem, device, generator) for _ in range(copies)]
        base_out = spec.baseline(problem, sets[0])
        # spec.reference and spec.error_scale, computed once (both come from this one float64 pass)
        inputs = sets[0]
        ref, scale = reference_and_scale(inputs["q"], inputs["k"], inputs["v"], inputs.get("scale"), problem.causal)
        floor = None if spec.error_floor_eps is None else spec.error_floor_eps * torch.finfo(problem.dtype).eps
        verdicts = {}
        for config in configs:
            out = oracle.poisoned_like(base_out)
            spec.launch(config, problem, sets[0], out)
            torch.cuda.synchronize(device)
            verdicts[config] = oracle.compare(out, ref, base_out, scale=scale, floor=floor)
            del out
        del ref, scale, base_out
        passed = [c for c in configs if verdicts[c]]
        outs = [torch.empty(sets[0]["q"].shape, dtype=problem.dtype, device=device) for _ in range(copies)]
        rotate = bench.input_rotation(copies)  # every call takes the next input set, whichever function makes it
        fns = {label(c): rotate(lambda i, c=c: spec.launch(c, problem, sets[i], outs[i])) for c in passed}
        fns["torch"] = rotate(lambda i: spec.baseline(problem, sets[i]))
        times = bench.interleaved_times(fns, reps=reps, device=device)
        torch_us = statistics.median(times["torch"])
        classic_us = statistics.median(times[label(configs[0])]) if configs and configs[0] in passed else math.nan
        for config in configs:
            verdict = verdicts[config]
            if not verdict:
                failures += 1
                lines.append(f"| {name} | {label(config)} | - | {torch_us:.1f} | - | - | FAIL: {verdict.detail} |")
                continue
            ours = statistics.median(times[label(config)])
            lines.append(f"| {name} | {label(config)} | {ours:.1f} | {torch_us:.1f} | {torch_us / ours:.3f}x | "
                         f"{classic_us / ours:.3f}x | ok |")
        for config, reason in refused:
            lines.append(f"| {name} | {label(config)} | - | - | - | - | refused: {reason} |")
        del sets, outs
        torch.cuda.empty_cache()
    bench.report("\n".join(lines), "attention_probe.md")
    return 1 if failures else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="compile every config for sm_90a; no GPU needed")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    args = parser.parse_args(argv)
    if args.dry_run:
        return dry_run(args.jobs)
    if not torch.cuda.is_available():
        parser.error("no CUDA device: use --dry-run to compile only")
    return probe(args.reps, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
