"""The attention backward (FlashAttention-2's math; docs/notes/attention-backward-plan.md):
``attention_backward(q, k, v, out, lse, grad_out, ...)`` gives (dq, dk, dv) from the forward's output and
each row's log-sum-exp. float32 runs on sm_90 as three bf16 planes of each operand on attention_sm90.cu's
wgmma kernels up to a head dim of 128 (``SM90_FP32_PLANES``), else the mma.sync kernels
(``attention_bwd_dkdv_mma``, ``attention_bwd_dq_mma``) instantiated for float, every product as three TF32
products (FP32-accurate, as the forward's flash2_tf32x3), on sm_80 and newer up to a head dim of 64
(``fp32_tensor_core_why_not``), and attention.cu's FFMA kernels (``attention_bwd_dkdv_fp32``,
``attention_bwd_dq_fp32``) elsewhere; float16/bfloat16 on sm_90 attention_sm90.cu's wgmma kernels
(``backward_dkdv_kernel``, ``backward_dq_kernel``) where they apply (``sm90_backward_why_not``), elsewhere
attention.cu's mma.sync kernels (``attention_bwd_dkdv_mma``, ``attention_bwd_dq_mma``) up to a head dim of
128, and float32 copies through the FP32 kernels past it. D = rowsum(dO * O) - dlse comes first, from
``attention_bwd_delta``."""

from __future__ import annotations

import ctypes
import math
from typing import NamedTuple

import torch

from ...runtime import checks, nvrtc, tma
from ...runtime.device import (SM90_SHARED_BYTES, capability, current_stream_handle, on_device,
                               shared_memory_limit, sm_count)
from .problem import SOURCE, _strides4, _vector_width, batch_heads_of, check_attention_args, padded_head_dim

__all__ = ["BwdParams", "attention_backward", "runs_on_bf16_planes", "BWD_FP32_SHAPES", "BWD_FP32_THREADS", "bwd_fp32_shapes",
           "bwd_fp32_shared_bytes", "bwd_fp32_name_expressions", "bwd_fp32_atomic_name_expression",
           "BWD_MMA_SHAPES", "BWD_MMA_NARROW_SHAPE", "bwd_mma_shapes", "BWD_MMA_THREADS", "BWD_MMA_HEAD_DIMS",
           "bwd_mma_shared_bytes", "bwd_mma_name_expressions", "DeltaParams", "delta_name_expression",
           "Sm90BwdParams", "Sm90BwdTile", "SM90_BWD_HEAD_DIMS", "SM90_BWD_TILES", "sm90_bwd_shared_bytes", "sm90_bwd_tile",
           "sm90_bwd_name_expressions", "sm90_backward_why_not", "precompile_backward", "BWD_TF32X3_SHAPES",
           "bwd_tf32x3_name_expressions", "fp32_tensor_core_why_not"]

# CUDA's largest grid.y: the backward's tiles of one (batch, head) run along it.
MAX_GRID_Y = 65535
BWD_FP32_THREADS = 256  # attention.cu's kBwdFp32Threads


class BwdParams(ctypes.Structure):
    """attention.cu's ``BwdParams``, field by field."""

    _fields_ = (
        [(name, ctypes.c_void_p) for name in ("q", "k", "v", "dout", "lse", "delta", "dq", "dk", "dv")]
        + [(f"{t}_{s}_stride", ctypes.c_int64) for t in ("q", "k", "v", "do", "dq", "dk", "dv")
           for s in ("batch", "head", "row")]
        + [(name, ctypes.c_int32) for name in ("heads", "m", "n", "d")]
        + [("scale", ctypes.c_float)]
        + [(name, ctypes.c_int32) for name in ("causal", "kv_group", "window_left", "window_right", "num_sinks")]
    )


class DeltaParams(ctypes.Structure):
    """attention.cu's ``DeltaParams``, field by field."""

    _fields_ = (
        [(name, ctypes.c_void_p) for name in ("out", "dout", "grad_lse", "delta", "lse", "stage_rows")]
        + [(f"{t}_{s}_stride", ctypes.c_int64) for t in ("o", "do") for s in ("batch", "head", "row")]
        + [("rows", ctypes.c_int64), ("rows_pitch", ctypes.c_int64)]
        + [(name, ctypes.c_int32) for name in ("heads", "m", "d")]
    )


DELTA_THREADS = 256  # attention.cu's attention_bwd_delta: kLanes lanes a row, 256 / kLanes rows a CTA
_DELTA_TYPE = {torch.float32: "float", torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}


def delta_name_expression(dtype: torch.dtype, lanes: int = 32, vector: int = 1) -> str:
    return f"attention::attention_bwd_delta<{_DELTA_TYPE[dtype]}, {lanes}, {vector}>"


