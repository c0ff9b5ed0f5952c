"""GPU probe for the SGEMM family: compile configs in parallel, check numerics, time against cuBLAS.

Each config gets one worker process (``cute.compile`` is not thread-safe, and compiled executors cannot be
sent between processes). Workers compile concurrently, then take turns on the GPU under one lock: each
checks its config on randn data against a float64 reference (shapes that break the tiles, alpha/beta,
misaligned views) and then times it, through the public ``ck.sgemm``, against ``torch.addmm`` (TF32 off) at
4096^3 and 8192^3, or at the sizes its entry names (a square side, or "MxNxK"), with
``tools.bench.interleaved_times`` (gemm_probe_common.timed_pair: warm-up first, the two interleaved rep by
rep, median reported). A compact table goes to stdout and, when ``$OUT`` is set, a CSV to
``$OUT/sgemm_probe.csv``.

    PYTHONPATH=. python scripts/probes/sgemm_gpu_probe.py [--quick] [--jobs 8] [--reps 15] [--compile-only]
    PYTHONPATH=.:$PYTHONPATH python scripts/probes/sgemm_gpu_probe.py --only leet_128x64_s3 leet_128x128_k32_ak_s2
        (on the lent GPU machine: keep the bootstrap's PYTHONPATH, where the DSL's package metadata lives)
"""

from __future__ import annotations

import math
import sys

from gemm_probe_common import compile_variants, probe_row, problem_dims, run_probe, timed_pair

# (name, GemmConfig kwargs[, sizes to time]). Main-loop instruction mix from the sm_90a SASS
# (gemm_sass_mix.py) of each, per k-tile: FFMA share of the loop's instructions and registers per thread
# (CTAs per SM).
LEET = "8192x6144x4096"
_AK4 = {"a_smem_major": "k", "num_stages": 4}
_K16 = {"tile_k": 16, "num_stages": 4}
_BIG_M = {"tile_m": 256, "tile_n": 128}
_BIG_N = {"tile_m": 128, "tile_n": 256}
PROBE_CONFIGS = [
    ("ak_s4", _AK4),  # default for big problems; 88.3% FFMA, 176 regs (1 CTA/SM)
    ("ak_s4_w4", {**_AK4, "warp_rows": 4}),  # 4x8-thread warps: B fragment reads 1 wavefront, not 2
    ("m_s3", {}),  # 86.1%, 138 regs (1 CTA/SM)
    ("m_s3_o2", {"min_ctas_per_sm": 2}),  # 85.5%, 128 regs, 2 LDL per k-tile (2 CTAs/SM)
    ("m_s3_w4", {"warp_rows": 4}),
    ("k16_s4", _K16),  # 89.8%, 138 regs
    ("k16_s4_o2", {**_K16, "min_ctas_per_sm": 2}),  # 89.5%, 128 regs (2 CTAs/SM)
    ("k16_s4_w4", {**_K16, "warp_rows": 4}),
    ("k16_s4_ak", {**_K16, "a_smem_major": "k"}),  # 90.6%, 174 regs
    ("k16_s4_ak_w4", {**_K16, "a_smem_major": "k", "warp_rows": 4}),
    ("256x128", _BIG_M),  # 16x8 per thread: 90.4%, 255 regs (1 CTA/SM)
    ("256x128_w4", {**_BIG_M, "warp_rows": 4}),
    ("256x128_k16_w4", {**_BIG_M, "tile_k": 16, "warp_rows": 4}),  # 92.3%
    ("128x256", _BIG_N),  # 8x16 per thread: 91.5%
    ("128x256_k16_w4", {**_BIG_N, "tile_k": 16, "warp_rows": 4}),
    ("128x64", {"tile_m": 128, "tile_n": 64, "threads_m": 16, "threads_n": 8}),  # 83.8%, 144 regs (3/SM)
    # The small-problem rungs of default_config's ladder, where wave quantisation decides.
    ("lad_128x64", {"tile_m": 128, "tile_n": 64, "threads_m": 16, "threads_n": 8}, [1024, 2048, 3072]),
    ("lad_128x128_ak", _AK4, [1024, 2048, 3072]),
    ("lad_64x64", {"tile_m": 64, "tile_n": 64, "threads_m": 8, "threads_n": 8}, [512, 1024, 2048]),
    ("lad_32x32", {"tile_m": 32, "tile_n": 32, "threads_m": 8, "threads_n": 8}, [256, 512, 1024]),
    # LeetGPU's 8192 x 6144 x 4096, where the ladder's 128x64 s3 (3 CTAs/SM) ran at 0.94x cuBLAS: 128x128
    # tiles make 3072 CTAs, 23.3 waves of 132; 128x64 at 3 per SM make 6144, 15.5 waves of 396.
    *((f"leet_{name}", kwargs, [LEET]) for name, kwargs in (
        ("128x64_s3", {"tile_m": 128, "tile_n": 64, "threads_m": 16, "threads_n": 8}),
        ("128x64_s4", {"tile_m": 128, "tile_n": 64, "threads_m": 16, "threads_n": 8, "num_stages": 4}),
        ("128x64_ak_s4", {"tile_m": 128, "tile_n": 64, "threads_m": 16, "threads_n": 8, **_AK4}),
        ("128x128_ak_s4", _AK4),
        ("128x128_k32_ak_s2", {"tile_k": 32, "num_stages": 2, "a_smem_major": "k"}),  # tuned at 4096^3, 8192^3
        ("128x128_k16_ak_s4", {**_K16, "a_smem_major": "k"}),
        ("256x128_k16_w4", {**_BIG_M, "tile_k": 16, "warp_rows": 4}),
        ("128x256_k16_w4", {**_BIG_N, "tile_k": 16, "warp_rows": 4}),
    )),
]

