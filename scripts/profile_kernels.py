"""Hardware counters for chosen kernels under Nsight Compute: each target is compiled and warmed up first,
then run once between cudaProfilerStart/Stop, so ncu (``--profile-from-start off``) sees only those launches.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section WarpStateStats ... \
        python3 scripts/profile_kernels.py scan:268435456:512:48:1 hgemm:8192 sgemm:4096

Targets: ``scan:N[:threads:items:staged]`` (float32), ``hgemm:S[:dtype[:variant[:unswizzled]]]`` (S is S^3
or MxNxK; the op's default config, or that variant's, e.g. ``hgemm:8192:float16:sm80_mma``; ``:unswizzled``
runs that config with the plain row-major stage layout, for the bank-conflict comparison),
``sgemm:S``, ``torch_sgemm:S`` (cuBLAS's FP32 GEMM, TF32 off, for the stall comparison),
``torch_hgemm:S[:dtype]`` (cuBLAS's 16-bit GEMM on the same operands), ``attention:S[:d]`` (B=4, H=16, fp16), ``conv3d:S[:k]`` (S^3 volume, k^3 kernel).
"""

from __future__ import annotations

import sys

import torch

import cute_kernels as ck


def gemm_shape(text: str) -> tuple[int, int, int]:
    """(M, N, K) of ``S`` (a cube) or ``MxNxK``."""
    sizes = [int(x) for x in text.split("x")]
    return (sizes[0],) * 3 if len(sizes) == 1 else tuple(sizes)


def target(spec: str):
    name, *args = spec.split(":")
    randn = lambda *shape, dtype=torch.float32: torch.randn(shape, device="cuda", dtype=dtype)  # noqa: E731
    if name == "scan":
        x = randn(int(args[0]))
        out = torch.empty_like(x)
        config = ck.ScanConfig(int(args[1]), int(args[2]), bool(int(args[3]))) if len(args) > 1 else None
        return lambda: ck.scan(x, out=out, config=config)
    if name in ("hgemm", "sgemm", "torch_hgemm"):
        m, n, k = gemm_shape(args[0])
        dtype = getattr(torch, args[1]) if len(args) > 1 else (torch.float32 if name == "sgemm" else torch.float16)
        a, b = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype)
        out = torch.empty(m, n, device="cuda", dtype=dtype)
        if name == "torch_hgemm":
            return lambda: torch.mm(a, b, out=out)
        fn = getattr(ck, name)
        config = None
        if len(args) > 2:  # a variant by name: its tuned or default config for this problem
            from cute_kernels import registry
            from cute_kernels.ops.gemm.problem import make_problem

            config = registry.get(name, args[2]).choose_config(make_problem(a, b, out=out), 0)
            if len(args) > 3 and args[3] == "unswizzled":  # hgemm sm80_mma's conflicted reference layout
                import dataclasses

                config = dataclasses.replace(config, swizzle=False)
        return lambda: fn(a, b, out=out, config=config)
    if name == "torch_sgemm":
        s = int(args[0])
        torch.backends.cuda.matmul.allow_tf32 = False
        a, b, out = randn(s, s), randn(s, s), torch.empty(s, s, device="cuda")
        return lambda: torch.mm(a, b, out=out)
    if name == "attention":
        s, d = int(args[0]), int(args[1]) if len(args) > 1 else 128
        q, k, v = (randn(4, 16, s, d, dtype=torch.float16) for _ in range(3))
        return lambda: ck.attention(q, k, v)
    if name == "conv3d":
        s, k = int(args[0]), int(args[1]) if len(args) > 1 else 5
        vol, ker = randn(s, s, s), randn(k, k, k)
        return lambda: ck.conv3d(vol, ker)
    raise SystemExit(f"unknown target {spec!r}")


def main() -> int:
    runs = [(spec, target(spec)) for spec in sys.argv[1:]]
    for _, fn in runs:
        fn()
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for spec, fn in runs:
        torch.cuda.nvtx.range_push(spec)
        fn()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
