"""The public ``attention`` op: checks the arguments, picks the variant and config, launches."""

from __future__ import annotations

import torch

from ... import registry
from ...runtime import checks
from ...runtime.device import on_device, shared_memory_limit
from .problem import DTYPE_VARIANTS, AttentionProblem, check_attention_args, _check_scale, _vector_width

# Calls already validated, by structure (see checks.ValidatedCalls); the scale and out's overlaps are
# checked every call.
_VALIDATED = checks.ValidatedCalls()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
              causal: bool = False, out: torch.Tensor | None = None, config=None,
              variant: str | None = None) -> torch.Tensor:
    """``softmax(q @ k^T * scale) @ v`` per (batch, head), like ``torch.nn.functional.scaled_dot_product_attention``.

    q: (M, d) or (B, H, M, d); k, v: (N, d) or (B, H, N, d); float32, float16 or bfloat16, all alike.
    ``scale`` defaults to 1/sqrt(d). ``causal=True`` lets query i see keys 0..i (top-left aligned, as torch's
    ``is_causal`` does also when M != N). float32 computes in FP32 throughout (no TF32); float16/bfloat16 on
    tensor cores with FP32 softmax and accumulators. Inputs need stride 1 in the head dim; any other strides
    are fine. ``out`` (contiguous, q's shape and dtype) receives the result; it is left untouched on an error.
    """
    checks.no_fake(q=q, k=k, v=v, out=out)  # before anything reads a pointer
    key = _VALIDATED.key((q, k, v, out), type(scale), type(causal), causal, config, variant)
    known = _VALIDATED.get(key)
    if known is None:
        scale = check_attention_args(q, k, v, scale, causal)
        if out is not None:
            checks.output("out", out, shape=q.shape, dtype=q.dtype, device=q.device, inputs={"q": q, "k": k, "v": v})
        spec = registry.for_call("attention", variant or DTYPE_VARIANTS[q.dtype])
        if q.dtype not in spec.dtypes:
            raise TypeError(f"q: variant {spec.variant!r} takes {spec.dtypes}, got {q.dtype}")
        checks.config_type(config, spec.config_cls)  # the variant's own config class
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if out.numel() == 0:
            return out
        batch, heads = (q.shape[0], q.shape[1]) if q.dim() == 4 else (1, 1)
        d = q.shape[-1]
        problem = AttentionProblem(batch, heads, q.shape[-2], k.shape[-2], d, q.dtype, bool(causal),
                                   vector=_vector_width(q.dtype, d, (q, k, v, out)),
                                   shared_limit=shared_memory_limit(q.device.index))
        if config is not None:
            reason = spec.why_unsupported(config, problem)
            if reason is not None:
                raise ValueError(f"config: {config} cannot run {problem}: {reason}")
        _VALIDATED.remember(key, (spec, problem))
    else:  # this structure passed every check above before; the values may still be wrong
        spec, problem = known
        scale = _check_scale(scale)
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        else:
            checks.no_overlap("out", out, {"q": q, "k": k, "v": v})
    if config is None:
        config = spec.choose_config(problem, q.device.index)
    inputs = {"q": q, "k": k, "v": v, "scale": scale}
    return on_device(q.device.index, spec.launch, config, problem, inputs, out)
