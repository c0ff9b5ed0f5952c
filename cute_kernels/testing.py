"""The numerical oracle shared by the tests, the benchmark and the sweeps.

Our error against a high-precision reference must be at most twice the error of torch doing the same
computation in the same precision, plus a small floor: a kernel is as accurate as the vendor's or it fails.
Integer results must be exact. NaN where the reference has none always fails.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class Verdict:
    ok: bool
    error: float  # max scaled error of ours
    baseline_error: float  # the same for the vendor's result (0 when there is none)
    bound: float
    detail: str = ""

    def __bool__(self) -> bool:
        return self.ok


def compare(out: torch.Tensor, ref: torch.Tensor, baseline: torch.Tensor | None = None, *,
            scale: torch.Tensor | float | None = None, floor: float | None = None) -> Verdict:
    """Check ``out`` against ``ref`` (float64 or exact integers).

    ``scale`` normalises the error per element (e.g. the magnitude a correct sum at that position may
    carry); ``floor`` defaults to 8 ulps of ``out``'s dtype.
    """
    if out.shape != ref.shape:
        return Verdict(False, float("inf"), 0.0, 0.0, f"shape {tuple(out.shape)} != {tuple(ref.shape)}")
    if not out.dtype.is_floating_point:
        wrong = (out.to(torch.int64) != ref.to(torch.int64))
        n_wrong = int(wrong.sum())
        detail = ""
        if n_wrong:
            first = tuple(int(i) for i in wrong.nonzero()[0])
            detail = f"{n_wrong} wrong elements, first at {first}: got {out[first].item()}, expected {ref[first].item()}"
        return Verdict(n_wrong == 0, float(n_wrong), 0.0, 0.0, detail)

    ref64 = ref.to(torch.float64)
    if scale is None:
        scale = ref64.abs().max().clamp_min(1e-30)
    if floor is None:
        floor = 8 * torch.finfo(out.dtype).eps

    def scaled_error(t: torch.Tensor) -> tuple[float, torch.Tensor]:
        e = (t.to(torch.float64) - ref64).abs() / scale
        e = torch.where(torch.isnan(t.to(torch.float64)) & ~torch.isnan(ref64), torch.full_like(e, float("inf")), e)
        return float(e.max()) if e.numel() else 0.0, e

    err, e = scaled_error(out)
    base_err = scaled_error(baseline)[0] if baseline is not None else 0.0
    bound = 2 * base_err + floor
    detail = ""
    if not err <= bound:
        worst = tuple(int(i) for i in torch.nonzero(e == e.max())[0]) if e.numel() else ()
        detail = (f"max scaled error {err:.3g} > bound {bound:.3g} (torch: {base_err:.3g}); worst at {worst}: "
                  f"got {out[worst].item()!r}, expected {ref64[worst].item()!r}")
    return Verdict(err <= bound, err, base_err, bound, detail)


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    """An output buffer that fails the oracle wherever a kernel leaves it unwritten: NaN for floats, an
    improbable sentinel for integers."""
    if t.dtype.is_floating_point:
        return torch.full_like(t, float("nan"))
    return torch.full_like(t, torch.iinfo(t.dtype).min + 7)


def scan_scale(x: torch.Tensor) -> torch.Tensor:
    """Per-element error scale of a prefix sum along the last dim: rounding errors of a sum of i random
    terms grow like sqrt(i) times their typical size, plus the size of the partial sum itself."""
    length = x.shape[-1]
    x64 = x.to(torch.float64)
    rms = x64.pow(2).mean(dim=-1, keepdim=True).sqrt().clamp_min(1e-30)
    position = torch.arange(1, length + 1, device=x.device, dtype=torch.float64)
    return position.sqrt() * rms + torch.cumsum(x64, dim=-1).abs()


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
    """The oracle of a 16-bit GEMM result ``alpha * a @ b + beta * c`` (FP32 accumulation): against a float64
    reference, per element in units of ``gemm_scale(..., k_growth=False)`` (the result's magnitude), at most
    twice ``baseline``'s error (torch doing the same product in the same dtype) plus a floor of
    ``HALF_GEMM_FLOOR_EPS`` eps of the output dtype -- four times the half ulp that rounding the exact
    result once costs."""
    ref = float(alpha) * (a.double() @ b.double())
    if c is not None and float(beta) != 0.0:
        ref = ref + float(beta) * c.double()
    scale = gemm_scale(a, b, c, alpha=alpha, beta=beta, k_growth=False)
    floor = HALF_GEMM_FLOOR_EPS * torch.finfo(out.dtype).eps
    return compare(out, ref, baseline, scale=scale, floor=floor)


# Floor of the 16-bit GEMM oracle, in eps of the output dtype (see gemm_verdict).
HALF_GEMM_FLOOR_EPS = 2


def _tap_sum(volume: torch.Tensor, kernel: torch.Tensor, term) -> torch.Tensor:
    """sum over taps (d, r, c) of term(volume window shifted by the tap, kernel[d, r, c]), in float64: the
    window of tap (d, r, c) is volume[..., d:d+OD, r:r+OH, c:c+OW]. One pass per tap, no im2col buffer."""
    kd, kh, kw = kernel.shape
    od, oh, ow = (volume.shape[-3] - kd + 1, volume.shape[-2] - kh + 1, volume.shape[-1] - kw + 1)
    v64 = volume.to(torch.float64)
    k64 = kernel.to(torch.float64).cpu().tolist()
    acc = torch.zeros((*volume.shape[:-3], od, oh, ow), dtype=torch.float64, device=volume.device)
    for d in range(kd):
        for r in range(kh):
            for c in range(kw):
                acc += term(v64[..., d:d + od, r:r + oh, c:c + ow], k64[d][r][c])
    return acc


def conv3d_reference(volume: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Valid 3-D cross-correlation in float64 over the last three dims of ``volume`` (any leading dims)."""
    return _tap_sum(volume, kernel, lambda window, k: window * k)


def conv3d_scale(volume: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Per-element error scale of an FP32 conv3d output: a dot product of T = KD*KH*KW terms, so as for
    gemm_scale, sqrt(T) * (sqrt(sum of squared terms) + |sum of terms|). A sequential FP32 sum errs by a
    fraction of an eps of this; a lost tap (~1/T of it) or TF32 rounding does not."""
    taps = kernel.numel()
    squares = _tap_sum(volume, kernel, lambda window, k: (window * k) ** 2)
    scale = taps ** 0.5 * (squares.sqrt() + conv3d_reference(volume, kernel).abs())
    return scale.clamp_min(torch.finfo(torch.float64).tiny)
