"""GPU probe for HGEMM's sm80_mma variant: compile configs in parallel, check numerics, time fp16 and bf16
against cuBLAS.

Each config gets one worker process (``cute.compile`` is not thread-safe, and compiled executors cannot be
sent between processes). Workers compile every variant they will run concurrently, then take turns on the
GPU under one lock: each checks its config in fp16 and bf16 against a float64 reference with the shared
oracle (``ops.gemm.reference.gemm_verdict``: shapes that break the tiles, alpha/beta, misaligned views), then
times it through the public ``ck.hgemm`` against ``torch.matmul`` at 4096^3 and 8192^3 with
``tools.bench.interleaved_times`` (gemm_probe_common.timed_pair: warm-up first, the two interleaved rep by
rep, median reported). A compact table goes to stdout and, when ``$OUT`` is set, a CSV to
``$OUT/hgemm_probe.csv``.

    PYTHONPATH=. python scripts/probes/hgemm_gpu_probe.py [--quick] [--jobs 8] [--reps 15] [--only NAME ...]
    PYTHONPATH=. python scripts/probes/hgemm_gpu_probe.py --compile-only   # no GPU needed
"""

from __future__ import annotations

import functools
import math
import sys

from gemm_probe_common import compile_variants, probe_row, problem_dims, run_probe, timed_pair

# (name, HgemmConfig kwargs[, sizes to time]). Registers per thread from ptxas (sm_90a, fp16, aligned, beta 0).
_W4 = {"warps_m": 2, "warps_n": 2}
_BIG_M = {"tile_m": 256, "tile_n": 128, "warps_m": 4, "warps_n": 2}
PROBE_CONFIGS = [
    ("128x256_k32_s4", {}),  # default for big problems: 64x64 warp tiles, 240 regs, 1 CTA/SM
    ("128x256_k32_s3", {"num_stages": 3}),
    ("128x256_k32_s5", {"num_stages": 5}),
    ("128x256_k64_s3", {"tile_k": 64, "num_stages": 3}),
    ("128x256_k64_s4", {"tile_k": 64, "num_stages": 4}),
    ("128x256_k32_s4_n4", {"n_atoms": 4}),
    ("128x256_k32_s4_r1", {"raster": 1}),
    ("256x128_k32_s4", _BIG_M),  # 242 regs
    ("256x128_k64_s3", {**_BIG_M, "tile_k": 64, "num_stages": 3}),
    ("256x128_w2x4_k32_s4", {"tile_m": 256, "tile_n": 128}),  # 128x32 warp tiles, 246 regs
    ("128x128_w2x2_k32_s4", {"tile_m": 128, "tile_n": 128, **_W4}),  # 234 regs, 2 CTAs/SM
    ("128x128_w2x2_k64_s3", {"tile_m": 128, "tile_n": 128, **_W4, "tile_k": 64, "num_stages": 3}),
    ("128x128_w2x4_k32_s4", {"tile_m": 128, "tile_n": 128}),  # 8 warps of 64x32
    # The swizzle's worth: the same tiles with A and B stages in plain row-major atoms
    # (HgemmConfig.swizzle=False), against the swizzled ones above in the same run.
    ("128x256_k32_s4_unswizzled", {"swizzle": False}),
    ("128x256_k64_s3_unswizzled", {"tile_k": 64, "num_stages": 3, "swizzle": False}),
    ("256x128_k32_s4_unswizzled", {**_BIG_M, "swizzle": False}),
    # The small-problem rungs of default_config's ladder, where wave quantisation decides.
    ("lad_128x128", {"tile_m": 128, "tile_n": 128, **_W4}, [1024, 2048, 3072]),
    ("lad_64x128", {"tile_m": 64, "tile_n": 128, **_W4}, [512, 1024, 2048]),
    ("lad_64x64", {"tile_m": 64, "tile_n": 64, **_W4, "num_stages": 3}, [256, 512, 1024]),
]

