"""What both attention variants share: the problem, the launch parameters (the layout of attention.cu's
``attention::Params``), the access width and the argument checks."""

from __future__ import annotations

import ctypes
import dataclasses
import math

import torch

from ...runtime import checks
from ...runtime.bounded import remember
from ...runtime.device import SM90_SHARED_BYTES, current_stream_handle

SOURCE = "attention.cu"
HEAD_DIMS = (32, 64, 128, 256)  # compiled head dims of fused_fp32; d is zero-padded up to the next one
LOG2E = 1.4426950408889634
# The variant each dtype runs when the call names none.
DTYPE_VARIANTS = {torch.float32: "fused_fp32", torch.float16: "flash2_mma", torch.bfloat16: "flash2_mma"}


def padded_head_dim(d: int, choices=HEAD_DIMS) -> int:
    for h in choices:
        if d <= h:
            return h
    raise ValueError(f"head dim {d} is larger than {choices[-1]}")


@dataclasses.dataclass(frozen=True)
class AttentionProblem:
    """Everything a config and a compile key may depend on. ``vector``: elements per global access that
    every row start allows (16 bytes when d and the strides allow it, else 1); 0 means the widest.
    ``kv_heads``: the heads of k and v when fewer than q's (grouped-query or multi-query attention)."""

    batch: int
    heads: int
    m: int
    n: int
    d: int
    dtype: torch.dtype = torch.float32
    causal: bool = False
    vector: int = 0
    shared_limit: int = SM90_SHARED_BYTES  # dynamic shared memory a CTA may use on the target device
    kv_heads: int = 0  # key/value heads (grouped-query attention: a divisor of heads); 0: as many as heads

    def __post_init__(self) -> None:
        kv = self.kv_heads
        if type(kv) is not int or kv < 0 or (kv and self.heads % kv):
            raise ValueError(f"AttentionProblem.kv_heads: expected 0 or a divisor of heads={self.heads}, got {kv!r}")
        if kv == self.heads:  # as many as q's: the same problem as 0 (one key/value head per query head)
            object.__setattr__(self, "kv_heads", 0)

    @property
    def vector_width(self) -> int:
        widest = 16 // self.dtype.itemsize
        return self.vector or (widest if self.d % widest == 0 else 1)

    @property
    def head_dim(self) -> int:
        return padded_head_dim(self.d)

    @property
    def batch_heads(self) -> int:
        return self.batch * self.heads

    @property
    def kv_group(self) -> int:
        """Query heads per key/value head (1 without grouped-query attention)."""
        return self.heads // (self.kv_heads or self.heads)


def _largest_fitting(preferred, candidates, why_unsupported, problem):
    """``preferred`` when it runs on the problem (and device), else the supported candidate with the
    largest tile: a GPU with less shared memory than the H200 still gets a working default."""
    if why_unsupported(preferred, problem) is None:
        return preferred
    fitting = [c for c in candidates if why_unsupported(c, problem) is None]
    if not fitting:
        raise ValueError(f"no {type(preferred).__name__} runs {problem}")
    return max(fitting, key=lambda c: (c.block_m * c.block_n, c.block_m))


# ---- the launch parameters: one struct, the layout of attention::Params ---------------------------------