# Split-K on the everyday shapes whose tiles leave most SMs idle (GemmConfig.split_k): decode-sized M,
# skinny N, and 1024^3, on the small rungs of the default ladder.
_SKINNY = ["16x4096x4096", "128x4096x4096", "4096x16x4096", "4096x128x4096", "1024x1024x1024"]
_T32 = {"tile_m": 32, "tile_n": 32, "tile_k": 8, "num_stages": 3, "threads_m": 8, "threads_n": 8}
_T64 = {"tile_m": 64, "tile_n": 64, "tile_k": 8, "num_stages": 3, "threads_m": 8, "threads_n": 8}
_T128x64 = {"tile_m": 128, "tile_n": 64, "tile_k": 8, "num_stages": 4, "threads_m": 16, "threads_n": 8, "a_smem_major": "k"}
PROBE_CONFIGS += [(f"split_32_k{s}", {**_T32, "split_k": s}, _SKINNY) for s in (1, 2, 4, 8, 16)]
PROBE_CONFIGS += [(f"split_64_k{s}", {**_T64, "split_k": s}, _SKINNY) for s in (1, 2, 4, 8, 16)]
PROBE_CONFIGS += [(f"split_128x64_k{s}", {**_T128x64, "split_k": s}, _SKINNY) for s in (2, 4, 8)]

CHECK_SHAPES = [  # (m, n, k, alpha, beta, misalign): misalign slices every operand one element off
    (1023, 1021, 1019, 1.5, 0.5, False),
    (255, 257, 129, 1.0, 0.0, False),
    (17, 3, 5, 2.0, -1.0, False),
    (129, 67, 45, 1.25, 0.5, True),
    (2048, 2048, 2048, 1.5, 0.5, False),
]
TIME_SIZES = [4096, 8192]


def _operands(m, n, k, misalign, gen, device):
    import torch

    off = 1 if misalign else 0

    def mat(r, c):
        return torch.randn(r, c + off, generator=gen, device=device)[:, off:]

    return mat(m, k), mat(k, n), mat(m, n)


