"""Whether an FP32 product computed from three bf16 planes of each operand (x = x0 + x1 + x2, the six terms
with i + j <= 2, each a bf16 GEMM accumulating in FP32 on the tensor cores) is as accurate as an FP32
product: the open question of an FP32 attention backward on the 16-bit Hopper kernels
(docs/notes/attention-backward-plan.md, "Three bf16 planes"). The tensor core's accumulation is the doubt,
so the long sum of the backward (dV = P^T dO over every query row) is what is measured: K = 512..8192, P
like a softmax's probabilities (positive, rows summing to 1) and randn operands, against float64, beside
torch's FP32 product with TF32 off and with TF32 on.

    PYTHONPATH=. python scripts/probes/bf16x3_products.py
"""

from __future__ import annotations

import torch


def planes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x0 = x.bfloat16()
    r = x - x0.float()
    x1 = r.bfloat16()
    x2 = (r - x1.float()).bfloat16()
    return x0, x1, x2


def six_terms(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum over i + j <= 2 of a_i @ b_j, each in FP32 (``mm`` with ``out_dtype``), smallest terms first."""
    pa, pb = planes(a), planes(b)
    out = torch.zeros(a.shape[0], b.shape[1], device=a.device)
    for i, j in ((0, 2), (1, 1), (2, 0), (0, 1), (1, 0), (0, 0)):
        out += torch.mm(pa[i], pb[j], out_dtype=torch.float32)
    return out


def fp32(a, b, tf32: bool):
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        return torch.mm(a, b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def main() -> int:
    g = torch.Generator(device="cuda").manual_seed(0)
    print("| operands | K | way | max err / (abs a @ abs b) | mean | max err / max abs exact |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kind in ("P^T dO (probabilities x randn)", "randn x randn"):
        for k in (512, 2048, 8192):
            if kind.startswith("P"):
                scores = torch.randn(128, k, device="cuda", generator=g) * 2
                a = torch.softmax(scores, dim=1) * 128  # each column of P^T sums to ~1 over the 128 keys
            else:
                a = torch.randn(128, k, device="cuda", generator=g)
            b = torch.randn(k, 128, device="cuda", generator=g)
            exact = a.double() @ b.double()
            scale = a.double().abs() @ b.double().abs()
            for way, got in (("FP32 (TF32 off)", fp32(a, b, False)), ("TF32", fp32(a, b, True)),
                             ("bf16 x3, six terms", six_terms(a, b))):
                err = (got.double() - exact).abs()
                print(f"| {kind} | {k} | {way} | {float((err / scale).max()):.2e} | {float((err / scale).mean()):.2e} "
                      f"| {float(err.max() / exact.abs().max()):.2e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
