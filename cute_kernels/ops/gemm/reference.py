"""The GEMMs' oracle pieces: the per-element error scale of an FP32-accumulated product and the GEMM
verdict."""

from __future__ import annotations

import torch

from ...runtime.oracle import Verdict, compare


def gemm_scale(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, *, alpha: float = 1.0,
               beta: float = 0.0, k_growth: bool = True) -> torch.Tensor:
    """Per-element error scale of ``alpha * a @ b + beta * c`` computed by FP32 dot products of length K.

    Rounding an FP32 running sum at step i costs about eps * |S_i|, and those errors add up like a random
    walk. For terms with zero mean the partial sums grow like sqrt(i) * rms(term), for terms with a common
    sign like i * mean(term); both cases are covered by

        scale_ij = |alpha| * sqrt(K) * (sqrt(sum_k a_ik^2 b_kj^2) + |sum_k a_ik b_kj|) + |beta * c_ij|

    (the first term is sqrt(K) * sqrt(K) * rms, the second sqrt(K) * K * |mean|). A sequential K loop's
    error is then a fraction of an eps of this scale at every K, and blocked or split-K sums (cuBLAS) are
    below that, so the oracle's floor of a few eps bounds a correct kernel however it orders its sums,
    while a lost term (~1/K of the scale) or TF32 rounding (~2^-11 / sqrt(K)) still fails it. The norms are
    computed in FP32 (TF32 or not: a scale needs a few correct bits, not all) on inputs normalised by their
    largest magnitude so the squares cannot overflow.

    ``k_growth=False`` drops the sqrt(K) random-walk factor, leaving the magnitude of the result itself,

        scale_ij = |alpha| * (sqrt(sum_k a_ik^2 b_kj^2) + |sum_k a_ik b_kj|) + |beta * c_ij|,

    the scale for a 16-bit result accumulated in FP32 (HGEMM): its error is the final rounding, at most half
    an ulp of |result| <= scale, while the FP32 sum contributes ~2^-24 * sqrt(K) of it. Against this scale
    one dropped term of K costs ~1/sqrt(K), visible while that exceeds the oracle's floor (fp16 with a floor
    of 2 eps: K up to ~2^18).
    """
    k = a.shape[-1]
    a32, b32 = a.to(torch.float32), b.to(torch.float32)
    sa = float(a32.abs().max()) if a32.numel() else 0.0
    sb = float(b32.abs().max()) if b32.numel() else 0.0
    sa, sb = sa or 1.0, sb or 1.0
    an, bn = a32 / sa, b32 / sb
    norm = (an * an) @ (bn * bn)
    dot = (an @ bn).abs()
    growth = k ** 0.5 if k_growth else 1.0
    scale = (norm.to(torch.float64).sqrt() + dot.to(torch.float64)) * (abs(float(alpha)) * sa * sb * growth)
    if c is not None and float(beta) != 0.0:
        scale = scale + abs(float(beta)) * c.to(torch.float64).abs()
    return scale.clamp_min(torch.finfo(torch.float64).tiny)


def gemm_verdict(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, *,
                 alpha: float = 1.0, beta: float = 0.0, baseline: torch.Tensor | None = None) -> Verdict:
    """The oracle of a GEMM result ``alpha * a @ b + beta * c`` (FP32 accumulation; batches and ``c``
    broadcast as torch.matmul's and baddbmm's): against a float64 reference, at most twice ``baseline``'s
    error (torch doing the same product in the same precision) plus a floor. A 16-bit result is judged per
    element in units of ``gemm_scale(..., k_growth=False)`` (the result's magnitude) with a floor of
    ``HALF_GEMM_FLOOR_EPS`` eps of its dtype -- four times the half ulp that rounding the exact result once
    costs; a float32 one in units of ``gemm_scale`` (the sqrt(K) growth of an FP32 sum) with
    ``oracle.compare``'s default floor."""
    ref = float(alpha) * torch.matmul(a.double(), b.double())
    if c is not None and float(beta) != 0.0:
        ref = ref + float(beta) * c.double()
    half = out.dtype != torch.float32
    scale = gemm_scale(a, b, c, alpha=alpha, beta=beta, k_growth=not half)
    floor = HALF_GEMM_FLOOR_EPS * torch.finfo(out.dtype).eps if half else None
    return compare(out, ref, baseline, scale=scale, floor=floor)


# Floor of the 16-bit GEMM oracle, in eps of the output dtype (see gemm_verdict).
HALF_GEMM_FLOOR_EPS = 2
