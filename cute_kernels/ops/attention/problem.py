"""What both attention variants share: the problem, the launch parameters (the layout of attention.cu's
``attention::Params``), the access width and the argument checks."""

from __future__ import annotations

import ctypes
import dataclasses
import math

import torch

from ...runtime import checks, nvrtc
from ...runtime.bounded import remember
from ...runtime.device import SM90_SHARED_BYTES, current_stream_handle

SOURCE = "attention.cu"
HEAD_DIMS = (32, 64, 128, 256)  # compiled head dims of fused_fp32; d is zero-padded up to the next one
LOG2E = 1.4426950408889634
# The variant each dtype runs when the call names none.
DTYPE_VARIANTS = {torch.float32: "fused_fp32", torch.float16: "flash2_mma", torch.bfloat16: "flash2_mma"}


def check_window(window):
    """``window`` as a (left, right) tuple of ints >= 0 or None (an unbounded side), or None for no window
    ((None, None) is none)."""
    if window is None:
        return None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window: expected None or a (left, right) pair of ints >= 0 or None, got {window!r}")
    sides = []
    for name, side in zip(("left", "right"), window):
        if side is None:
            sides.append(None)
            continue
        # An int, a NumPy integer, or under torch.compile a symbolic int (checked by its guards).
        side, given = checks.integer(side), side
        if side is None:
            raise TypeError(f"window: the {name} side must be an int >= 0 or None, got {given!r}")
        if side < 0:
            raise ValueError(f"window: the {name} side must be >= 0 (keys a query sees on that side), got {side}")
        sides.append(side if isinstance(side, torch.SymInt) else min(int(side), _FAR))
    return None if sides == [None, None] else tuple(sides)


# A window side or sink count past every row count means the same as this one, which fits the custom op's
# int64 schema (a larger Python int does not cross it).
_FAR = 2**62


def check_num_sinks(num_sinks) -> int:
    num_sinks, given = checks.integer(num_sinks), num_sinks
    if num_sinks is None:
        raise TypeError(f"num_sinks: expected an int >= 0, got {given!r}")
    if num_sinks < 0:
        raise ValueError(f"num_sinks: expected an int >= 0 (keys every query sees), got {num_sinks}")
    return num_sinks if isinstance(num_sinks, torch.SymInt) else min(int(num_sinks), _FAR)


def row_keys(problem: "AttentionProblem", row: int) -> tuple[int, int, int]:
    """(lo, hi, sinks) of a windowed problem's row, as attention.cu's RowKeys: the row sees keys lo .. hi
    (none when hi < lo) and 0 .. sinks - 1."""
    left, right = problem.window
    hi = problem.n - 1 if right is None else min(problem.n - 1, row + right)
    sinks = min(problem.num_sinks, problem.n)
    if problem.causal:
        hi, sinks = min(hi, row), min(sinks, row + 1)
    return (0 if left is None else max(0, row - left)), hi, sinks


