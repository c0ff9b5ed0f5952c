"""Every kernel binary family on small ragged shapes, for compute-sanitizer (scripts/sanitize.sh runs it after
the bad-input suite, which only reaches each op's default config).

Each case names a variant and a config that changes the kernel's structure (tile shape, pipeline, main-loop
schedule, look-back scheme, staging), runs it through the public op on shapes that leave partial tiles in
every dimension, and compares with a float64 reference. One line per case; the exit status is 1 if any case
raised or came out wrong. Names given on the command line keep the cases whose name starts with one of them.

    python3 scripts/sanitize_kernels.py [scan attention ...]
"""

from __future__ import annotations

import sys

import torch

import cute_kernels as ck
from cute_kernels.ops.attention.spec import reference_and_scale
from cute_kernels.ops.conv3d.reference import conv3d_reference
from cute_kernels.ops.gemm import HgemmConfig, HgemmSm90Config
from cute_kernels.ops.scan import ScanProblem
from cute_kernels.ops.scan.lookback import planned_ramp_step_ns

GEN = torch.Generator(device="cpu").manual_seed(11)


def randn(*shape, dtype=torch.float32):
    return torch.randn(shape, generator=GEN).to("cuda", dtype)


def gemm_case(op, dtype, m, n, k, config, alpha=1.5, beta=0.5):
    a, b, c = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype), randn(m, n, dtype=dtype)
    out = getattr(ck, op)(a, b, c, alpha=alpha, beta=beta, config=config)
    ref = alpha * (a.double() @ b.double()) + beta * c.double()
    return out, ref


def attention_case(dtype, m, n, d, causal, config, heads=3, kv_heads=3, window=None, num_sinks=0, lse=False):
    q = randn(2, heads, m, d, dtype=dtype)
    k, v = randn(2, kv_heads, n, d, dtype=dtype), randn(2, kv_heads, n, d, dtype=dtype)
    out = ck.attention(q, k, v, causal=causal, window=window, num_sinks=num_sinks, return_lse=lse, config=config)
    out = out[0] if lse else out  # the lse is written beside it (its memory checked), not compared here
    return out, reference_and_scale(q, k, v, causal=causal, window=window, num_sinks=num_sinks)[0]


def flash3_case(dtype, d, causal, config, **features):
    from cute_kernels.ops.attention import flash3_wgmma

    sm_count = flash3_wgmma.sm_count
    flash3_wgmma.sm_count = lambda device: 3  # the grid of persistent launches
    try:
        return attention_case(dtype, 257, 300, d, causal, config, **features)
    finally:
        flash3_wgmma.sm_count = sm_count


def attention_backward_case(dtype, heads, kv_heads, m, n, d, causal):
    """dq, dk, dv of ck.attention (its default backward: on sm_90 the wgmma kernels) against float64 autograd
    through SDPA (its math backend; causal top-left aligned as ours), each gradient divided by its largest
    reference element, concatenated."""
    q = randn(1, heads, m, d, dtype=dtype).requires_grad_()
    k, v = (randn(1, kv_heads, n, d, dtype=dtype).requires_grad_() for _ in range(2))
    grad = randn(1, heads, m, d, dtype=dtype)
    ours = torch.autograd.grad(ck.attention(q, k, v, causal=causal), (q, k, v), grad)
    exact_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    group = heads // kv_heads
    expanded = [exact_in[0]] + [t.repeat_interleave(group, dim=1) for t in exact_in[1:]]
    exact_out = torch.nn.functional.scaled_dot_product_attention(*expanded, is_causal=causal)  # float64: math
    exact = torch.autograd.grad(exact_out, exact_in, grad.double())
    scales = [e.abs().max().clamp_min(1e-30) for e in exact]
    return (torch.cat([(o.double() / s).flatten() for o, s in zip(ours, scales)]),
            torch.cat([(e / s).flatten() for e, s in zip(exact, scales)]))


def conv3d_case(shape, ksize, config):
    vol, ker = randn(*shape), randn(ksize, ksize, ksize)
    return ck.conv3d(vol, ker, config=config), conv3d_reference(vol, ker)