class Params(ctypes.Structure):
    _fields_ = (
        [("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("o", ctypes.c_void_p)]
        + [(f"{t}_{s}_stride", ctypes.c_int64) for t in "qkvo" for s in ("batch", "head", "row")]
        + [("partial_o", ctypes.c_void_p), ("partial_lse", ctypes.c_void_p), ("arrivals", ctypes.c_void_p)]
        + [(name, ctypes.c_int32) for name in ("heads", "m", "n", "d", "splits", "tiles_per_split")]
        + [("scale_log2", ctypes.c_float), ("causal", ctypes.c_int32), ("kv_group", ctypes.c_int32)]
    )


PARAMS_BYTES = 192  # attention.cu static_asserts the same size


def _strides4(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, head, row) strides of a 2-D (rows, d), 3-D (H, rows, d) or 4-D (B, H, rows, d) tensor, in
    elements."""
    if t.dim() == 2:
        return (0, 0, t.stride(0))
    if t.dim() == 3:
        return (0, t.stride(0), t.stride(1))
    return (t.stride(0), t.stride(1), t.stride(2))


def batch_heads_of(q: torch.Tensor) -> tuple[int, int]:
    """(batch, heads) of a 2-D, 3-D or 4-D attention operand."""
    return (1, 1) if q.dim() == 2 else (1, q.shape[0]) if q.dim() == 3 else (q.shape[0], q.shape[1])


def make_params(problem: AttentionProblem, inputs: dict, out: torch.Tensor, scale: float) -> Params:
    """The launch parameters of these tensors: built once per plan (``AttentionLaunch`` then rewrites only
    the pointers and the scale per call)."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    p = Params()
    for name, t in (("q", q), ("k", k), ("v", v), ("o", out)):
        setattr(p, name, t.data_ptr())
        for suffix, stride in zip(("batch", "head", "row"), _strides4(t)):
            setattr(p, f"{name}_{suffix}_stride", stride)
    p.heads, p.m, p.n, p.d = problem.heads, problem.m, problem.n, problem.d
    p.splits, p.tiles_per_split = 1, 0
    p.scale_log2 = scale * LOG2E
    p.causal = int(problem.causal)
    p.kv_group = problem.kv_group
    return p


class AttentionLaunch:
    """A variant's launch for every call of one structure: ``launch(q, k, v, out, scale)`` writes this
    call's pointers and scale into the packed ``Params`` and enqueues it on torch's current stream of the
    tensors' device. ``workspace(params, stream)``: a variant's per-stream buffers (the key-split partials),
    set into the parameters before each launch; None when the launch has none."""

    def __init__(self, packed, params: Params, d: int, device_index: int, workspace=None):
        self.packed, self.params, self.device_index, self.workspace = packed, params, device_index, workspace
        self.default_scale = 1.0 / math.sqrt(d)

    def __call__(self, q, k, v, out, scale) -> None:
        p = self.params
        stream = current_stream_handle(self.device_index)
        with self.packed.lock:
            p.q, p.k, p.v, p.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
            p.scale_log2 = (self.default_scale if scale is None else scale) * LOG2E
            if self.workspace is not None:
                self.workspace(p, stream)
            self.packed.launch(stream)


def launch_with(prepare):
    """A variant's registry launcher from its ``prepare`` (one launch on the inputs dict)."""
    def launch(config, problem: AttentionProblem, inputs: dict, out: torch.Tensor) -> torch.Tensor:
        prepare(config, problem, inputs, out)(inputs["q"], inputs["k"], inputs["v"], out, inputs.get("scale"))
        return out

    return launch


def _scale_of(problem: AttentionProblem, inputs: dict) -> float:
    scale = inputs.get("scale")
    return 1.0 / math.sqrt(problem.d) if scale is None else float(scale)


# ---- the argument checks ------------------------------------------------------------------------------


def _vector_width(dtype: torch.dtype, d: int, tensors) -> int:
    """16-byte accesses when d and every row start allow them (pointer and batch/head/row strides), else 1."""
    widest = 16 // dtype.itemsize
    if d % widest:
        return 1
    for t in tensors:
        if checks.alignment_bytes(t) < 16 or any(s % widest for s in _strides4(t)):
            return 1
    return widest


# Python float -> the scale, for the floats that passed before (every call checks its scale; they are the
# same few values call after call). Caller-controlled values: bounded.
_checked_scales: dict[float, float] = {}


def _check_scale(scale):
    """The scale as a float (None: 1/sqrt(d), made later), decided on the value the kernels use: they
    scale the scores by ``scale * log2(e)`` in float32 (``Params.scale_log2``), which must be finite."""
    if scale is None:
        return None
    if type(scale) is float:
        known = _checked_scales.get(scale)
        if known is not None:
            return known
    scale = checks.real_scalar("scale", scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite number, got {scale}")
    if math.isinf(checks.round_float32(scale * LOG2E)):
        raise ValueError(f"scale: {scale!r} cannot be used without overflow: the kernels scale the scores by "
                         f"scale * log2(e) in float32, so |scale| <= {checks.FLOAT32_MAX / LOG2E:.6g}")
    if type(scale) is float and scale:  # zeros stay out: 0.0 == -0.0 would share an entry
        remember(_checked_scales, scale, scale)
    return scale


def check_attention_args(q, k, v, scale, causal, enable_gqa=False):
    for name, t in (("q", q), ("k", k), ("v", v)):
        checks.cuda_tensor(name, t)
        checks.dtype_in(name, t, DTYPE_VARIANTS)
    checks.same_device(q=q, k=k, v=v)
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: expected dtype {q.dtype} (like q), got {t.dtype}")
    if q.dim() not in (2, 3, 4):
        raise ValueError(f"q: expected a 2-D (M, d), 3-D (H, M, d) or 4-D (B, H, M, d) tensor, got shape "
                         f"{tuple(q.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.dim() != q.dim():
            raise ValueError(f"{name}: expected {q.dim()}-D like q, got shape {tuple(t.shape)}")
    if q.dim() == 4 and k.shape[0] != q.shape[0]:
        raise ValueError(f"k: expected batch {q.shape[0]} (like q), got shape {tuple(k.shape)}")
    if q.dim() > 2:
        # Grouped-query attention: query head h reads key/value head h // (H_q // H_kv).
        heads, kv_heads = q.shape[-3], k.shape[-3]
        if kv_heads == 0 or heads % kv_heads:
            raise ValueError(f"k: expected a number of heads that divides q's {heads} (grouped-query attention), "
                             f"got {kv_heads} (shape {tuple(k.shape)})")
    if v.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"v: expected batch/head dims {tuple(k.shape[:-2])} (like k), got {tuple(v.shape[:-2])}")
    d = q.shape[-1]
    if k.shape[-1] != d:
        raise ValueError(f"k: expected head dim {d} (like q), got {k.shape[-1]}")
    if v.shape[-1] != d:
        raise ValueError(f"v: expected head dim {d} (like q), got {v.shape[-1]}")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v: expected {k.shape[-2]} rows (like k), got {v.shape[-2]}")
    if k.shape[-2] == 0:
        raise ValueError("k: expected at least one key (N >= 1), got N=0: softmax over no keys is undefined")
    if not 1 <= d <= HEAD_DIMS[-1]:
        raise ValueError(f"q: expected a head dim d in 1..{HEAD_DIMS[-1]}, got {d}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[-1] > 1 and t.stride(-1) != 1 and t.numel():
            raise ValueError(f"{name}: expected stride 1 in the last (head) dim, got strides {tuple(t.stride())}")
        span = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1
        # Row counts go through 32-bit arithmetic in the kernel with a tile added (m0 + kBlockM): keep a margin.
        if t.shape[-2] > 2**31 - 1024 or span >= 2**62:
            raise ValueError(f"{name}: too large ({tuple(t.shape)}) for the kernel's indexing")
    scale = _check_scale(scale)
    checks.flag("causal", causal)
    checks.flag("enable_gqa", enable_gqa)
    return scale