def window_key_tiles(problem: "AttentionProblem", block_m: int, block_n: int) -> list[int]:
    """The key tiles each query tile of a windowed problem reads, as attention.cu's window_key_tiles:
    the sink tiles, then the window's tiles past them, over the tile's real rows."""
    counts = []
    for m0 in range(0, problem.m, block_m):
        first, last = m0, min(m0 + block_m, problem.m) - 1
        lo, _, _ = row_keys(problem, first)
        _, hi, sink_end = row_keys(problem, last)
        sink_tiles = -(-sink_end // block_n)
        window_first = max(min(lo, problem.n) // block_n, sink_tiles)
        window_end = hi // block_n + 1 if hi >= lo else 0
        counts.append(sink_tiles + max(0, window_end - window_first))
    return counts


def padded_head_dim(d: int, choices=HEAD_DIMS) -> int:
    for h in choices:
        if d <= h:
            return h
    raise ValueError(f"head dim {d} is larger than {choices[-1]}")


@dataclasses.dataclass(frozen=True)
class AttentionProblem:
    """Everything a config and a compile key may depend on. ``vector``: elements per global access that
    every row start allows (16 bytes when d and the strides allow it, else 1); 0 means the widest.
    ``kv_heads``: the heads of k and v when fewer than q's (grouped-query or multi-query attention).
    ``window``: (left, right), query i sees keys i - left .. i + right (a side None: unbounded), and
    ``num_sinks``: keys 0 .. num_sinks - 1 are seen by every row (within causal); None when there is no
    window, which (None, None) is, and then no sinks (every key is seen anyway)."""

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
    window: tuple | None = None
    num_sinks: int = 0
    lse: bool = False  # the kernel also writes each row's log-sum-exp (return_lse)
    sm: int = 90  # compute capability of the device (major * 10 + minor): flash3_wgmma needs exactly 90
    # Whether TMA maps describe q, k and v: a 16-byte aligned base and every stride of a dim with more than one
    # element a positive multiple of 16 bytes (a broadcast operand, stride 0, is not); flash3_wgmma needs it.
    tma: bool = True

    def __post_init__(self) -> None:
        kv = self.kv_heads
        if type(kv) is not int or kv < 0 or (kv and self.heads % kv):
            raise ValueError(f"AttentionProblem.kv_heads: expected 0 or a divisor of heads={self.heads}, got {kv!r}")
        if kv == self.heads:  # as many as q's: the same problem as 0 (one key/value head per query head)
            object.__setattr__(self, "kv_heads", 0)
        window = check_window(self.window)
        object.__setattr__(self, "window", window)
        object.__setattr__(self, "num_sinks", check_num_sinks(self.num_sinks) if window is not None else 0)

    @property
    def windowed(self) -> bool:
        return self.window is not None

    @property
    def template_flags(self) -> str:
        """The kWindow and kLse template arguments a kernel name ends with ("" for neither: the defaults)."""
        if self.lse:
            return f", {'true' if self.windowed else 'false'}, true"
        return ", true" if self.windowed else ""

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
        + [("lse", ctypes.c_void_p)]
        + [(name, ctypes.c_int32) for name in ("heads", "m", "n", "d", "splits", "tiles_per_split")]
        + [("scale_log2", ctypes.c_float), ("causal", ctypes.c_int32), ("kv_group", ctypes.c_int32)]
        + [(name, ctypes.c_int32) for name in ("window_left", "window_right", "num_sinks")]
    )


PARAMS_BYTES = 208  # attention.cu static_asserts the same size


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
    # Sides clamped to M and N (a wider side reaches past every row's keys anyway): the kernels' row bounds
    # stay in 32-bit arithmetic (attention.cu RowKeys).
    left, right = problem.window or (None, None)
    p.window_left = problem.m if left is None else min(left, problem.m)
    p.window_right = problem.n if right is None else min(right, problem.n)
    p.num_sinks = min(problem.num_sinks, problem.n)
    return p


class AttentionLaunch:
    """A variant's launch for every call of one structure: ``launch(q, k, v, out, scale, lse=None)`` writes
    this call's pointers and scale into the packed ``Params`` and enqueues it on torch's current stream of the
    tensors' device (``lse``: a float32 (batch * heads, M) tensor the kernel writes each row's log-sum-exp
    into, or None). ``workspace(params, stream)``: a variant's per-stream buffers (the key-split partials),
    set into the parameters before each launch, returned so the launch holds them until it is enqueued; None
    when the launch has none."""

    def __init__(self, packed, params: Params, d: int, device_index: int, workspace=None, writes_lse=False):
        self.packed, self.params, self.device_index, self.workspace = packed, params, device_index, workspace
        self.default_scale = 1.0 / math.sqrt(d)
        self.writes_lse = writes_lse  # a kLse kernel: every launch needs an lse tensor to write

    def __call__(self, q, k, v, out, scale, lse=None) -> None:
        if self.writes_lse and lse is None:
            raise ValueError("lse: this launch's kernel writes each row's log-sum-exp; pass the tensor for it")
        p = self.params
        stream = current_stream_handle(self.device_index)
        with self.packed.lock:
            self.write_pointers(p, q, k, v, out, lse)
            p.scale_log2 = (self.default_scale if scale is None else scale) * LOG2E
            held = self.workspace(p, stream) if self.workspace is not None else None  # the buffers, until enqueued
            self.packed.launch(stream)
            del held

    def write_pointers(self, p, q, k, v, out, lse) -> None:
        """This call's tensors into the packed parameters (a variant with other parameters overrides it)."""
        p.q, p.k, p.v, p.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
        p.lse = 0 if lse is None else lse.data_ptr()


def launch_with(prepare):
    """A variant's registry launcher from its ``prepare`` (one launch on the inputs dict)."""
    def launch(config, problem: AttentionProblem, inputs: dict, out: torch.Tensor) -> torch.Tensor:
        lse = torch.empty(out.shape[:-1], dtype=torch.float32, device=out.device) if problem.lse else None
        prepare(config, problem, inputs, out)(inputs["q"], inputs["k"], inputs["v"], out, inputs.get("scale"), lse)
        return out

    return launch


def query_tile_launch(plans: dict, key: tuple, name_expression, shared_bytes: int, config, problem: AttentionProblem,
                      inputs: dict, out: torch.Tensor) -> AttentionLaunch:
    """The launch of a kernel with one CTA per (query tile of ``config.block_m`` rows, batch*head) and
    ``config.threads`` threads (flash2_mma's kernel, for 16-bit and float tiles): loaded once per ``key`` and
    device into ``plans`` (``name_expression()`` names it in attention.cu), the grid sized, the parameters
    packed for the strides of ``inputs`` ({"q", "k", "v"}) and ``out``."""
    device = inputs["q"].device.index
    kernel = plans.get(key + (device,))
    if kernel is None:
        kernel = plans[key + (device,)] = nvrtc.kernel_for(SOURCE, name_expression(), device)
    params = make_params(problem, inputs, out, _scale_of(problem, inputs))
    ctas = problem.batch_heads * -(-problem.m // config.block_m)
    packed = nvrtc.PackedLaunch(kernel, (ctas, 1, 1), (config.threads, 1, 1), (params,), shared_mem=shared_bytes)
    return AttentionLaunch(packed, params, problem.d, device, writes_lse=problem.lse)


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


def check_attention_args(q, k, v, scale, causal, enable_gqa=False, window=None, num_sinks=0):
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
        if (kv_heads == 0 and heads) or (kv_heads and heads % kv_heads):  # no heads at all: an empty result
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
    check_window(window)
    check_num_sinks(num_sinks)
    return scale