def scan_case(shape, dtype, config, exclusive=False):
    x = randn(*shape, dtype=dtype) if dtype.is_floating_point else torch.randint(-9, 9, shape, generator=GEN).to("cuda", dtype)
    out = ck.scan(x, exclusive=exclusive, config=config)
    ref = torch.cumsum(x.double() if dtype.is_floating_point else x.long(), -1)
    if exclusive:
        ref = ref - (x.double() if dtype.is_floating_point else x.long())
    return out, ref


def ramped_scan_case(shape, dtype, config):
    """scan_case on a launch the first wave's ramp applies to (two waves or more), which it first asserts."""
    problem = ScanProblem(shape[0] if len(shape) > 1 else 1, shape[-1], dtype)
    assert planned_ramp_step_ns(config, problem, torch.cuda.current_device()) > 0, f"{config}: no ramp"
    return scan_case(shape, dtype, config)


# (name, thunk, relative tolerance on max |out - ref| / max |ref|)
CASES = [
    ("sgemm 128x128x8 s3 M-major A", lambda: gemm_case("sgemm", torch.float32, 257, 131, 67, ck.GemmConfig()), 1e-5),
    ("sgemm 128x128x32 s2 K-major A", lambda: gemm_case(
        "sgemm", torch.float32, 257, 131, 68, ck.GemmConfig(tile_k=32, num_stages=2, a_smem_major="k")), 1e-5),
    ("sgemm 32x32x8 s3 8x8 threads", lambda: gemm_case(
        "sgemm", torch.float32, 45, 33, 19, ck.GemmConfig(tile_m=32, tile_n=32, threads_m=8, threads_n=8)), 1e-5),
    ("hgemm sm80 128x256x32 s4", lambda: gemm_case("hgemm", torch.float16, 300, 264, 136, HgemmConfig()), 1e-2),
    ("hgemm sm80 64x64x32 s3 bf16", lambda: gemm_case("hgemm", torch.bfloat16, 100, 72, 40, HgemmConfig(
        tile_m=64, tile_n=64, num_stages=3, warps_m=2, warps_n=2)), 2e-2),
    ("hgemm sm90 128x256x64 s3 cluster 2x1", lambda: gemm_case("hgemm", torch.float16, 300, 264, 136, HgemmSm90Config(
        num_stages=3, cluster_m=2)), 1e-2),
    ("hgemm sm90 64x128x64 s6 one warpgroup bf16", lambda: gemm_case("hgemm", torch.bfloat16, 100, 72, 200, HgemmSm90Config(
        tile_m=64, tile_n=128, num_stages=6, consumer_warpgroups=1)), 2e-2),
    # Split-K: the workspace planes, the arrival counters and the last slice's grouped sum (edge tiles too).
    ("hgemm sm80 16x128x64 split 8 decode rows", lambda: gemm_case("hgemm", torch.float16, 17, 300, 2100, HgemmConfig(
        tile_m=16, tile_n=128, tile_k=64, num_stages=4, warps_m=1, warps_n=4, split_k=8)), 1e-2),
    ("hgemm sm90 64x64x64 split 4", lambda: gemm_case("hgemm", torch.float16, 100, 136, 1104, HgemmSm90Config(
        tile_m=64, tile_n=64, num_stages=6, consumer_warpgroups=1, split_k=4)), 1e-2),
    ("sgemm 64x64x8 split 4", lambda: gemm_case("sgemm", torch.float32, 70, 72, 1000, ck.GemmConfig(
        tile_m=64, tile_n=64, threads_m=8, threads_n=8, split_k=4)), 1e-5),
    *[(f"attention flash {loop} d={d}{' causal' if causal else ''}", (lambda loop=loop, d=d, causal=causal: attention_case(
        torch.float16, 129, 77 if not causal else 129, d, causal, ck.FlashConfig(128, 64, 4, loop))), 1e-2)
      for loop in ("classic", "lean", "lean_eager") for d in (64, 128) for causal in (False, True)
      if not (loop == "lean_eager" and d == 128)],  # lean_eager would spill at d=128: supports() refuses it
    ("attention flash lean d=128 bf16, 32-key blocks", lambda: attention_case(
        torch.bfloat16, 77, 129, 128, False, ck.FlashConfig(128, 32, 4, "lean")), 2e-2),
    # flash3_wgmma (sm_90), on three CTAs: persistent ones walk four to six units each, so the ring, Q's barrier
    # and the ping-pong turns carry across units (small enough for racecheck).
    *[(f"attention flash3 d={d} {label}{' causal' if causal else ''}", (lambda d=d, causal=causal, config=config: (
        flash3_case(dtype, d, causal, config))), 2e-2 if dtype == torch.bfloat16 else 1e-2)
      for d, dtype, label, config in (
          (128, torch.float16, "overlap pingpong persistent", ck.Flash3Config()),
          (128, torch.bfloat16, "plain one unit per CTA", ck.Flash3Config(overlap=False, pingpong=False, persistent=False)),
          (64, torch.float16, "3 consumers overlap pingpong", ck.Flash3Config(consumers=3)),
          (128, torch.float16, "dynamic scheduler", ck.Flash3Config(dynamic=True)),
          (64, torch.float16, "64-key tiles 3 stages", ck.Flash3Config(64, 3)),
          (256, torch.float16, "80-key tiles", ck.Flash3Config(80)),
          (96, torch.float16, "padded d", ck.Flash3Config()),
          (96, torch.float16, "TMA-store epilogue", ck.Flash3Config(tma_store=True)),
          (64, torch.float16, "two Q buffers", ck.Flash3Config(tma_store=True, q_buffers=2)),
          (64, torch.float16, "two Q buffers dynamic", ck.Flash3Config(dynamic=True, tma_store=True, q_buffers=2)),
          (128, torch.float16, "grouped units", ck.Flash3Config(dynamic=True, tma_store=True, grouped_units=True)),
          (64, torch.float16, "3 consumers grouped units two Q buffers",
           ck.Flash3Config(consumers=3, dynamic=True, tma_store=True, q_buffers=2, grouped_units=True)))
      for causal in (False, True)],
    # The features model code calls it with: grouped-query heads, a window with sinks, the log-sum-exp.
    *[(f"attention flash3 d=128 {label}{' causal' if causal else ''}", (lambda causal=causal, features=features: (
        flash3_case(torch.float16, 128, causal, ck.Flash3Config(), **features))), 1e-2)
      for label, features in (("grouped-query 4/2 heads", dict(heads=4, kv_heads=2)),
                              ("window (64, 16) 4 sinks", dict(window=(64, 16), num_sinks=4)),
                              ("log-sum-exp", dict(lse=True)))
      for causal in (False, True)],
    # The backward's default kernels (on sm_90 the wgmma dK/dV and dQ kernels): grouped-query heads, ragged
    # rows and keys, a padded head dim, several query tiles per key block.
    *[(f"attention backward d={d} {str(dtype)[6:]}{' causal' if causal else ''}", (
        lambda d=d, dtype=dtype, causal=causal: attention_backward_case(dtype, 4, 2, 200, 150, d, causal)),
       2e-2 if dtype == torch.bfloat16 else 1e-2)
      for d, dtype in ((64, torch.float16), (128, torch.bfloat16), (80, torch.float16)) for causal in (False, True)],
    ("attention fp32 32x64 2 rows/thread", lambda: attention_case(torch.float32, 77, 129, 128, False, ck.Fp32Config(
        32, 64, 2)), 1e-4),
    ("attention fp32 128x64 4 rows/thread causal d=64", lambda: attention_case(
        torch.float32, 129, 129, 64, True, ck.Fp32Config(128, 64, 4)), 1e-4),
    # flash2_tf32x3 (float32 on tensor cores): both tile heights, 16-byte and element-wise copies (d=100, d=3).
    ("attention tf32x3 128x64 d=128", lambda: attention_case(torch.float32, 77, 129, 128, False, ck.Tf32x3Config(
        128, 64)), 1e-4),
    ("attention tf32x3 64x32 d=100 causal", lambda: attention_case(torch.float32, 129, 129, 100, True, ck.Tf32x3Config(
        64, 32)), 1e-4),
    ("attention tf32x3 64x64 d=3", lambda: attention_case(torch.float32, 70, 65, 3, False, ck.Tf32x3Config(64, 64)), 1e-4),
    # The float32 backward's 3xTF32 mma.sync kernels (d <= 64) and its FFMA ones (d = 128).
    *[(f"attention backward d={d} float32{' causal' if causal else ''}", (
        lambda d=d, causal=causal: attention_backward_case(torch.float32, 4, 2, 200, 150, d, causal)), 1e-4)
      for d in (64, 40, 128) for causal in (False, True)],
    ("conv3d default 3^3", lambda: conv3d_case((19, 37, 45), 3, None), 1e-5),
    ("conv3d 16x64 tiles 2x4 per thread 2 stages 5^3", lambda: conv3d_case((21, 37, 70), 5, ck.Conv3dConfig(
        16, 64, 2, 4, 32, 2)), 1e-5),
    ("scan inline staged 256x16", lambda: scan_case((100_003,), torch.float32, ck.ScanConfig(256, 16, True)), 1e-5),
    ("scan dedicated staged 384x48", lambda: scan_case((300_007,), torch.float32, ck.ScanConfig(
        384, 48, True, "dedicated")), 1e-5),
    ("scan dedicated unstaged 256x32 exclusive", lambda: scan_case((5, 40_001), torch.float32, ck.ScanConfig(
        256, 32, False, "dedicated"), exclusive=True), 1e-5),
    ("scan early staged 384x48", lambda: scan_case((300_007,), torch.float32, ck.ScanConfig(
        384, 48, True, "early")), 1e-5),
    ("scan early unstaged 128x16 float64 rows exclusive", lambda: scan_case((24, 100_003), torch.float64,
        ck.ScanConfig(128, 16, False, "early"), exclusive=True), 1e-12),
    ("scan early unstaged 256x8 int32 rows", lambda: scan_case((33, 1001), torch.int32, ck.ScanConfig(
        256, 8, False, "early")), 0.0),
    ("scan inline float64 rows", lambda: scan_case((7, 1001), torch.float64, ck.ScanConfig(128, 16, False)), 1e-12),
    ("scan inline int32 128x48", lambda: scan_case((70_001,), torch.int32, ck.ScanConfig(128, 48, True)), 0.0),
    # The first wave's ramp only runs on launches of two waves or more: 8193 tiles of 512 elements.
    ("scan early unstaged 128x4 ramp", lambda: ramped_scan_case(((1 << 22) + 3,), torch.float32, ck.ScanConfig(
        128, 4, False, "early", ramp_ns=4000)), 1e-5),
    ("scan inline staged 128x4 int32 rows ramp", lambda: ramped_scan_case((3, 1_400_001), torch.int32,
        ck.ScanConfig(128, 4, True, "inline", ramp_ns=4000)), 0.0),
]


def main(prefixes: list[str]) -> int:
    failed = 0
    cases = [case for case in CASES if not prefixes or case[0].startswith(tuple(prefixes))]
    print(f"{len(cases)} kernel cases\n\n| case | outcome |\n| --- | --- |")
    for name, thunk, tol in cases:
        try:
            out, ref = thunk()
            torch.cuda.synchronize()
            err = (out.double() - ref.double()).abs().max().item() / max(ref.double().abs().max().item(), 1e-30)
            verdict = "ok" if err <= tol else f"WRONG (relative error {err:.2e} > {tol:.0e})"
        except Exception as exc:  # noqa: BLE001 - every failure is reported, the run goes on
            verdict = f"RAISED {type(exc).__name__}: {exc}"
        failed += verdict != "ok"
        print(f"| {name} | {verdict} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