# Split-K and the decode tiles (HgemmConfig.split_k, tile_m 16/32), timed on the everyday shapes that leave
# most SMs idle without them: decode rows against LLM projections, a skinny N, small squares.
_DECODE = ["1x4096x4096", "16x4096x4096", "1x11008x4096", "1x14336x4096", "16x14336x4096"]
_SKINNY = ["4096x16x4096", "1000x1000x1000", "512x512x512"]
_ROW16 = {"tile_m": 16, "tile_n": 128, "tile_k": 64, "warps_m": 1, "warps_n": 4, "num_stages": 4}
_ROW32 = {**_ROW16, "tile_m": 32}
PROBE_CONFIGS += [(f"split_16x128_k{s}", {**_ROW16, "split_k": s}, _DECODE) for s in (1, 2, 4, 8, 16)]
PROBE_CONFIGS += [(f"split_32x128_k{s}", {**_ROW32, "split_k": s}, _DECODE) for s in (4, 8)]
PROBE_CONFIGS += [(f"split_16x128_s6_k{s}", {**_ROW16, "num_stages": 6, "split_k": s}, _DECODE) for s in (4, 8)]
PROBE_CONFIGS += [(f"split_64x64_k{s}", {"tile_m": 64, "tile_n": 64, **_W4, "num_stages": 3, "split_k": s}, _SKINNY)
                  for s in (1, 2, 4, 8)]
PROBE_CONFIGS += [(f"split_128x64_k{s}", {"tile_m": 128, "tile_n": 64, **_W4, "split_k": s}, _SKINNY) for s in (2, 4, 8)]

CHECK_SHAPES = [  # (m, n, k, alpha, beta, misalign): misalign slices every operand one element off
    (1000, 1000, 328, 1.5, -0.5, False),
    (255, 257, 129, 1.0, 0.0, False),
    (17, 3, 5, 2.0, -1.0, False),
    (129, 72, 48, 1.25, 0.5, True),
    (2048, 2048, 2048, 1.5, 0.5, False),
]
DTYPES = ("float16", "bfloat16")
TIME_SIZES = [4096, 8192]


def _operands(m, n, k, misalign, gen, device, dtype):
    import torch

    off = 1 if misalign else 0

    def mat(r, c):
        return torch.randn(r, c + off, generator=gen, device=device).to(dtype)[:, off:]

    return mat(m, k), mat(k, n), mat(m, n)


def _check(config, device):
    """The shared oracle on every check shape, fp16 and bf16; returns (ok, detail)."""
    import torch

    import cute_kernels as ck
    from cute_kernels.ops.gemm.reference import gemm_verdict
    from cute_kernels.runtime.oracle import poisoned_like

    worst = 0.0
    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        for m, n, k, alpha, beta, misalign in CHECK_SHAPES:
            gen = torch.Generator(device=device).manual_seed(m * 131 + n * 7 + k)
            a, b, c = _operands(m, n, k, misalign, gen, device, dtype)
            out = poisoned_like(c)
            ck.hgemm(a, b, c, alpha=alpha, beta=beta, out=out, config=config)
            theirs = torch.addmm(c, a, b, alpha=alpha, beta=beta)
            verdict = gemm_verdict(out, a, b, c, alpha=alpha, beta=beta, baseline=theirs)
            if not verdict:
                return False, f"{dtype_name} {m}x{n}x{k} a={alpha} b={beta} misalign={misalign}: {verdict.detail}"
            worst = max(worst, verdict.error / torch.finfo(dtype).eps)
    return True, f"max scaled err {worst:.2f} eps"


def time_config(config, size, reps, device, dtype_name):
    """(ms ours, ms cuBLAS, TFLOP/s ours, TFLOP/s cuBLAS, verdict) of ``ck.hgemm(a, b, out=out, config=config)``
    against ``torch.matmul`` on randn inputs of ``size`` (an int n: n^3; "MxNxK": that shape) (alpha 1, beta 0), the timed output checked by the oracle."""
    import torch

    import cute_kernels as ck
    from cute_kernels.ops.gemm.reference import gemm_verdict

    dtype = getattr(torch, dtype_name)
    m, n, k = problem_dims(size)
    gen = torch.Generator(device=device).manual_seed(m * 7 + n * 3 + k)
    a = torch.randn(m, k, generator=gen, device=device).to(dtype)
    b = torch.randn(k, n, generator=gen, device=device).to(dtype)
    out, ref_out = torch.empty(m, n, device=device, dtype=dtype), torch.empty(m, n, device=device, dtype=dtype)

    def ours():
        ck.hgemm(a, b, out=out, config=config)

    def cublas():
        torch.matmul(a, b, out=ref_out)

    ms_ours, ms_cublas, tf_ours, tf_cublas = timed_pair(ours, cublas, reps=reps, flops=2.0 * m * n * k, device=device)
    # The timed output itself must pass the oracle (against cuBLAS's own error).
    verdict = gemm_verdict(out, a, b, baseline=ref_out)
    return ms_ours, ms_cublas, tf_ours, tf_cublas, verdict


