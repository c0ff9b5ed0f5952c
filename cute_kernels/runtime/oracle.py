"""The numerical oracle shared by the tests, the benchmark and the sweeps.

Our error against a high-precision reference must be at most twice the error of torch doing the same
computation in the same precision, plus a small floor: a kernel is as accurate as the vendor's or it fails.
Integer results must be exact. NaN where the reference has none always fails.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch


@contextlib.contextmanager
def fp32_matmuls():
    """torch's float32 matmuls without TF32 for the block, the caller's setting restored after: the
    precision the float32 baselines are defined in."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


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
        # The largest finite magnitude: an infinite (or NaN) element of the reference would make every finite
        # element's scaled error 0 (or NaN), and the check vacuous.
        finite = ref64[torch.isfinite(ref64)]
        scale = finite.abs().max().clamp_min(1e-30) if finite.numel() else torch.tensor(1.0, dtype=torch.float64)
    if floor is None:
        floor = 8 * torch.finfo(out.dtype).eps

    def scaled_error(t: torch.Tensor) -> tuple[float, torch.Tensor]:
        t64 = t.to(torch.float64)
        e = (t64 - ref64).abs() / scale
        # Equal values (infinities included, whose difference is NaN) and NaN where the reference has NaN
        # are no error; NaN where it has none is an infinite one.
        e = torch.where((t64 == ref64) | (torch.isnan(t64) & torch.isnan(ref64)), torch.zeros_like(e), e)
        e = torch.nan_to_num(e, nan=float("inf"), posinf=float("inf"))  # NaN on one side only, or an infinity against a finite value
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
