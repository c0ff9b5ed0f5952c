"""The Hopper 3xTF32 SGEMM (registry entry ``sgemm/tf32x3_wgmma``; ``legacy_cuda/sgemm_sm90.cu``: TMA,
warpgroup MMAs on TF32, FP32-accurate): ``d = alpha * a @ b + beta * c`` for a row-major or column-major
float32 ``a`` (M, K) and ``b`` (K, N) (``w.t()`` of a row-major weight), with 16-byte aligned rows, on
sm_90; or a batch of them, (B, M, K) @ (B, K, N), an operand of batch stride 0 one matrix for all.
``ck.sgemm`` runs it on the large problems (:func:`takes`); this module holds its config, validity predicate,
default, compile and launch, and the registry entry.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading

import torch

from ...registry import register
from ...runtime import nvrtc, tma
from ...runtime.config_fields import check_choice, check_fields
from ...runtime.device import H200_SM_COUNT, current_stream_handle, device_sm
from .problem import GRID_Z_MAX, GemmProblem, check_output_matrices
from .spec import sgemm_spec

__all__ = ["SOURCE", "Sm90Tf32x3Config", "name_expression", "why_not", "why_unsupported", "takes",
           "Sm90Tf32x3Launch", "prepare", "prepare_for", "sgemm_sm90", "SPEC"]

SOURCE = "sgemm_sm90.cu"
TILES = (64, 128)  # square CTA tiles: 128 (two consumer warpgroups), 64 (one; two CTAs an SM)
BLOCK_K = 32


def threads(tile: int) -> int:
    """The producer warpgroup and one consumer warpgroup per 64 rows of the tile."""
    return 128 * (1 + tile // 64)


def shared_bytes(tile: int) -> int:
    """sgemm_sm90::Shared<tile> (four raw A and B stages, two pairs of split B tiles, eight mbarriers; 1024-byte
    aligned) and the 1024 bytes the kernel may skip to align it. Fewer stages use the same layout."""
    return 3 * 4 * tile * BLOCK_K * 4 + 1024 + 1024


@dataclasses.dataclass(frozen=True)
class Sm90Tf32x3Config:
    """Compile-time knobs of the Hopper 3xTF32 SGEMM: ``num_stages``, the TMA ring's depth (2 to 4 raw A
    and B k-tiles in flight), and ``tile``, the square CTA tile (128, or 64: one consumer warpgroup, two CTAs
    an SM, for products too small to fill 128-square tiles); k-tiles of 32."""

    num_stages: int = 4
    tile: int = 128

    def __post_init__(self) -> None:
        check_fields(self)
        check_choice(self, "num_stages", (2, 3, 4))
        check_choice(self, "tile", TILES)

    def short(self) -> str:
        """Compact name for tables and errors: s4, s3_t64."""
        return f"s{self.num_stages}" + ("" if self.tile == 128 else f"_t{self.tile}")


def name_expression(b_k_major: bool, stages: int = 4, a_m_major: bool = False, tile: int = 128) -> str:
    tail = f", {'true' if a_m_major else 'false'}, {tile}" if tile != 128 else (", true" if a_m_major else "")
    return f"sgemm_sm90::sgemm_tf32x3_kernel<{stages}, {'true' if b_k_major else 'false'}{tail}>"


def _b_k_major(b: torch.Tensor) -> bool:
    """Whether ``b`` (K, N) is column-major (K contiguous: ``w.t()``) rather than row-major."""
    return b.stride(-2) == 1 and b.stride(-1) != 1


def _a_m_major(a: torch.Tensor) -> bool:
    """Whether ``a`` (M, K) is column-major (M contiguous: ``x.t()``) rather than row-major."""
    return a.stride(-2) == 1 and a.stride(-1) != 1


def _batch(t: torch.Tensor) -> int:
    return t.shape[0] if t.dim() == 3 else 1


def _batch_stride(t: "torch.Tensor | None") -> int:
    """Elements from one matrix of a batch to the next (0: a single matrix, or one repeated)."""
    return t.stride(0) if t is not None and t.dim() == 3 and t.shape[0] > 1 else 0


class Params(ctypes.Structure):
    """sgemm_sm90::Params: the two tensor maps, the result's and C's pointers, row and batch strides, the
    sizes, the tile grid, the scalars and which operands are batches (padded to the C++ struct's 64-byte
    multiple; the kernel asserts the size)."""

    _fields_ = [("a_map", tma.TmaMapBytes), ("b_map", tma.TmaMapBytes), ("d", ctypes.c_void_p),
                ("c", ctypes.c_void_p), ("ldd", ctypes.c_int64), ("ldc", ctypes.c_int64),
                ("batch_d", ctypes.c_int64), ("batch_c", ctypes.c_int64), ("m", ctypes.c_int32),
                ("n", ctypes.c_int32), ("k", ctypes.c_int32), ("tiles_m", ctypes.c_int32),
                ("tiles_n", ctypes.c_int32), ("alpha", ctypes.c_float), ("beta", ctypes.c_float),
                ("a_batched", ctypes.c_int32), ("b_batched", ctypes.c_int32), ("_pad", ctypes.c_uint8 * 44)]


PARAMS_BYTES = 384


def _map(t: torch.Tensor, inner: int, outer: int, box: tuple) -> tuple:
    """(dims, byte strides, box) of the 4-D map of ``t`` viewed as (inner, outer, batch, 1), innermost first:
    ``inner`` and ``outer`` its dims (-1 or -2) along the map's first two; the batch is a dim of 1 for a
    single or repeated matrix (the kernel then reads coordinate 0 for every product)."""
    line = t.stride(outer) * 4
    batch_stride = _batch_stride(t) * 4
    batch = _batch(t) if batch_stride else 1
    # A dim of 1 may take any valid stride; the batch's the line's multiple keeps its value in range.
    step = batch_stride or line * t.shape[outer]
    return (t.shape[inner], t.shape[outer], batch, 1), (line, step, step), (*box, 1, 1)


def _maps(a: torch.Tensor, b: torch.Tensor, tile: int = 128) -> tuple:
    """(dims, byte strides, box) of A as (K, M, batch, 1) and B as (N, K, batch, 1), innermost first (a
    column-major A as (M, K, batch, 1) in 32 x 32 boxes, a column-major B as (K, N, batch, 1)), for CTA
    tiles of ``tile`` (what TMA can take does not depend on it: boxes of 32 to 128)."""
    a_map = _map(a, -2, -1, (32, BLOCK_K)) if _a_m_major(a) else _map(a, -1, -2, (BLOCK_K, tile))
    b_map = _map(b, -2, -1, (BLOCK_K, tile)) if _b_k_major(b) else _map(b, -1, -2, (32, BLOCK_K))
    return a_map, b_map


def why_not(a: torch.Tensor, b: torch.Tensor, device_sm: int, out: "torch.Tensor | None" = None,
            c: "torch.Tensor | None" = None) -> "str | None":
    """Why the kernel cannot run ``out = a @ b (+ c)`` (None: it can): 2-D matrices, or batches of B (3-D, the
    same B, ``out`` of the batch's shape; an operand or ``c`` of batch stride 0 is one matrix for all).
    Conservative at size-1 dims: a size-1 dim's stride goes into the map as it is, so where TMA cannot take it
    the call is refused, never misread."""
    if device_sm != 90:
        return f"wgmma and TMA as compiled here need sm_90, not sm_{device_sm}"
    if a.dtype != torch.float32 or b.dtype != torch.float32:
        return "float32 operands only"
    if a.dim() not in (2, 3) or b.dim() != a.dim() or not (a.stride(-1) == 1 or a.stride(-2) == 1) or not (
            b.stride(-1) == 1 or b.stride(-2) == 1):
        return "row- or column-major a and b, both 2-D or both 3-D, only"
    if a.dim() == 3 and (a.shape[0] != b.shape[0] or not 1 <= a.shape[0] <= GRID_Z_MAX):
        return f"a is {tuple(a.shape)}, b {tuple(b.shape)}: batches of one size, 1 to {GRID_Z_MAX}, only"
    if a.shape[-1] != b.shape[-2]:
        return f"a is {tuple(a.shape)}, b {tuple(b.shape)}: K differs"
    if a.shape[-2] == 0 or b.shape[-1] == 0 or a.shape[-1] == 0:
        return "M, N or K = 0 (an empty result, or with K = 0 beta * c: no product to run)"
    shape = (*a.shape[:-1], b.shape[-1])
    for name, t in (("out", out), ("c", c)):
        if t is not None and (t.dtype != torch.float32 or tuple(t.shape) != shape or t.stride(-1) != 1):
            return f"{name}: a row-major float32 {shape} {'batch' if len(shape) == 3 else 'matrix'} only"
    if out is not None:
        try:  # the op's own layout rule: row-major matrices that do not overlap
            check_output_matrices("out", out, shape)
        except ValueError as exc:
            return str(exc)
    for name, t, (dims, strides, box) in zip("ab", (a, b), _maps(a, b)):
        reason = tma.why_not(t, dims, strides, box)
        if reason is not None:
            return f"{name}: {reason}"
    return None


class Sm90Tf32x3Launch:
    """The launch of one config on one device. Its tensor maps describe one problem's shapes and operand
    strides: they are built for the first call's tensors (the plans of ``ck.sgemm`` give a launch calls of one
    structure only) and again should a call's shapes or strides differ. Per call the maps are encoded for the
    call's pointers (``tma.ParamMaps``), the result's and C's pointers, row strides and the scalars written;
    all of it, the maps' building included, under one lock, since threads share a plan's launch and its
    one parameter block."""

    def __init__(self, config: Sm90Tf32x3Config, b_k_major: bool, device_index: int, a_m_major: bool = False):
        self.device_index, self.b_k_major, self.a_m_major = device_index, b_k_major, a_m_major
        self.tile = config.tile
        self.kernel = nvrtc.kernel_for(SOURCE, name_expression(b_k_major, config.num_stages, a_m_major, config.tile),
                                       device_index, arch_specific=True)
        self.params = tma.aligned_instance(Params)
        self.lock = threading.Lock()
        self.structure = self.maps = self.packed = None

    def _describe(self, a: torch.Tensor, b: torch.Tensor) -> None:
        (m, k), n = a.shape[-2:], b.shape[-1]
        if _b_k_major(b) != self.b_k_major:
            raise ValueError(f"b with strides {b.stride()}: this launch was compiled for a "
                             f"{'column' if self.b_k_major else 'row'}-major b")
        if _a_m_major(a) != self.a_m_major:
            raise ValueError(f"a with strides {a.stride()}: this launch was compiled for a "
                             f"{'column' if self.a_m_major else 'row'}-major a")
        p = self.params
        a_map, b_map = _maps(a, b, self.tile)
        self.maps = tma.ParamMaps(p, {"a": ("a_map", tma.TiledMap(a.dtype, *a_map)),
                                      "b": ("b_map", tma.TiledMap(b.dtype, *b_map))})
        p.m, p.n, p.k = m, n, k
        p.tiles_m, p.tiles_n = -(-m // self.tile), -(-n // self.tile)
        p.a_batched, p.b_batched = int(_batch_stride(a) != 0), int(_batch_stride(b) != 0)
        grid = (p.tiles_m * p.tiles_n, _batch(a), 1)
        self.packed = nvrtc.PackedLaunch(self.kernel, grid, (threads(self.tile), 1, 1), (p,),
                                         shared_mem=shared_bytes(self.tile), lock=self.lock)
        self.structure = (a.shape, a.stride(), b.shape, b.stride())

    def __call__(self, a, b, c, out, alpha: float, beta: float) -> None:
        if beta == 0.0:  # C is not read (the op may still pass the caller's, of any layout)
            c = None
        p = self.params
        with self.lock:
            if (a.shape, a.stride(), b.shape, b.stride()) != self.structure:
                reason = why_not(a, b, device_sm(a), out, c)
                if reason is not None:
                    raise ValueError(f"sgemm_sm90: {reason}")
                self._describe(a, b)
            self.maps.point("a", a.data_ptr())
            self.maps.point("b", b.data_ptr())
            p.d, p.ldd, p.batch_d = out.data_ptr(), out.stride(-2), _batch_stride(out)
            p.c, p.ldc, p.batch_c = (c.data_ptr(), c.stride(-2), _batch_stride(c)) if c is not None else (0, 0, 0)
            p.alpha, p.beta = alpha, beta if c is not None else 0.0
            self.packed.launch(current_stream_handle(self.device_index))


def prepare_for(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, c: "torch.Tensor | None" = None,
                config: Sm90Tf32x3Config = Sm90Tf32x3Config()) -> Sm90Tf32x3Launch:
    """The launch of ``out = a @ b (+ c)`` on these tensors, after ``why_not`` (for tests and probes)."""
    reason = why_not(a, b, device_sm(a), out, c)
    if reason is not None:
        raise ValueError(f"sgemm_sm90: {reason}")
    return Sm90Tf32x3Launch(config, _b_k_major(b), a.device.index, _a_m_major(a))


def sgemm_sm90(a: torch.Tensor, b: torch.Tensor, c: "torch.Tensor | None" = None, *, alpha: float = 1.0,
               beta: float = 0.0, out: "torch.Tensor | None" = None) -> torch.Tensor:
    """``alpha * a @ b + beta * c`` on this kernel, for tests and probes: ``out`` and ``c`` row-major (M, N)
    (or (B, M, N) for batches; ``out`` may be ``c``); nothing is checked beyond what the kernel needs
    (``why_not``)."""
    if out is None:
        out = torch.empty(*a.shape[:-1], b.shape[-1], dtype=torch.float32, device=a.device)
    read_c = c is not None and beta != 0.0
    prepare_for(a, b, out, c if read_c else None)(a, b, c if read_c else None, out, float(alpha),
                                                  float(beta) if read_c else 0.0)
    return out


# ---------------------------------------------------------------------------------------------- registry
def why_unsupported(config: Sm90Tf32x3Config, problem: GemmProblem) -> "str | None":
    """The one validity predicate (None = supported): sm_90, float32, a batch the grid holds, 16-byte rows
    (or columns) and batch strides of ``a`` and ``b`` (TMA). A size-1 dim whose stride TMA cannot take is
    refused when the launch meets the tensors (``why_not``), never misread."""
    if not isinstance(config, Sm90Tf32x3Config):
        return f"config must be a Sm90Tf32x3Config, got {type(config).__name__}"
    if problem.dtype != "float32":
        return f"the Hopper 3xTF32 sgemm computes float32 only, problem dtype is {problem.dtype}"
    if problem.sm != 90:
        return f"wgmma and TMA as compiled here need sm_90, the device is sm_{problem.sm}"
    if problem.batch > GRID_Z_MAX:
        return f"a batch of {problem.batch} products (one launch's grid holds {GRID_Z_MAX})"
    if problem.a_align != 4 or problem.b_align != 4:
        return "TMA needs 16-byte aligned rows of a and b"
    if min(problem.m, problem.n, problem.k) < 1:
        return "M, N or K = 0 (no product to run)"
    if -(-problem.m // config.tile) * -(-problem.n // config.tile) > 2 ** 31 - 1:
        return "more tiles than one launch's grid holds"
    return None


# The 64-square tile (one consumer warpgroup, two CTAs an SM) for products that leave 128-square tiles half
# padding or half the SMs idle: a side of ``SMALL_TILE_MAX_MN`` or fewer, or few enough 64-square tiles over
# the batch to run in one wave (two an SM). H100 probe (docs/notes/gemm.md, "SGEMM on tensor cores"): a batch
# of 256 64 x 64 x 512 products 31.3 us on 64-square tiles against 53.5 on 128-square ones (cuBLAS 39.6),
# 1024^3 33.1 against 47.6 (cuBLAS 64.1), 64 x 4096 x 4096 77.2 against 161.8; a batch of 64 256 x 256 x 512
# ones (256 tiles of 128, 1024 of 64) 68.0 against 54.0, where the 128-square tile stays.
SMALL_TILE_MAX_MN = 64


def _tiles(problem: GemmProblem, tile: int) -> int:
    return problem.batch * -(-problem.m // tile) * -(-problem.n // tile)


def default_config(problem: GemmProblem) -> Sm90Tf32x3Config:
    small = (min(problem.m, problem.n) <= SMALL_TILE_MAX_MN or _tiles(problem, 64) <= 2 * H200_SM_COUNT)
    return Sm90Tf32x3Config(tile=64 if small else 128)


def candidates() -> list[Sm90Tf32x3Config]:
    return [Sm90Tf32x3Config(s, tile) for tile in TILES for s in (2, 3, 4)]


# The H200 probe (docs/notes/gemm.md, "SGEMM on tensor cores"): 1.36-1.52x the sm80-style 3xTF32 kernel from
# 2048^3 up on 128-square tiles, 0.88x at 1024^3 (64 of them leave half the SMs idle; the 64-square tile
# since ran it 2.04x the sm80-style kernel on the H100) and 0.52x at 128x4096x4096 (32 tiles, no split-K).
# So the op takes it from a wave's worth of 64-square tiles (132: a 128-square tile counts four; a batch of
# 8 512^3 products, 128 tiles of 128, ran 1.35x the sm80-style kernel on the H100) and a K of a few k-tiles
# per tile up, and only where M and N fill a tile's rows and columns at all (a skinny side of 32 or fewer
# wastes most of every tile; such shapes were never timed here). A batch's tiles count together: the grid's
# second dim runs its products side by side.
TAKES_MIN_TILES = H200_SM_COUNT
TAKES_MIN_K = 512
TAKES_MIN_MN = 33


def takes(problem: GemmProblem) -> bool:
    """Whether the op's default runs ``problem`` here: its default config supported, at least
    ``TAKES_MIN_TILES`` 64-square tiles over the batch, K of at least ``TAKES_MIN_K`` and M and N of at least
    ``TAKES_MIN_MN``."""
    return (why_unsupported(default_config(problem), problem) is None and _tiles(problem, 64) >= TAKES_MIN_TILES
            and problem.k >= TAKES_MIN_K and min(problem.m, problem.n) >= TAKES_MIN_MN)


def _name_expression(config: Sm90Tf32x3Config, problem: GemmProblem) -> str:
    return name_expression(problem.b_major == "k", config.num_stages, problem.a_major == "m", config.tile)


compile = nvrtc.checked_compile(SOURCE, why_unsupported, _name_expression, arch_specific=True)  # noqa: A001


def prepare(config: Sm90Tf32x3Config, problem: GemmProblem, inputs: dict, out) -> Sm90Tf32x3Launch:
    """The launch of ``config`` for ``problem`` on ``out``'s device (the kernel compiled and loaded now; the
    maps at the first call, from its tensors)."""
    reason = why_unsupported(config, problem)
    if reason is not None:
        raise ValueError(f"config {config} does not support {problem}: {reason}")
    return Sm90Tf32x3Launch(config, problem.b_major == "k", out.device.index, problem.a_major == "m")


SPEC = register(
    sgemm_spec(
        variant="tf32x3_wgmma",
        backend="nvrtc",
        keep_launches=True,
        config_cls=Sm90Tf32x3Config,
        default_config=default_config,
        candidates=candidates,
        why_unsupported=why_unsupported,
        compile=compile,
        prepare=prepare,
        sources=(SOURCE,),
        arch_specific=True,
        description="FP32 GEMM on Hopper tensor cores: 3xTF32 wgmma m64n128k8 or m64n64k8 (B split into big and small "
                    "K-major tiles in shared memory, A split in registers), TMA ring, warp-specialised, "
                    "each k-tile's sums folded into FP32",
        bound="tf32x3",
        sweep_axes=(("tile",), ("num_stages",)),
    )
)