def _compile_problems(spec):
    """Every compile-time variant the checks and timings hit (alignments as measured on these shapes)."""
    from cute_kernels.ops.gemm import GemmProblem

    def widest(*dims):
        return min(next(v for v in (8, 4, 2, 1) if d % v == 0) for d in dims)

    problems = set()
    for dtype in DTYPES:
        problems.add(GemmProblem(m=1, n=1, k=1, dtype=dtype, beta_zero=True, a_align=8, b_align=8, c_align=8))
        for m, n, k, _, beta, misalign in CHECK_SHAPES:
            a_al, b_al = (1, 1) if misalign else (widest(k), widest(n))
            c_al = 1 if misalign else widest(n)
            problems.add(GemmProblem(m=1, n=1, k=1, dtype=dtype, beta_zero=beta == 0.0, a_align=a_al,
                                     b_align=b_al, c_align=c_al))
    return problems


def variant_worker(variant, check, compile_problems, name, kwargs, sizes, gpu_lock, reps, quick,
                   compile_only=False):
    """One config of an HGEMM variant (``variant``: its registry entry, whose ``config_cls`` takes
    ``kwargs``): compile (in parallel with the other workers), then ``check(config, device)`` and the
    timings under the GPU lock. The sm90 probe runs this too, with its own checks and compile variants."""

    def body(row):
        import torch

        from cute_kernels import registry
        from cute_kernels.runtime.device import arch as device_arch

        spec = registry.get("hgemm", variant)
        config = spec.config_cls(**kwargs)
        row["config"] = config.short()
        device = None if compile_only else torch.device("cuda", 0)
        arch = "sm_90a" if compile_only else device_arch(device.index, arch_specific=True)
        row["compile_s"] = compile_variants(spec, config, compile_problems(spec), arch)
        if compile_only:
            row["check"] = "ok"
            row["detail"] = "compiled for sm_90a only"
            return
        with gpu_lock:
            torch.cuda.set_device(device)
            ok, detail = check(config, device)
            row["check"] = "ok" if ok else "FAIL"
            row["detail"] = detail
            if ok:
                for dtype_name in DTYPES[:1] if quick else DTYPES:
                    tag = "f16" if dtype_name == "float16" else "bf16"
                    for size in sizes[:1] if quick else sizes:
                        # Small problems take microseconds: more repetitions for a stable median.
                        n_reps = reps if math.prod(problem_dims(size)) >= 4096**3 else 4 * reps
                        ms, ms_cb, tf, tf_cb, verdict = time_config(config, size, n_reps, device, dtype_name)
                        row[f"{tag}_tflops_{size}"] = round(tf, 1)
                        row[f"{tag}_cublas_tflops_{size}"] = round(tf_cb, 1)
                        row[f"{tag}_ratio_{size}"] = round(tf / tf_cb, 3)
                        if not verdict:
                            row["check"] = "FAIL"
                            row["detail"] = f"timed {dtype_name} {size}^3 output: {verdict.detail}"

    return probe_row(name, body)


def timing_columns(sizes):
    return [f"{tag}_{c}_{s}" for tag in ("f16", "bf16") for s in sizes for c in ("tflops", "cublas_tflops", "ratio")]


def main() -> int:
    return run_probe(
        op="hgemm", description=__doc__.splitlines()[0], probe_configs=PROBE_CONFIGS, time_sizes=TIME_SIZES,
        worker=functools.partial(variant_worker, "sm80_mma", _check, _compile_problems),
        columns=timing_columns, jobs=16, timeout_s=600, quick_help="first 4 configs, fp16 at the first size only",
    )


if __name__ == "__main__":
    sys.exit(main())
