"""GPU probe for float32 attention: flash2_tf32x3 (3xTF32 on tensor cores) in each of its configs against
fused_fp32 (FFMA) with its default config and torch SDPA's float32 backend (TF32 off), on the float32
standard, zoo and held-out problems of the registry.

Each kernel is first checked against the project's oracle (float64 reference, at most twice the error of
torch's float32 output on the same inputs, as ``KernelSpec.verify`` does); the ones that pass are timed with
``tools.bench.interleaved_times`` (medians; torch interleaved rep by rep; input sets rotated as
``tools.bench.measure`` does). A Markdown table goes to stdout and to ``$OUT/attention_fp32_probe.md``.

    PYTHONPATH=. python scripts/probes/attention_fp32_probe.py [--reps 20] [--only "16 1024"]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from cute_kernels import registry  # noqa: E402
from cute_kernels.ops.attention.spec import (fp32_standard_problems, fp32_zoo_problems,  # noqa: E402
                                             held_out_problems, reference_and_scale)
from cute_kernels.runtime import oracle  # noqa: E402
from cute_kernels.tools import bench  # noqa: E402


def problems():
    return fp32_standard_problems() + fp32_zoo_problems() + [
        p for p in held_out_problems() if p.dtype == torch.float32]


def describe(problem) -> str:
    text = f"B{problem.batch} H{problem.heads} M{problem.m} N{problem.n} d{problem.d}"
    return text + (" causal" if problem.causal else "") + (f" window {problem.window}" if problem.windowed else "")


def probe(reps: int, only: str | None) -> int:
    from cute_kernels.runtime.device import shared_memory_limit

    device = torch.device("cuda", torch.cuda.current_device())
    tf32x3, ffma = registry.get("attention", "flash2_tf32x3"), registry.get("attention", "fused_fp32")
    generator = torch.Generator(device=device).manual_seed(0)
    lines = [f"GPU: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, reps {reps}", "",
             "| problem | kernel | ours (us) | torch (us) | speed-up | TFLOP/s | check |", "| --- | --- | --- | --- | --- | --- | --- |"]
    failures = 0
    for problem in problems():
        if only and only not in describe(problem):
            continue
        problem = dataclasses.replace(problem, shared_limit=shared_memory_limit(device.index))
        kernels = {f"fused_fp32 {ffma.default_config(problem)}": (ffma, ffma.default_config(problem))}
        for config in tf32x3.candidates():
            if tf32x3.why_unsupported(config, problem) is None:
                default = " (default)" if config == tf32x3.default_config(problem) else ""
                kernels[f"tf32x3 {config.block_m}x{config.block_n}{default}"] = (tf32x3, config)
        copies = bench.cold_input_sets(tf32x3.bytes(problem))
        sets = [tf32x3.make_inputs(problem, device, generator) for _ in range(copies)]
        base = tf32x3.baseline(problem, sets[0])
        inputs = sets[0]
        ref, scale = reference_and_scale(inputs["q"], inputs["k"], inputs["v"], inputs.get("scale"), problem.causal,
                                         problem.window, problem.num_sinks)
        verdicts = {}
        for name, (spec, config) in kernels.items():
            out = oracle.poisoned_like(base)
            spec.launch(config, problem, sets[0], out)
            torch.cuda.synchronize(device)
            floor = None if spec.error_floor_eps is None else spec.error_floor_eps * torch.finfo(problem.dtype).eps
            verdicts[name] = oracle.compare(out, ref, base, scale=scale, floor=floor)
        del ref, scale, base
        outs = [torch.empty(sets[0]["q"].shape, dtype=problem.dtype, device=device) for _ in range(copies)]
        rotate = bench.input_rotation(copies)
        fns = {name: rotate(lambda i, s=s, c=c: s.launch(c, problem, sets[i], outs[i]))
               for name, (s, c) in kernels.items() if verdicts[name]}
        fns["torch"] = rotate(lambda i: tf32x3.baseline(problem, sets[i]))
        times = bench.interleaved_times(fns, reps=reps, device=device)
        torch_us = statistics.median(times["torch"])
        flops = tf32x3.flops(problem)
        for name in kernels:
            if not verdicts[name]:
                failures += 1
                lines.append(f"| {describe(problem)} | {name} | - | {torch_us:.1f} | - | - | FAIL: {verdicts[name].detail} |")
                continue
            ours = statistics.median(times[name])
            lines.append(f"| {describe(problem)} | {name} | {ours:.1f} | {torch_us:.1f} | {torch_us / ours:.2f}x | "
                         f"{flops / ours * 1e-6:.1f} | ok ({verdicts[name].detail}) |")
        print(lines[-len(kernels):], flush=True)
        del sets, outs
        torch.cuda.empty_cache()
    bench.report("\n".join(lines), "attention_fp32_probe.md")
    return 1 if failures else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--only", help="problems whose description contains this text")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("no CUDA device")
    return probe(args.reps, args.only)


if __name__ == "__main__":
    sys.exit(main())