def delta_shape(out: torch.Tensor, grad_out: torch.Tensor) -> tuple[int, int]:
    """(lanes a row, elements a load) of the D kernel for O and dO as they lie: 16-byte loads where both
    tensors' bases and strides are whole 16-byte vectors and the head dim is a whole number of them, with as
    many lanes as a row has vectors (a power of two, at most a warp); else element loads, a warp a row."""
    vector = 16 // out.element_size()
    d = out.shape[-1]
    aligned = all(t.data_ptr() % 16 == 0 and all(s % vector == 0 for s in _strides4(t)) for t in (out, grad_out))
    if not aligned or d % vector:
        return 32, 1
    return min(32, 1 << (d // vector - 1).bit_length()), vector


def _delta(out, grad_out, grad_lse, batch: int, heads: int, device: int, stream: int, lse=None,
           stage_rows=None) -> torch.Tensor:
    """D = rowsum(dO * O) - dlse in float32, (B, H, M) contiguous, by attention.cu's attention_bwd_delta; with
    ``stage_rows`` (:func:`_stage_rows`) it also writes there each head's lse2 (from ``lse``) and D rows."""
    m, d = out.shape[-2], out.shape[-1]
    delta = torch.empty(batch * heads * m, dtype=torch.float32, device=out.device)
    p = DeltaParams()
    p.out, p.dout, p.delta = out.data_ptr(), grad_out.data_ptr(), delta.data_ptr()
    p.grad_lse = grad_lse.data_ptr() if grad_lse is not None else None
    if stage_rows is not None:
        p.lse, p.stage_rows, p.rows_pitch = lse.data_ptr(), stage_rows.data_ptr(), stage_rows.shape[-1]
    for name, t in (("o", out), ("do", grad_out)):
        for suffix, stride in zip(("batch", "head", "row"), _strides4(t)):
            setattr(p, f"{name}_{suffix}_stride", stride)
    p.rows, p.heads, p.m, p.d = batch * heads * m, heads, m, d
    lanes, vector = delta_shape(out, grad_out)
    grid = (-(-p.rows // (DELTA_THREADS // lanes)), 1, 1)
    packed = nvrtc.PackedLaunch(nvrtc.kernel_for(SOURCE, delta_name_expression(out.dtype, lanes, vector), device),
                                grid, (DELTA_THREADS, 1, 1), (p,))
    with packed.lock:
        packed.launch(stream)
    return delta


def _stage_rows(batch_heads: int, m: int, device) -> torch.Tensor:
    """(batch * heads, 2, M rounded up to 4) float32: where attention_bwd_delta writes each head's lse2 row
    and D row for the Hopper dK/dV kernel's TMA loads (whose strides must be multiples of 16 bytes)."""
    return torch.empty((batch_heads, 2, -(-m // 4) * 4), dtype=torch.float32, device=device)


# The FP32 kernels' shapes per head dim, (kKept, kStream, kStages) for the dK/dV and the dQ kernel (attention.cu's
# BwdFp32Tile): a CTA keeps kKept rows of one side and streams kStream-row tiles of the other through kStages
# buffers. Two stages where shared memory allows, except the d <= 64 dQ kernel, whose single stage lets two
# CTAs share an SM; d = 256 keeps 32 keys (dK and dV are two 32 x 256 accumulators). ptxas -v: no spills.
BWD_FP32_SHAPES = {32: ((64, 64, 2), (64, 64, 1)), 64: ((64, 64, 2), (64, 64, 1)),
                   128: ((64, 64, 1), (64, 64, 2)), 256: ((32, 64, 1), (64, 32, 1))}
# Where a shape passes the block's shared memory (sm_80's 163 KB, sm_86/89/120's 99 KB): the same kept tile
# with 32 streamed rows in one buffer, then 32 x 32.
_BWD_FP32_FALLBACKS = ((None, 32, 1), (32, 32, 1))


def bwd_fp32_shared_bytes(head_dim: int, keys_kept: bool, shape: tuple[int, int, int], atomic_dq: bool = False
                          ) -> int:
    """attention.cu ``BwdFp32Tile::kSmemBytes``: the kept tiles, kStages buffers of the streamed ones (pitch d + 4),
    then dK/dV's sP and sdS (pitch keys + 8) and its streamed rows' lse and D, or dQ's sdS^T (pitch rows + 4);
    with ``atomic_dq`` (dK/dV only) a dS^T of kept x (streamed + 4)."""
    kept, stream, stages = shape
    pitch = head_dim + 4
    floats = 2 * kept * pitch + 2 * stages * stream * pitch
    floats += 2 * stream * (kept + 8) + 2 * stages * stream if keys_kept else stream * (kept + 4)
    if atomic_dq:
        floats += kept * (stream + 4)
    return 4 * floats


def bwd_fp32_shapes(head_dim: int, smem_limit: int | None = None
                    ) -> tuple[tuple[int, int, int], tuple[int, int, int]] | None:
    """(kKept, kStream, kStages) of the dK/dV and the dQ kernel: the first of the preferred shape and its
    fallbacks that fits ``smem_limit`` (bytes per block, when given); None if none does."""
    shapes = []
    for keys_kept, preferred in zip((True, False), BWD_FP32_SHAPES[head_dim]):
        candidates = [preferred] + [(kept or preferred[0], stream, stages)
                                    for kept, stream, stages in _BWD_FP32_FALLBACKS]
        fits = [s for s in candidates
                if smem_limit is None or bwd_fp32_shared_bytes(head_dim, keys_kept, s) <= smem_limit]
        if not fits:
            return None
        shapes.append(fits[0])
    return tuple(shapes)


def _fp32_name(kind: str, head_dim: int, shape: tuple[int, int, int], vector: int, windowed: bool,
               atomic_dq: bool | None = None) -> str:
    """attention.cu's ``attention_bwd_<kind>_fp32`` instantiation (``atomic_dq``: the dK/dV kernel's last flag)."""
    kept, stream, stages = shape
    flags = f"{vector}, {'true' if windowed else 'false'}"
    if atomic_dq is not None:
        flags += ", true" if atomic_dq else ", false"
    return f"attention::attention_bwd_{kind}_fp32<{head_dim}, {kept}, {stream}, {stages}, {flags}>"


def _fp32_atomic_fits(head_dim: int, dkdv_shape: tuple[int, int, int], smem_limit: int | None) -> bool:
    """Whether the atomic-dQ dK/dV kernel (the two-kernel path's dK/dV shape plus a dS^T) fits the block."""
    limit = SM90_SHARED_BYTES if smem_limit is None else smem_limit
    return bwd_fp32_shared_bytes(head_dim, True, dkdv_shape, atomic_dq=True) <= limit


def bwd_fp32_name_expressions(head_dim: int, vector: int, windowed: bool, smem_limit: int | None = None
                              ) -> tuple[str, str]:
    """The FP32 dK/dV and dQ kernels: ``vector`` 4 (16-byte copies) or 1; shapes as ``bwd_fp32_shapes``."""
    dkdv, dq = bwd_fp32_shapes(head_dim, smem_limit)
    return (_fp32_name("dkdv", head_dim, dkdv, vector, windowed, atomic_dq=False),
            _fp32_name("dq", head_dim, dq, vector, windowed))


def bwd_fp32_atomic_name_expression(head_dim: int, vector: int, windowed: bool, smem_limit: int | None = None
                                    ) -> str | None:
    """The FP32 dK/dV kernel that also adds dQ by atomics (FlashAttention-2's five products; dq not bitwise
    repeatable), in the dK/dV shape of ``bwd_fp32_shapes``; None where its extra dS^T does not fit."""
    shapes = bwd_fp32_shapes(head_dim, smem_limit)
    if shapes is None or not _fp32_atomic_fits(head_dim, shapes[0], smem_limit):
        return None
    return _fp32_name("dkdv", head_dim, shapes[0], vector, windowed, atomic_dq=True)


# The 16-bit kernels' tile shapes per head dim, (kM16, kStream) for the dK/dV and the dQ kernel: a CTA keeps
# 64 * kM16 rows of one side and streams kStream-row tiles of the other (attention.cu's BwdMmaTile says why
# kM16 = 2 where the registers allow it; ptxas -v chose these as the largest without spills, for sm_90a and
# sm_80). The windowed dK/dV kernel (its per-entry window bounds cost registers) keeps kM16 = 1.
BWD_MMA_SHAPES = {32: ((2, 32), (2, 32)), 64: ((2, 32), (2, 32)), 128: ((1, 32), (2, 32))}
BWD_MMA_WINDOWED_DKDV_SHAPE = (1, 32)


# The shape for GPUs with 99 KB of shared memory per block (sm_86/89/120): 70 KB at d = 128, where the dQ
# kernel's (2, 32) needs 103 KB.
BWD_MMA_NARROW_SHAPE = (1, 32)


def bwd_mma_shapes(head_dim: int, windowed: bool, smem_limit: int | None = None
                   ) -> tuple[tuple[int, int], tuple[int, int]]:
    """(kM16, kStream) of the dK/dV and the dQ kernel; one whose shared memory passes ``smem_limit`` (bytes
    per block, when given) is ``BWD_MMA_NARROW_SHAPE``."""
    dkdv, dq = BWD_MMA_SHAPES[head_dim]
    shapes = ((BWD_MMA_WINDOWED_DKDV_SHAPE if windowed else dkdv), dq)
    if smem_limit is None:
        return shapes
    return tuple(shape if bwd_mma_shared_bytes(head_dim, shape) <= smem_limit else BWD_MMA_NARROW_SHAPE
                 for shape in shapes)


BWD_MMA_THREADS = 128  # attention.cu's kBwdMmaThreads
BWD_MMA_HEAD_DIMS = tuple(BWD_MMA_SHAPES)  # the 16-bit kernels' compiled head dims; larger d runs in float32
_CUDA_TYPE = {torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}


def bwd_mma_shared_bytes(head_dim: int, shape: tuple[int, int], dtype: torch.dtype = torch.float16) -> int:
    """attention.cu ``BwdMmaTile::kSmemBytes`` of a kernel of ``shape`` (kM16, kStream): two kept tiles, two
    buffers of two streamed tiles (16-bit: pitch d + 8; float: d + 12), two buffers of kStream lse and kStream
    D floats."""
    m16, stream = shape
    pitch = head_dim + (12 if dtype == torch.float32 else 8)
    return (2 * 64 * m16 + 4 * stream) * pitch * dtype.itemsize + 4 * stream * 4


def bwd_mma_name_expressions(dtype: torch.dtype, head_dim: int, vector: int, windowed: bool,
                             smem_limit: int | None = None) -> tuple[str, str]:
    """The 16-bit dK/dV and dQ kernels: ``vector`` 8 (16-byte copies) or 1 (element by element); shapes as
    ``bwd_mma_shapes``."""
    flags = f"{vector}, {'true' if windowed else 'false'}"
    return tuple(f"attention::attention_bwd_{kind}_mma<{_CUDA_TYPE[dtype]}, {head_dim}, {m16}, {stream}, {flags}>"
                 for kind, (m16, stream) in zip(("dkdv", "dq"), bwd_mma_shapes(head_dim, windowed, smem_limit)))


# float32 on the mma.sync kernels (3xTF32): (kM16, kStream) of the dK/dV and the dQ kernel per head dim. Two
# kept row blocks per warp spill everywhere (their accumulators and each product's partial sums). At d = 128
# the dK/dV kernel spills 12-52 bytes even with one, and on the H200 that backward took 1.4x the FFMA
# kernels' time (B2 H16 S2048: 7651 against 5467 us), where at d = 64 it takes 0.88x (2693 against 3063):
# so d = 128 stays on FFMA (docs/notes/attention-backward-plan.md, "3xTF32").
BWD_TF32X3_SHAPES = {32: ((1, 32), (1, 32)), 64: ((1, 32), (1, 32))}
# Set False to run float32 backwards on the FFMA kernels everywhere (the probe's comparison).
FP32_TENSOR_CORES = True


def bwd_tf32x3_name_expressions(head_dim: int, vector: int, windowed: bool) -> tuple[str, str]:
    """The float32 dK/dV and dQ mma.sync kernels: ``vector`` 4 (16-byte copies) or 1."""
    flags = f"{vector}, {'true' if windowed else 'false'}"
    return tuple(f"attention::attention_bwd_{kind}_mma<float, {head_dim}, {m16}, {stream}, {flags}>"
                 for kind, (m16, stream) in zip(("dkdv", "dq"), BWD_TF32X3_SHAPES[head_dim]))


def fp32_tensor_core_why_not(head_dim: int, device: int, smem_limit: int) -> str | None:
    """Why a float32 backward does not run on the 3xTF32 mma.sync kernels (None: it does)."""
    if not FP32_TENSOR_CORES:
        return "FP32_TENSOR_CORES is off"
    if head_dim not in BWD_TF32X3_SHAPES:
        return f"head dim {head_dim} is above {max(BWD_TF32X3_SHAPES)}"
    if capability(device) < (8, 0):
        return "mma.sync TF32 needs sm_80 or newer"
    need = max(bwd_mma_shared_bytes(head_dim, shape, torch.float32) for shape in BWD_TF32X3_SHAPES[head_dim])
    if need > smem_limit:
        return f"{need} bytes of shared memory exceed the device's {smem_limit}"
    return None


# ---- Hopper: attention_sm90.cu's backward_dkdv_kernel and backward_dq_kernel ------------------------------
SM90_SOURCE = "attention_sm90.cu"
SM90_BWD_HEAD_DIMS = (64, 128)  # compiled head dims; a smaller d runs as the next (TMA reads zeros past d)


class Sm90BwdTile(NamedTuple):
    """One Hopper backward shape: the dK/dV kernel's streamed query rows and the dQ kernel's streamed keys.
    Two consumer warpgroups keep 64 rows of their side (K and V, or Q and dO) each, or with ``split_steps``
    the same 64 rows, each taking alternate streamed tiles."""

    query_rows: int
    keys: int
    split_steps: bool = False

    @property
    def kept(self) -> int:  # the rows a CTA keeps, as the kernels derive them
        return 64 if self.split_steps else 128


# Per head dim, 16-bit operands. At d 128 the dK/dV kernel's dK and dV accumulators (64 + 64 registers) leave
# room for 64-query score tiles only; the dQ kernel's 128-key tiles ran 2-4% faster than 64-key ones there in
# two H200 runs (docs/notes/attention-backward-plan.md). ptxas -v: no spills.
SM90_BWD_TILES = {64: Sm90BwdTile(128, 128), 128: Sm90BwdTile(64, 128)}
# float32 on the same kernels as three bf16 planes of every operand (attention_sm90.cu, split_bf16x3): three
# times the shared memory a tile, so 64-row streamed tiles at d 64 (192 KB with the kept tiles), and at d 128
# 32-row streamed tiles beside 64 kept rows that both consumers share, taking alternate steps (two consumers'
# own 128 kept rows alone would take 192 KB); its dK/dV kernel spills a few words. The planes run the
# backward 1.9-2.6x faster than the 3xTF32 mma.sync kernels at d 64 and 1.5-2.1x faster than the FFMA ones at
# d 128 (docs/notes/attention-backward-plan.md); False sends float32 back to those.
SM90_FP32_PLANES = True
SM90_BWD_PLANE_TILES = {64: Sm90BwdTile(64, 64), 128: Sm90BwdTile(32, 32, split_steps=True)}
SM90_BWD_STAGES = 2
SM90_BWD_THREADS = 384  # every shape: the producer warpgroup and two consumers
_SM90_BWD_PARAMS_BYTES = 832  # attention_sm90.cu static_asserts the same size


class Sm90BwdParams(ctypes.Structure):
    """attention_sm90.cu's ``BwdParams``: five tensor maps, then pointers, strides and sizes."""

    _fields_ = (
        [(name, tma.TmaMapBytes) for name in ("q_map", "k_map", "v_map", "do_map", "rows_map")]
        + [(name, ctypes.c_void_p) for name in ("lse", "delta", "dq", "dk", "dv")]
        + [(f"{t}_{s}_stride", ctypes.c_int64) for t in ("dq", "dk", "dv") for s in ("batch", "head", "row")]
        + [(name, ctypes.c_int32) for name in ("heads", "m", "n", "d", "kv_group", "causal")]
        + [("scale", ctypes.c_float), ("scale_log2", ctypes.c_float), ("_pad", ctypes.c_uint8 * 48)]
    )


def sm90_bwd_shared_bytes(kind: str, head_dim: int, tile: Sm90BwdTile, stages: int | None = None,
                          planes: int = 1) -> int:
    """attention_sm90.cu ``BwdKVLayout`` / ``BwdQLayout`` ``kAllocBytes``: the two kept tiles, the streamed
    tiles' stages, each tile ``planes`` times (float32 as bf16 planes), for the dK/dV kernel each stage's lse2
    and D rows, the barriers, 1024 bytes of alignment."""
    stages = SM90_BWD_STAGES if stages is None else stages
    streamed = tile.query_rows if kind == "dkdv" else tile.keys
    kept = planes * tile.kept * head_dim * 2
    stream = planes * streamed * head_dim * 2
    rows = stages * 2 * streamed * 4 if kind == "dkdv" else 0
    return 2 * kept + 2 * stages * stream + rows + 8 * (1 + 2 * stages) + 1024


def sm90_bwd_tile(dtype: torch.dtype, head_dim: int) -> Sm90BwdTile:
    """The kernels' shape for ``dtype`` at ``head_dim``."""
    return (SM90_BWD_PLANE_TILES if dtype == torch.float32 else SM90_BWD_TILES)[head_dim]


def sm90_bwd_name_expressions(dtype: torch.dtype, head_dim: int, causal: bool) -> tuple[str, str]:
    """The dK/dV and the dQ kernel for ``dtype``, ``head_dim`` (64 or 128) and the mask."""
    tile = sm90_bwd_tile(dtype, head_dim)
    flag = "true" if causal else "false"
    if dtype == torch.float32:
        t, tail = "__nv_bfloat16", ", 3, float"
    else:
        t, tail = _CUDA_TYPE[dtype], ""
    if tile.split_steps:  # the template's default: no split
        tail = (tail or f", 1, {t}") + ", true"
    return (f"attention_sm90::backward_dkdv_kernel<{t}, {head_dim}, {tile.query_rows}, {SM90_BWD_STAGES}, {flag}{tail}>",
            f"attention_sm90::backward_dq_kernel<{t}, {head_dim}, {tile.keys}, {SM90_BWD_STAGES}, {flag}{tail}>")


def _bwd_map(t: torch.Tensor, rows: int, box_rows: int):
    """(dims, byte strides, box) of a 4-D (d, rows, heads, batch) map, as the forward's maps."""
    from .flash3_wgmma import _map_of
    return _map_of(t, rows, box_rows)


def _stage_rows_map(stage_rows: torch.Tensor, m: int, box_rows: int):
    """(dims, byte strides, box) of the dK/dV kernel's 4-D (M, 2, batch * heads, 1) map of ``stage_rows``: one
    box is a stage's lse2 and D rows, [2][box_rows] floats."""
    batch_heads, _, pitch = stage_rows.shape
    return (m, 2, batch_heads, 1), (4 * pitch, 8 * pitch, 8 * pitch * batch_heads), (box_rows, 2, 1, 1)


def runs_on_bf16_planes(q, k, v, grad_out) -> bool:
    """Whether the float32 backward of these tensors (no window) runs as bf16 planes on the wgmma kernels:
    the report's and the probe's question (their TFLOP/s count against the tensor cores' peak then)."""
    return q.dtype == torch.float32 and sm90_backward_why_not(q, k, v, grad_out, q, k, v, None) is None


def sm90_backward_why_not(q, k, v, grad_out, dq, dk, dv, window) -> str | None:
    """Why the wgmma backward does not take this call (None: it does): it needs an sm_90 device, 16-bit
    tensors (or float32 as bf16 planes, with ``SM90_FP32_PLANES``), an even head dim up to 128, no window, at
    most 65535 (batch, head) pairs (grid.y), operands TMA can read (16-byte aligned bases, strides that are
    positive multiples of 16 bytes; float32 ones are split into fresh planes) and outputs the pair stores can
    write (aligned to two elements)."""
    planes = q.dtype == torch.float32
    if planes and not SM90_FP32_PLANES:
        return "float32 runs on the mma.sync kernels (SM90_FP32_PLANES is off)"
    if q.dtype not in _CUDA_TYPE and not planes:
        return f"dtype {q.dtype} is not float16 or bfloat16"
    if capability(q.device.index) != (9, 0):
        return "wgmma and TMA as compiled here need sm_90"
    if q.shape[-1] > SM90_BWD_HEAD_DIMS[-1]:
        return f"head dim {q.shape[-1]} is above {SM90_BWD_HEAD_DIMS[-1]}"
    if q.shape[-1] % 2:
        return f"head dim {q.shape[-1]} is odd (the kernels store pairs of columns)"
    if window is not None:
        return "windows and sinks run on the mma.sync kernels"
    batch, heads = batch_heads_of(q)
    if batch * heads > MAX_GRID_Y:
        return f"{batch * heads} (batch, head) pairs exceed grid.y's {MAX_GRID_Y}, along which the kernels run them"
    for name, t in (("q", q), ("k", k), ("v", v), ("grad_out", grad_out)) if not planes else ():
        reason = tma.why_not(t, *_bwd_map(t, t.shape[-2], sm90_bwd_tile(q.dtype, padded_head_dim(
            q.shape[-1], SM90_BWD_HEAD_DIMS)).kept))
        if reason is not None:
            return f"{name}: {reason}"
    pair_bytes = 2 * q.element_size()
    for name, t in (("dq", dq), ("dk", dk), ("dv", dv)):
        if t.data_ptr() % pair_bytes or any(s % 2 for s in t.stride()[:-1]) or t.stride(-1) != 1:
            return f"{name}: pairs of elements need {pair_bytes}-byte alignment"
    return None


def _planes_storage(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(storage, view) for float32 ``t``'s three bfloat16 planes: storage (batch, 3, heads, rows, width) with
    width d rounded up to 8 (every row 16-byte aligned, as TMA's row strides must be); the view its first d
    columns as (batch * 3, heads, rows, d), whose index 3 b + plane along the first dim is what the kernels'
    maps read as their batch coordinate."""
    batch, heads = batch_heads_of(t)
    rows, d = t.shape[-2], t.shape[-1]
    storage = torch.empty((batch, 3, heads, rows, -(-d // 8) * 8), dtype=torch.bfloat16, device=t.device)
    return storage, storage[..., :d].view(batch * 3, heads, rows, d)


def bf16_planes_reference(t: torch.Tensor) -> torch.Tensor:
    """float32 ``t`` as its three bfloat16 planes t = t0 + t1 + t2 by torch ops (attention_sm90.cu's
    split_bf16x3 on the whole tensor: each rounded to nearest, both differences exact), laid out as
    :func:`_planes_storage`'s view: what ``split_planes_kernel`` writes, bit for bit."""
    batch, heads = batch_heads_of(t)
    storage, view = _planes_storage(t)
    t4 = t.reshape(batch, heads, t.shape[-2], t.shape[-1])
    planes = storage[..., :t.shape[-1]]
    planes[:, 0] = t4
    rest = t4 - planes[:, 0].float()
    planes[:, 1] = rest
    planes[:, 2] = rest - planes[:, 1].float()
    return view


class SplitParams(ctypes.Structure):
    """attention_sm90.cu's ``SplitParams``, field by field."""

    _fields_ = ([("x", ctypes.c_void_p), ("planes", ctypes.c_void_p)]
                + [(f"x_{s}_stride", ctypes.c_int64) for s in ("batch", "head", "row", "col")]
                + [("count", ctypes.c_int64)]
                + [(name, ctypes.c_int32) for name in ("heads", "rows", "d", "width")])


SPLIT_NAME = "attention_sm90::split_planes_kernel"
_SPLIT_THREADS = 256
_SPLIT_CTAS_PER_SM = 16  # a grid-stride loop: enough CTAs to fill the GPU many times over


def _split_planes(t: torch.Tensor, device: int, stream: int) -> torch.Tensor:
    """float32 ``t``'s planes (:func:`bf16_planes_reference`'s, bit for bit) by one pass of
    split_planes_kernel on ``stream``."""
    storage, view = _planes_storage(t)
    batch, heads = batch_heads_of(t)
    p = SplitParams()
    p.x, p.planes = t.data_ptr(), storage.data_ptr()
    p.x_batch_stride, p.x_head_stride, p.x_row_stride = _strides4(t)
    p.x_col_stride = t.stride(-1)
    p.heads, p.rows, p.d, p.width = heads, t.shape[-2], t.shape[-1], storage.shape[-1]
    p.count = batch * heads * p.rows * p.d
    grid = (max(1, min(-(-p.count // _SPLIT_THREADS), _SPLIT_CTAS_PER_SM * sm_count(device))), 1, 1)
    packed = nvrtc.PackedLaunch(nvrtc.kernel_for(SM90_SOURCE, SPLIT_NAME, device, arch_specific=True), grid,
                                (_SPLIT_THREADS, 1, 1), (p,))
    with packed.lock:
        packed.launch(stream)
    return view


def _sm90_backward(q, k, v, grad_out, lse, delta, stage_rows, dq, dk, dv, *, scale, causal, batch, heads, kv_heads,
                   stream) -> None:
    """Launch the wgmma dK/dV and dQ kernels (``sm90_backward_why_not`` said yes) on ``stream``; the dK/dV
    kernel reads each stage's lse2 and D from ``stage_rows`` (written by ``_delta``)."""
    m, n, d = q.shape[-2], k.shape[-2], q.shape[-1]
    head_dim = padded_head_dim(d, SM90_BWD_HEAD_DIMS)
    tile = sm90_bwd_tile(q.dtype, head_dim)
    names = sm90_bwd_name_expressions(q.dtype, head_dim, causal)
    planes = 3 if q.dtype == torch.float32 else 1
    # The maps read the operands, or float32 ones' bf16 planes (made on this stream, before the kernels).
    operands = {"q": q, "do": grad_out, "k": k, "v": v}
    if planes > 1:
        operands = {name: _split_planes(t, q.device.index, stream) for name, t in operands.items()}
    # Per kernel: (kept box rows, streamed box rows) of the q/dO and the k/v maps, grid, shared bytes.
    plans = (((tile.query_rows, tile.kept), (-(-n // tile.kept), batch * kv_heads, 1),
              sm90_bwd_shared_bytes("dkdv", head_dim, tile, planes=planes)),
             ((tile.kept, tile.keys), (-(-m // tile.kept), batch * heads, 1),
              sm90_bwd_shared_bytes("dq", head_dim, tile, planes=planes)))
    for name, ((q_box, k_box), grid, shared) in zip(names, plans):
        p = tma.aligned_instance(Sm90BwdParams)
        for map_name, rows, box in (("q", m, q_box), ("do", m, q_box), ("k", n, k_box), ("v", n, k_box)):
            t = operands[map_name]
            tma.TiledMap(t.dtype, *_bwd_map(t, rows, box)).encode(
                t.data_ptr(), ctypes.addressof(p) + getattr(Sm90BwdParams, f"{map_name}_map").offset)
        if name == names[0]:
            tma.TiledMap(torch.float32, *_stage_rows_map(stage_rows, m, q_box), swizzle=tma.SWIZZLE_NONE).encode(
                stage_rows.data_ptr(), ctypes.addressof(p) + Sm90BwdParams.rows_map.offset)
        p.lse, p.delta = lse.data_ptr(), delta.data_ptr()
        p.dq, p.dk, p.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
        for t_name, t in (("dq", dq), ("dk", dk), ("dv", dv)):
            for suffix, stride in zip(("batch", "head", "row"), _strides4(t)):
                setattr(p, f"{t_name}_{suffix}_stride", stride)
        p.heads, p.m, p.n, p.d, p.kv_group, p.causal = heads, m, n, d, heads // kv_heads, int(bool(causal))
        p.scale, p.scale_log2 = scale, scale * 1.4426950408889634
        kernel = nvrtc.kernel_for(SM90_SOURCE, name, q.device.index, arch_specific=True)
        packed = nvrtc.PackedLaunch(kernel, grid, (SM90_BWD_THREADS, 1, 1), (p,), shared_mem=shared)
        with packed.lock:
            packed.launch(stream)


def check_backward_args(q, k, v, out, lse, grad_out, grad_lse, scale, causal, window, num_sinks) -> None:
    """The backward's arguments are a forward's: q, k and v as the forward checks them, ``out`` and
    ``grad_out`` of q's shape and dtype, ``lse`` (and ``grad_lse``, if any) float32 with one value per
    query row, all on q's device. The custom op checks them before any launch (its callers are ours, but
    torch.ops.cute_kernels.attention_backward is anyone's)."""
    check_attention_args(q, k, v, scale, causal, window=window, num_sinks=num_sinks)
    for name, t in (("out", out), ("grad_out", grad_out)):
        checks.cuda_tensor(name, t)
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: expected dtype {q.dtype} (like q), got {t.dtype}")
        if t.shape != q.shape:
            raise ValueError(f"{name}: expected shape {tuple(q.shape)} (like q), got {tuple(t.shape)}")
    rows = tuple(q.shape[:-1])
    for name, t in (("lse", lse), ("grad_lse", grad_lse)):
        if t is None and name == "grad_lse":
            continue
        checks.cuda_tensor(name, t)
        if t.dtype != torch.float32:
            raise TypeError(f"{name}: expected dtype torch.float32, got {t.dtype}")
        if tuple(t.shape) != rows:
            raise ValueError(f"{name}: expected shape {rows} (one value per row of q), got {tuple(t.shape)}")
    checks.same_device(q=q, out=out, grad_out=grad_out, lse=lse, grad_lse=grad_lse)


def attention_backward(q, k, v, out, lse, grad_out, *, scale, causal, window, num_sinks, grad_lse=None):
    """(dq, dk, dv) of ``out = attention(q, k, v, ...)`` for the incoming ``grad_out``: CUDA tensors of one
    dtype (float32, float16 or bfloat16) as the forward took them ((B, H, S, d), (H, S, d) or (S, d), k/v with H / kv_group heads), ``lse`` the
    forward's (B, H, M) log-sum-exp. Gradients come in the inputs' shapes (fresh tensors), on the current
    stream. ``window``: (left, right) or None; ``scale``: None is 1/sqrt(d). ``grad_lse``: the gradient
    reaching the lse output (return_lse), if any: it enters as D - dlse."""
    if q.dtype != torch.float32 and padded_head_dim(q.shape[-1]) not in BWD_MMA_HEAD_DIMS:
        # Past the 16-bit kernels' head dims: the FP32 kernels on float32 copies, gradients rounded back.
        grads = attention_backward(*(t.float() for t in (q, k, v, out)), lse, grad_out.float(), scale=scale,
                                   causal=causal, window=window, num_sinks=num_sinks, grad_lse=grad_lse)
        return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))
    m, d = q.shape[-2], q.shape[-1]
    n = k.shape[-2]
    heads = 1 if q.dim() == 2 else q.shape[-3]
    kv_heads = 1 if k.dim() == 2 else k.shape[-3]
    batch = q.shape[0] if q.dim() == 4 else 1
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    grad_out = grad_out.contiguous() if grad_out.stride(-1) != 1 else grad_out
    lse = lse.contiguous()
    if grad_lse is not None:
        grad_lse = grad_lse.to(torch.float32).contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if m == 0 or n == 0 or d == 0 or batch * heads == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    head_dim = padded_head_dim(d)
    device = q.device.index
    if sm90_backward_why_not(q, k, v, grad_out, dq, dk, dv, window) is None:
        out = out.contiguous() if out.stride(-1) != 1 else out

        def launch_sm90():  # with the tensors' device current: kernel loads and torch's stream follow it
            stream = current_stream_handle(device)
            stage_rows = _stage_rows(batch * heads, m, q.device)
            delta = _delta(out, grad_out, grad_lse, batch, heads, device, stream, lse, stage_rows)
            _sm90_backward(q, k, v, grad_out, lse, delta, stage_rows, dq, dk, dv, scale=scale, causal=causal,
                           batch=batch, heads=heads, kv_heads=kv_heads, stream=stream)

        on_device(device, launch_sm90)
        return dq, dk, dv
    smem_limit = shared_memory_limit(device)
    tensor_cores = q.dtype == torch.float32 and fp32_tensor_core_why_not(head_dim, device, smem_limit) is None
    if q.dtype == torch.float32 and not tensor_cores:
        shapes = bwd_fp32_shapes(head_dim, smem_limit)
        if shapes is None:
            least = max(bwd_fp32_shared_bytes(head_dim, keys_kept, (32, 32, 1)) for keys_kept in (True, False))
            raise ValueError(f"q: the attention backward at head dim {d} runs float32 kernels needing {least} "
                             f"bytes of shared memory per block, and this GPU allows {smem_limit}; head dims up "
                             "to 128 fit")
        vector = _vector_width(q.dtype, d, (q, k, v, grad_out, dq, dk, dv))  # 4 (16-byte copies) or 1
        kept, threads = tuple(shape[0] for shape in shapes), BWD_FP32_THREADS
        windowed = window is not None
        # dQ by atomics from the dK/dV kernel unless torch is asked for deterministic algorithms (then the
        # dQ kernel recomputes S and dP: bitwise repeatable).
        if not torch.are_deterministic_algorithms_enabled() and _fp32_atomic_fits(head_dim, shapes[0], smem_limit):
            names = (_fp32_name("dkdv", head_dim, shapes[0], vector, windowed, atomic_dq=True),)
            smem = (bwd_fp32_shared_bytes(head_dim, True, shapes[0], atomic_dq=True),)
            dq.zero_()
        else:
            names = (_fp32_name("dkdv", head_dim, shapes[0], vector, windowed, atomic_dq=False),
                     _fp32_name("dq", head_dim, shapes[1], vector, windowed))
            smem = tuple(bwd_fp32_shared_bytes(head_dim, keys_kept, shape)
                         for keys_kept, shape in zip((True, False), shapes))
    else:  # the mma.sync kernels: 16-bit, or float32 in 3xTF32
        vector = _vector_width(q.dtype, d, (q, k, v, grad_out, dq, dk, dv))  # the forward's rule: 16 bytes or 1
        if tensor_cores:
            shapes = BWD_TF32X3_SHAPES[head_dim]
            names = bwd_tf32x3_name_expressions(head_dim, vector, window is not None)
        else:
            shapes = bwd_mma_shapes(head_dim, window is not None, smem_limit)
            names = bwd_mma_name_expressions(q.dtype, head_dim, vector, window is not None, smem_limit)
        kept, threads = tuple(64 * m16 for m16, _ in shapes), BWD_MMA_THREADS
        smem = tuple(bwd_mma_shared_bytes(head_dim, shape, q.dtype) for shape in shapes)
    # One CTA per kept tile: key tiles for dK/dV, query tiles for dQ (not launched by the atomic-dQ flavour).
    grids = ((batch * kv_heads, -(-n // kept[0]), 1), (batch * heads, -(-m // kept[1]), 1))[:len(names)]
    for (what, rows), grid, tile in zip((("k", n), ("q", m)), grids, kept):
        if grid[1] > MAX_GRID_Y:
            raise ValueError(f"{what}: {rows} rows make more than {MAX_GRID_Y} tiles of {tile}, the most the "
                             "backward launches along grid.y")
    out = out.contiguous() if out.stride(-1) != 1 else out
    p = BwdParams()
    for name, t in (("q", q), ("k", k), ("v", v), ("dout", grad_out), ("lse", lse), ("dq", dq), ("dk", dk),
                    ("dv", dv)):
        setattr(p, name, t.data_ptr())
    for name, t in (("q", q), ("k", k), ("v", v), ("do", grad_out), ("dq", dq), ("dk", dk), ("dv", dv)):
        for suffix, stride in zip(("batch", "head", "row"), _strides4(t)):
            setattr(p, f"{name}_{suffix}_stride", stride)
    p.heads, p.m, p.n, p.d = heads, m, n, d
    p.scale = scale
    p.causal = int(bool(causal))
    p.kv_group = heads // kv_heads
    left, right = window or (None, None)
    p.window_left = m if left is None else min(left, m)  # clamped as the forward's (32-bit row bounds)
    p.window_right = n if right is None else min(right, n)
    p.num_sinks = min(num_sinks, n) if window is not None else 0

    def launch():  # with the tensors' device current: kernel loads and torch's stream follow it
        stream = current_stream_handle(device)
        delta = _delta(out, grad_out, grad_lse, batch, heads, device, stream)
        p.delta = delta.data_ptr()
        for name, grid, shared in zip(names, grids, smem):  # the atomic-dQ flavour: the dK/dV kernel alone
            # The parameters by value, as the forward's (PackedLaunch): the driver copies them at the launch.
            packed = nvrtc.PackedLaunch(nvrtc.kernel_for(SOURCE, name, device), grid, (threads, 1, 1), (p,),
                                        shared_mem=shared)
            with packed.lock:
                packed.launch(stream)

    on_device(device, launch)
    return dq, dk, dv


def precompile_backward(problem, device_index: int) -> None:
    """Compile and load every kernel a backward of ``problem`` (an AttentionProblem) launches on this GPU: the
    forward with its log-sum-exp and then ``attention_backward`` itself run under the dry-run switch, so the
    routing is a real call's and nothing is launched (torch's own ops still run). Called in this thread, not
    through autograd, whose device thread would not see the switch (a context variable). float32 gets its
    default kernels (on sm_90 the wgmma kernels' bf16 planes up to d = 128, elsewhere 3xTF32 mma.sync up to
    d = 64, else FFMA with atomic dQ); under ``torch.use_deterministic_algorithms`` an FFMA backward compiles
    its two-kernel flavour on first use."""
    from ...runtime.dry_run import dry_run
    from .op import attention
    from .spec import make_inputs

    inputs = make_inputs(problem, torch.device("cuda", device_index))
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    with dry_run():
        out, lse = attention(q, k, v, causal=problem.causal, window=problem.window, num_sinks=problem.num_sinks,
                             return_lse=True)
        attention_backward(q, k, v, out, lse, torch.ones_like(out), scale=None, causal=problem.causal,
                           window=problem.window, num_sinks=problem.num_sinks)
