"""The public ``attention`` op: a call of a structure seen before runs its plan; a new one is checked,
given a variant, a config and a packed launch, and becomes a plan (``runtime.plans``)."""

from __future__ import annotations

import torch

from ... import registry
from ...runtime import checks
from ...runtime.autograd import check_writable, mark_written
from ...runtime.device import device_sm, on_device, shared_memory_limit
from ...runtime.plans import CallPlans
from .flash2_tf32x3 import tf32x3_is_default_for
from .flash3_wgmma import tma_describes
from .problem import DTYPE_VARIANTS, AttentionProblem, batch_heads_of, check_attention_args, _check_scale, _vector_width
from .spec import flash_zoo_problems, fp32_zoo_problems, held_out_problems

_PLANS = CallPlans("attention")


class AttentionPlan:
    """Every call of one structure: the result's shape, dtype and device, and the variant's packed launch
    (None: the result is empty). Per call it checks the scale's value, which memory ``out`` overlaps and
    whether it may be written, allocates the result and launches."""

    __slots__ = ("shape", "dtype", "device", "device_index", "like_q", "launch", "return_lse", "out_guard",
                 "no_keys")

    def __init__(self, q, launch, return_lse=False, no_keys=False):
        self.shape, self.dtype, self.device, self.device_index = tuple(q.shape), q.dtype, q.device, q.device.index
        self.like_q = checks.has_canonical_strides(q)  # then empty_like(q) is the result: the cheapest allocation
        self.launch = launch
        self.return_lse = return_lse
        self.out_guard = checks.PlanOverlaps(("q", "k", "v"))
        self.no_keys = no_keys  # N = 0: every row sees no key, so it is 0 (lse -inf), with no kernel

    def __call__(self, q, k, v, scale, out):
        scale = _check_scale(scale)
        given = out is not None
        if given:
            self.out_guard.check(out, q, k, v)
            check_writable("out", out)
        else:
            out = torch.empty_like(q) if self.like_q else torch.empty(*self.shape, dtype=self.dtype, device=self.device)
        lse = torch.empty(self.shape[:-1], dtype=torch.float32, device=self.device) if self.return_lse else None
        if self.launch is not None:
            on_device(self.device_index, self.launch, q, k, v, out, scale, lse)
        elif self.no_keys:
            out.zero_()
            if lse is not None:
                lse.fill_(float("-inf"))
        if given and (self.launch is not None or self.no_keys):
            mark_written(out)
        return (out, lse) if self.return_lse else out


