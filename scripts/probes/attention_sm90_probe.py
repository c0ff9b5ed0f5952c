"""GPU probe for the Hopper attention forward (flash3_wgmma): every config of it on the standard problems and
a few everyday shapes, against flash2_mma's default, torch SDPA's FLASH_ATTENTION backend (for a window: the
efficient backend with the window as a boolean mask, the registry's baseline) and its cuDNN backend (none
takes a window), all timed in one interleaved loop (``tools.bench.interleaved_times``: GPU time alone, medians, the
input sets rotated so L2 holds none of a call's inputs). Every config is first checked against the float64
reference with the registry's oracle; one that fails is reported and not timed. Then the eager wall time per
call of the public op (back to back, host dispatch included) against SDPA's default choice.

    PYTHONPATH=. python scripts/probes/attention_sm90_probe.py [--reps 15] [--only d128,causal]
"""

from __future__ import annotations

import argparse
import ast
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import cute_kernels as ck  # noqa: E402
from cute_kernels import registry  # noqa: E402
from cute_kernels.ops.attention import AttentionProblem, Flash3Config  # noqa: E402
from cute_kernels.ops.attention.spec import _cudnn_attention, reference_and_scale  # noqa: E402
from cute_kernels.runtime import oracle  # noqa: E402
from cute_kernels.tools import bench  # noqa: E402

F16, B16 = torch.float16, torch.bfloat16
PROBLEMS = {
    "d128": AttentionProblem(4, 16, 4096, 4096, 128, F16),
    "d64": AttentionProblem(4, 16, 4096, 4096, 64, F16),
    "d128 causal": AttentionProblem(4, 16, 4096, 4096, 128, F16, causal=True),
    "d128 causal lse": AttentionProblem(4, 16, 4096, 4096, 128, F16, causal=True, lse=True),
    "d64 causal": AttentionProblem(4, 16, 4096, 4096, 64, F16, causal=True),
    "bf16 d128": AttentionProblem(4, 16, 4096, 4096, 128, B16),
    "bf16 d128 causal": AttentionProblem(4, 16, 4096, 4096, 128, B16, causal=True),
    "S8192 causal": AttentionProblem(1, 8, 8192, 8192, 128, F16, causal=True),
    "S1024 H16": AttentionProblem(1, 16, 1024, 1024, 128, F16),
    "B16 S256": AttentionProblem(16, 16, 256, 256, 64, F16),
    "B16 S256 d128": AttentionProblem(16, 16, 256, 256, 128, F16),
    "B8 S512 d64 causal": AttentionProblem(8, 16, 512, 512, 64, F16, causal=True),
    "gqa S1024": AttentionProblem(1, 32, 1024, 1024, 128, F16, kv_heads=8),
    "window 1024 S8192": AttentionProblem(1, 8, 8192, 8192, 128, F16, True, window=(1024, 0)),
    "bf16 d64": AttentionProblem(4, 16, 4096, 4096, 64, B16),
    "bf16 d64 causal": AttentionProblem(4, 16, 4096, 4096, 64, B16, causal=True),
    "S2048 d64": AttentionProblem(1, 16, 2048, 2048, 64, F16),
    "d256": AttentionProblem(4, 16, 4096, 4096, 256, F16),
    "d256 causal": AttentionProblem(4, 16, 4096, 4096, 256, F16, causal=True),
    "d96": AttentionProblem(4, 16, 4096, 4096, 96, F16),
}


def label(config) -> str:
    flags = [name for name, on in (("overlap", config.overlap), ("pingpong", config.pingpong),
                                   ("one unit per CTA", not config.persistent), ("dynamic", config.dynamic),
                                   ("tma-store", config.tma_store), ("two Q buffers", config.q_buffers == 2),
                                   ("grouped units", config.grouped_units)) if on]
    flags += [f"1/{config.fma_exp2} exp2 on FMA"] if config.fma_exp2 else []
    return " ".join([f"bn{config.block_n} s{config.stages}"] + (["3 consumers"] if config.consumers == 3 else []) + flags)


