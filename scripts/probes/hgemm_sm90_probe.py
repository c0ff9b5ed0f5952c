"""GPU probe for the Hopper HGEMM (hgemm/sm90_wgmma): compile configs in parallel, check numerics, time fp16 and
bf16 against cuBLAS.

The same machinery as scripts/probes/hgemm_gpu_probe.py (gemm_probe_common: one spawn worker per config,
compiles concurrent, checks and timings in turn under one GPU lock; its ``time_config``: ``ck.hgemm(a, b,
out=out, config=config)`` against ``torch.matmul`` at alpha 1, beta 0, interleaved rep by rep, medians, the
timed output checked). The check shapes are the ones TMA can take (N and K multiples of 8) and break every tile; a
table goes to stdout and, when ``$OUT`` is set, a CSV to ``$OUT/hgemm_sm90_probe.csv``.

    PYTHONPATH=. python scripts/probes/hgemm_sm90_probe.py [--quick] [--jobs 8] [--reps 15] [--only NAME ...]
    PYTHONPATH=. python scripts/probes/hgemm_sm90_probe.py --compile-only   # no GPU needed
"""

from __future__ import annotations

import dataclasses
import functools
import sys

from gemm_probe_common import run_probe
from hgemm_gpu_probe import DTYPES, timing_columns, variant_worker

# (name, HgemmSm90Config kwargs[, sizes to time]). The questions: which big tile and depth is the default
# at 4096^3-8192^3, and which small tile wins where a big tile's waves leave SMs idle (1024-3072^3).
_BIG_M = {"tile_m": 256, "tile_n": 128}
_SMALL = [1024, 2048, 3072]
PROBE_CONFIGS = [
    ("128x256_s4_c2x1", {"cluster_m": 2}, [1024, 2048, 3072, 4096, 8192]),
    ("128x256_s3_c2x1", {"cluster_m": 2, "num_stages": 3}, [2048, 3072, 4096, 8192]),
    ("128x256_s4", {}, [4096, 8192]),
    ("256x128_s4", _BIG_M, [4096, 8192]),
    ("256x128_s4_c1x2", {**_BIG_M, "cluster_n": 2}, [4096, 8192]),
    ("128x128_wg2_s4", {"tile_m": 128, "tile_n": 128, "num_stages": 4}, _SMALL),
    ("128x128_wg1_s4", {"tile_m": 128, "tile_n": 128, "consumer_warpgroups": 1, "num_stages": 4}, _SMALL),
    ("64x128_wg1_s6", {"tile_m": 64, "tile_n": 128, "consumer_warpgroups": 1, "num_stages": 6}, _SMALL),
    ("128x64_wg1_s6", {"tile_m": 128, "tile_n": 64, "consumer_warpgroups": 1, "num_stages": 6}, _SMALL),
    ("64x256_wg1_s4", {"tile_m": 64, "tile_n": 256, "consumer_warpgroups": 1, "num_stages": 4}, _SMALL),
]

CHECK_SHAPES = [  # (m, n, k, alpha, beta): N and K multiples of 8, nothing else a multiple of a tile
    (1100, 1288, 328, 1.5, -0.5),
    (255, 264, 136, 1.0, 0.0),
    (17, 8, 8, 2.0, -1.0),
    (2056, 4104, 136, 1.25, 0.5),
    (2048, 2048, 2048, 1.5, 0.5),
]
TIME_SIZES = [4096, 8192]


def _check(config, device):
    """The shared oracle on every check shape, fp16 and bf16; returns (ok, detail)."""
    import torch

    import cute_kernels as ck
    from cute_kernels.ops.gemm.reference import gemm_verdict
    from cute_kernels.runtime.oracle import poisoned_like

    worst = 0.0
    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        for m, n, k, alpha, beta in CHECK_SHAPES:
            gen = torch.Generator(device=device).manual_seed(m * 131 + n * 7 + k)
            a, b, c = (torch.randn(r, s, generator=gen, device=device).to(dtype) for r, s in ((m, k), (k, n), (m, n)))
            out = poisoned_like(c)
            ck.hgemm(a, b, c, alpha=alpha, beta=beta, out=out, config=config)
            theirs = torch.addmm(c, a, b, alpha=alpha, beta=beta)
            verdict = gemm_verdict(out, a, b, c, alpha=alpha, beta=beta, baseline=theirs)
            if not verdict:
                return False, f"{dtype_name} {m}x{n}x{k} a={alpha} b={beta}: {verdict.detail}"
            worst = max(worst, verdict.error / torch.finfo(dtype).eps)
    return True, f"max scaled err {worst:.2f} eps"


def _compile_problems(spec):
    """The compile-time variants the checks and timings hit: both dtypes, beta zero or not."""
    base = spec.standard_problems()[0]
    return {dataclasses.replace(base, dtype=d, beta_zero=bz) for d in DTYPES for bz in (True, False)}


def main() -> int:
    return run_probe(
        op="hgemm_sm90", description=__doc__.splitlines()[0], probe_configs=PROBE_CONFIGS, time_sizes=TIME_SIZES,
        worker=functools.partial(variant_worker, "sm90_wgmma", _check, _compile_problems),
        columns=timing_columns, jobs=16, timeout_s=900, quick_help="first 4 configs, fp16 at the first size only",
    )


if __name__ == "__main__":
    sys.exit(main())