def prepare_attention(q, k, v, scale, causal, enable_gqa, out, config, variant, window=None, num_sinks=0,
                      return_lse=False) -> AttentionPlan:
    """The plan of an attention call, after every check of it (nothing allocated or written before they
    pass): the variant and config chosen (or the given config checked), the kernel loaded and its launch
    packed for these tensors' strides."""
    checks.no_fake(q=q, k=k, v=v, out=out)  # before anything reads a pointer
    check_writable("out", out)  # as torch refuses an in-place write to an inference tensor: first
    scale = check_attention_args(q, k, v, scale, causal, enable_gqa, window, num_sinks)
    checks.flag("return_lse", return_lse)
    if out is not None:
        checks.output("out", out, shape=q.shape, dtype=q.dtype, device=q.device, inputs={"q": q, "k": k, "v": v})
    if variant is not None:
        spec = registry.for_call("attention", variant)
        if q.dtype not in spec.dtypes:
            raise TypeError(f"q: variant {spec.variant!r} takes {spec.dtypes}, got {q.dtype}")
        checks.config_type(config, spec.config_cls)  # the variant's own config class
    batch, heads = batch_heads_of(q)
    kv_heads = batch_heads_of(k)[1]
    m, n = q.shape[-2], k.shape[-2]
    empty = q.numel() == 0 or n == 0
    if empty:
        # No kernel runs, but the variant and config are checked as for a call of one row and one key.
        batch, m, n = max(batch, 1), max(m, 1), max(n, 1)
        if heads == 0:
            heads = kv_heads = max(kv_heads, 1)
    result = out if out is not None else torch.empty(q.shape, dtype=q.dtype, device=q.device)
    problem = AttentionProblem(batch, heads, m, n, q.shape[-1], q.dtype, bool(causal),
                               vector=_vector_width(q.dtype, q.shape[-1], (q, k, v, result)),
                               shared_limit=shared_memory_limit(q.device.index),
                               kv_heads=kv_heads,  # AttentionProblem makes H_kv == H 0
                               window=window, num_sinks=num_sinks, lse=bool(return_lse), sm=device_sm(q),
                               tma=tma_describes(q, k, v))
    if variant is None:
        spec = default_entry(problem, config)
        checks.config_type(config, _config_classes(problem.dtype))
    if config is None:
        # The variant's default may not run here (a named flash3_wgmma off sm_90 would launch an empty
        # kernel): checked, as a given config is.
        config = spec.choose_config(problem, q.device.index)
        reason = spec.why_unsupported(config, problem)
        if reason is not None:
            who = f"variant: {spec.variant!r}" if variant is not None else f"q: the default variant {spec.variant!r}"
            raise ValueError(f"{who} cannot run {problem}: {reason}")
    else:
        reason = spec.why_unsupported(config, problem)
        if reason is not None:
            raise ValueError(f"config: {config} cannot run {problem}: {reason}")
    if empty:
        return AttentionPlan(q, None, return_lse, no_keys=q.numel() > 0)
    launch = on_device(q.device.index, spec.prepare, config, problem, {"q": q, "k": k, "v": v, "scale": scale}, result)
    return AttentionPlan(q, launch, return_lse)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
              causal: bool = False, window: tuple | None = None, num_sinks: int = 0, enable_gqa: bool = False,
              return_lse: bool = False, out: torch.Tensor | None = None, config=None,
              variant: str | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``softmax(q @ k^T * scale) @ v`` per (batch, head), like ``torch.nn.functional.scaled_dot_product_attention``.

    q: (M, d), (H, M, d) or (B, H, M, d); k, v: (N, d), (H_kv, N, d) or (B, H_kv, N, d); float32, float16 or
    bfloat16, all alike. Grouped-query and multi-query attention: H_kv may be any divisor of H, and query
    head h reads key/value head h // (H // H_kv), without expanding k and v; ``enable_gqa`` is accepted for
    SDPA's signature and changes nothing (as in flash-attn, the shapes say it).
    ``scale`` defaults to 1/sqrt(d). ``causal=True`` lets query i see keys 0..i (top-left aligned, as torch's
    ``is_causal`` does also when M != N). ``window=(left, right)``: query i sees keys i - left .. i + right
    (a side None: unbounded), with causal too; key tiles outside every row's window are skipped, so the
    cost grows with the window, not with N. ``num_sinks``: with a window, keys 0 .. num_sinks - 1 are seen
    by every row as well (inside the causal limit). A row that sees no key (a window past the last key)
    is 0. ``return_lse=True`` returns ``(out, lse)``: lse, float32 of q's shape without the head dim, is each
    row's log-sum-exp of its scaled scores (natural log, -inf where a row sees no key), what a backward
    pass or a merge of attention over key blocks needs. float32 is FP32-accurate (never plain TF32): on
    tensor cores as three TF32 products per product (big x big + big x small + small x big, as torch's own
    float32 attention computes) where the grid fills the GPU, in FFMA elsewhere (``variant="fused_fp32"``
    pins FFMA everywhere; on tensor cores an infinite q, k or v element, or a finite one within 2^-12 of
    the float32 maximum, makes the rows it enters NaN, even where its probability is 0); float16/bfloat16 on
    tensor cores with FP32 softmax and accumulators. Inputs need stride 1 in the head dim; any other strides
    are fine. ``out`` (contiguous, q's shape and dtype) receives the result; it is left untouched on an error.

    Gradients (``cute_kernels.attention`` and ``torch.ops.cute_kernels.attention``) for q, k and v, and
    through lse with ``return_lse``: the FlashAttention-2 backward from the forward's lse, dK and
    dV summed over each group's query heads. Two calls give the same bits, except on the FFMA float32 kernels
    (float32 at head dims above 64, above 128 on sm_90; float16/bfloat16 above 128, run on float32 copies),
    whose dQ adds its tiles with atomics unless ``torch.use_deterministic_algorithms(True)`` is on.
    """
    t = type(q)
    if (t is _TENSOR and type(k) is t and type(v) is t and (out is None or type(out) is t) and window is None
            and type(num_sinks) is int and num_sinks == 0 and config is None and variant is None and type(causal) is bool
            and return_lse is False and type(enable_gqa) is bool and (scale is None or type(scale) is float)):
        # The commonest calls (three plain tensors, causal or not, a plain out or none, nothing else given),
        # their key written out (with out, six parts longer).
        try:
            key = (_PLAIN_CALL, q.dtype, q.device, q.shape, q.stride(), q.data_ptr() & 31, q.is_neg(),
                   k.dtype, k.device, k.shape, k.stride(), k.data_ptr() & 31, k.is_neg(),
                   v.dtype, v.device, v.shape, v.stride(), v.data_ptr() & 31, v.is_neg(), scale is None, causal,
                   enable_gqa)
            if out is not None:
                key += (out.dtype, out.device, out.shape, out.stride(), out.data_ptr() & 31, out.is_neg())
        except RuntimeError:  # a tensor without strides or storage (sparse, nested): the full path names it
            key = None
        if key is not None:
            return _PLANS.keyed(key, prepare_attention, q, k, v, scale, causal, enable_gqa, out, config, variant,
                                window, num_sinks, return_lse)(q, k, v, scale, out)
    # (window, num_sinks) as one tuple: a plan key holds a tuple's value, a bare int's type only. A value a
    # plan could mistake for a valid one (True == 1 hashes alike) gets none: an unhashable key, the full path.
    window_key = (window, num_sinks)
    if type(num_sinks) is not int or (window is not None and (type(window) is not tuple or any(
            type(side) is not int and side is not None for side in window))):
        window_key = [window]
    plan = _PLANS.plan((q, k, v, out, scale, causal, enable_gqa, config, variant, window_key, return_lse),
                       prepare_attention, q, k, v, scale, causal, enable_gqa, out, config, variant, window, num_sinks,
                       return_lse)
    return plan(q, k, v, scale, out)


_TENSOR = torch.Tensor
_PLAIN_CALL = object()  # the marker of attention's own key (CallPlans.keyed)


def _zoo_problems() -> list:
    return flash_zoo_problems() + fp32_zoo_problems()


def _hopper_takes(problem: AttentionProblem) -> bool:
    """Whether the Hopper kernel's default config runs ``problem`` (it takes every call it supports)."""
    hopper = registry.get("attention", "flash3_wgmma")
    return hopper.supports(hopper.default_config(problem), problem)


# The entry a dtype's calls run by default, and the faster one that takes a call where its rule says so
# (and a call whose config is of its class): float32 on 3xTF32 tensor cores where the grid fills the GPU,
# 16-bit on the Hopper kernel wherever it supports the call.
_FASTER = {"fused_fp32": ("flash2_tf32x3", tf32x3_is_default_for), "flash2_mma": ("flash3_wgmma", _hopper_takes)}


def _entries(dtype) -> tuple:
    """(the dtype's entry, its faster one or None, the faster one's rule or None)."""
    spec = registry.get("attention", DTYPE_VARIANTS[dtype])
    faster, takes = _FASTER.get(spec.variant, (None, None))
    return spec, (registry.get("attention", faster) if faster else None), takes


def _config_classes(dtype) -> tuple:
    """The config classes a call of ``dtype`` that names no variant takes (each picks its entry)."""
    spec, faster, _ = _entries(dtype)
    return tuple(s.config_cls for s in (spec, faster) if s is not None)


def default_entry(problem: AttentionProblem, config=None):
    """The entry a call that names no variant runs on: by dtype, and for 16-bit calls on sm_90 the Hopper
    kernel wherever it takes the call (any d up to 256 with 16-byte aligned rows, strides a TMA map describes; windows,
    sinks and the log-sum-exp included); for float32 the 3xTF32 tensor-core kernel where it takes the call
    and its grid fills the GPU (``tf32x3_is_default_for``), the FFMA kernel with its key splits elsewhere. A
    given ``config`` picks the entry of its class."""
    spec, faster, takes = _entries(problem.dtype)
    if faster is None:
        return spec
    if config is not None:
        return faster if isinstance(config, faster.config_cls) else spec
    return faster if takes(problem) else spec


def _zoo_route(problem: AttentionProblem):
    return default_entry(problem)  # the op's choice


registry.register_zoo("attention", _zoo_problems, _zoo_route, held_out_problems)