def probe(names, reps: int, extra=(), all_candidates: bool = True, check: bool = True) -> int:
    device = torch.device("cuda", torch.cuda.current_device())
    f3 = registry.get("attention", "flash3_wgmma")
    f2 = registry.get("attention", "flash2_mma")
    generator = torch.Generator(device=device).manual_seed(0)
    lines = [f"GPU: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, reps {reps}", "",
             "| problem | kernel | us | TFLOP/s | vs torch FLASH | vs cuDNN | check |", "| --- | --- | --- | --- | --- | --- | --- |"]
    failures = 0
    for name in names:
        problem = PROBLEMS[name]
        configs = [c for c in f3.candidates() if f3.supports(c, problem)] if all_candidates else []
        for config in (f3.default_config(problem), *extra):
            if config not in configs and f3.supports(config, problem):
                configs.append(config)
        copies = bench.cold_input_sets(f3.bytes(problem))
        sets = [f3.make_inputs(problem, device, generator) for _ in range(copies)]
        base_out = f3.baseline(problem, sets[0])
        inputs = sets[0]
        ref, scale = reference_and_scale(inputs["q"], inputs["k"], inputs["v"], None, problem.causal)
        verdicts = {}
        kernels = [("flash3 " + label(c), f3, c) for c in configs] + [("flash2 default", f2, f2.default_config(problem))]
        assert len({k for k, _, _ in kernels}) == len(kernels), "two kernels with one label"
        for kname, spec, config in kernels:
            if not check:  # timing an experiment whose output is knowingly wrong (e.g. an epilogue cut out)
                verdicts[kname] = True
                continue
            out = oracle.poisoned_like(base_out)
            spec.launch(config, problem, sets[0], out)
            torch.cuda.synchronize(device)
            verdicts[kname] = oracle.compare(out, ref, base_out, scale=scale, floor=2 * torch.finfo(problem.dtype).eps)
        del ref, scale
        outs = [torch.empty(sets[0]["q"].shape, dtype=problem.dtype, device=device) for _ in range(copies)]
        rotate = bench.input_rotation(copies)
        fns = {k: rotate(lambda i, s=s, c=c: s.launch(c, problem, sets[i], outs[i])) for k, s, c in kernels if verdicts[k]}
        fns["torch FLASH"] = rotate(lambda i: f3.baseline(problem, sets[i]))
        if not problem.windowed:  # SDPA's cuDNN backend takes no window
            fns["cuDNN"] = rotate(lambda i: _cudnn_attention(problem, sets[i]))
        times = {k: statistics.median(v) for k, v in bench.interleaved_times(fns, reps=reps, device=device).items()}
        flops = f3.flops(problem)
        for kname, _, _ in kernels + [(name, None, None) for name in ("torch FLASH", "cuDNN") if name in times]:
            verdict = verdicts.get(kname, True)
            if not verdict:
                failures += 1
                lines.append(f"| {name} | {kname} | - | - | - | - | FAIL: {verdict.detail} |")
                continue
            us = times[kname]
            cudnn = f"{times['cuDNN'] / us:.3f}x" if "cuDNN" in times else "-"
            lines.append(f"| {name} | {kname} | {us:.1f} | {flops / us / 1e6:.0f} | {times['torch FLASH'] / us:.3f}x | "
                         f"{cudnn} | {'ok' if check else 'unchecked'} |")
        if not problem.windowed:  # the wall per call against SDPA's own choice (none takes a window)
            # Eager wall per call of the public op against SDPA's own choice, back to back on one input set.
            q, k, v = inputs["q"], inputs["k"], inputs["v"]
            gqa = {"enable_gqa": True} if problem.kv_heads else {}
            walls = {}
            for wname, fn in (("ck.attention", lambda: ck.attention(q, k, v, causal=problem.causal)),
                              ("torch SDPA", lambda: torch.nn.functional.scaled_dot_product_attention(
                                  q, k, v, is_causal=problem.causal, **gqa))):
                for _ in range(3):
                    fn()
                torch.cuda.synchronize(device)
                calls = 50
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                torch.cuda.synchronize(device)
                walls[wname] = (time.perf_counter() - start) / calls * 1e6
            lines.append(f"| {name} | wall/call ck.attention {walls['ck.attention']:.1f} us vs SDPA default "
                         f"{walls['torch SDPA']:.1f} us | | | {walls['torch SDPA'] / walls['ck.attention']:.3f}x | | |")
        sets.clear()
        outs.clear()
        del base_out
        torch.cuda.empty_cache()
    bench.report("\n".join(lines), "attention_sm90_probe.md")
    return 1 if failures else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--only", default=",".join(PROBLEMS), help="comma-separated problem names: " + ", ".join(PROBLEMS))
    parser.add_argument("--config", action="append", default=[], metavar="FIELD=VALUE,...",
                        help="a Flash3Config to time beside the candidates (repeatable), e.g. consumers=3,persistent=False")
    parser.add_argument("--no-candidates", action="store_true", help="time the default and --config configs only")
    parser.add_argument("--no-check", action="store_true",
                        help="time without the float64 check (a source edited to bound a part's cost)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("no CUDA device")
    extra = [Flash3Config(**{k: ast.literal_eval(v) for k, v in (item.split("=") for item in spec.split(","))})
             for spec in args.config]
    return probe(args.only.split(","), args.reps, extra, not args.no_candidates, not args.no_check)


if __name__ == "__main__":
    sys.exit(main())