def _check(config, device):
    """The shared oracle (oracle.compare with the per-element gemm_scale) on every check shape."""
    import torch

    import cute_kernels as ck
    from cute_kernels.ops.gemm.reference import gemm_scale
    from cute_kernels.runtime.oracle import compare

    worst = 0.0
    for m, n, k, alpha, beta, misalign in CHECK_SHAPES:
        gen = torch.Generator(device=device).manual_seed(m * 131 + n * 7 + k)
        a, b, c = _operands(m, n, k, misalign, gen, device)
        out = torch.full((m, n), float("nan"), device=device)
        ck.sgemm(a, b, c, alpha=alpha, beta=beta, out=out, config=config)
        ref = alpha * (a.double() @ b.double()) + beta * c.double()
        theirs = torch.addmm(c, a, b, alpha=alpha, beta=beta)
        scale = gemm_scale(a, b, c, alpha=alpha, beta=beta)
        verdict = compare(out, ref, theirs, scale=scale)
        if not verdict:
            return False, f"{m}x{n}x{k} a={alpha} b={beta} misalign={misalign}: {verdict.detail}"
        worst = max(worst, verdict.error / 2**-23)
    return True, f"max scaled err {worst:.2f} eps"


def _time(config, size, reps, device):
    import torch

    import cute_kernels as ck

    m, n, k = problem_dims(size)
    gen = torch.Generator(device=device).manual_seed(m * 7 + n * 3 + k)
    a, b, c = (torch.randn(r, s, generator=gen, device=device) for r, s in ((m, k), (k, n), (m, n)))
    out = torch.empty_like(c)
    alpha, beta = 1.5, 0.5

    def ours():
        ck.sgemm(a, b, c, alpha=alpha, beta=beta, out=out, config=config)

    def cublas():
        torch.addmm(c, a, b, alpha=alpha, beta=beta, out=out)

    ms_ours, ms_cublas, tf_ours, tf_cublas = timed_pair(ours, cublas, reps=reps, flops=2.0 * m * n * k, device=device)
    # Correctness of the timed run itself (the last call may have been cuBLAS: run ours once more).
    ours()
    ref = alpha * (a.double() @ b.double()) + beta * c.double()
    rel = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    return ms_ours, ms_cublas, tf_ours, tf_cublas, rel


def _worker(name, kwargs, sizes, gpu_lock, reps, quick, compile_only=False):
    """Compile (in parallel with the other workers), then check and time under the GPU lock."""

    def body(row):
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        from cute_kernels import registry
        from cute_kernels.ops.gemm import GemmProblem
        from cute_kernels.runtime.device import arch as device_arch

        spec = registry.get("sgemm", "simt_cpasync")
        config = spec.config_cls(**kwargs)
        row["config"] = config.short()
        device = None if compile_only else torch.device("cuda", 0)
        arch = "sm_90a" if compile_only else device_arch(device.index, arch_specific=True)
        # Every compile-time variant the checks and timings will hit.
        problems = {
            GemmProblem(m=1, n=1, k=1, beta_zero=bz, a_align=al, b_align=al, c_align=al)
            for bz in (True, False)
            for al in (1, 4)
        }
        row["compile_s"] = compile_variants(spec, config, problems, arch)
        if compile_only:
            row["check"] = "ok"
            row["detail"] = "compiled for sm_90a only"
            return
        with gpu_lock:
            torch.cuda.set_device(device)
            ok, detail = _check(config, device)
            row["check"] = "ok" if ok else "FAIL"
            row["detail"] = detail
            if ok:
                for size in sizes[:1] if quick else sizes:
                    # Small problems take microseconds: more repetitions for a stable median.
                    ms, ms_cb, tf, tf_cb, rel = _time(config, size, reps if math.prod(problem_dims(size)) >= 4096**3 else 4 * reps, device)
                    row[f"ms_{size}"] = round(ms, 3)
                    row[f"tflops_{size}"] = round(tf, 2)
                    row[f"cublas_tflops_{size}"] = round(tf_cb, 2)
                    row[f"ratio_{size}"] = round(tf / tf_cb, 3)
                    row[f"relerr_{size}"] = f"{rel:.1e}"

    return probe_row(name, body)


def main() -> int:
    return run_probe(
        op="sgemm", description=__doc__.splitlines()[0], probe_configs=PROBE_CONFIGS, time_sizes=TIME_SIZES,
        worker=_worker, columns=lambda sizes: [f"{c}_{s}" for s in sizes for c in ("tflops", "cublas_tflops", "ratio")],
        jobs=8, timeout_s=900, quick_help="first 4 configs, 4096^3 only",
    )


if __name__ == "__main__":
    sys.exit(main())
