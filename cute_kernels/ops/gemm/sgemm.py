"""FP32 SGEMM (CuTe DSL): ``sgemm(a, b, c=None, *, alpha=1.0, beta=0.0, out=None, config=None)``.

``a`` (M,K) and ``b`` (K,N) are float32 CUDA tensors; the result is ``alpha * a @ b + beta * c``, as accurate
as an FP32 FFMA GEMM (never plain TF32). ``c`` is read only when beta != 0. ``out=c`` updates ``c`` in place.
The op runs four registry entries: ``sgemm/tf32x3_wgmma`` (3xTF32 on Hopper's warpgroup MMAs,
``sgemm_sm90``) for the large aligned products on sm_90, ``sgemm/tf32x3_mma`` (3xTF32 on mma.sync,
``sgemm_tf32x3``) for the other M and N above 32 on sm_80 and newer, ``sgemm/simt_cpasync`` (FFMA, its kernel
:class:`~.sgemm_kernel.SgemmKernel`) for the skinny shapes and older GPUs, and ``sgemm/gemv`` for up to 8
rows times a transposed weight. This module holds the SIMT entry's sweep space, validity predicate, default
heuristic, compile/launch and registry entry, the ``gemv`` entry, the routing between them and the public
op.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ...registry import register, register_zoo
from ...runtime import device as _device
from ...runtime.device import H200_SM_COUNT
from ...runtime.cute_compile import CompileCache
from . import gemv as _gemv
from . import sgemm_sm90 as _sm90
from . import sgemm_tf32x3 as _tf32x3
from .compile import CompiledLaunch, compile_cached, compile_kernel, gemm_launch
from .compile import compile_key as gemm_compile_key
from .ladder import batch_split_problem, choose_from_ladder, smem_problem
from .op import CallPlans, GemmPolicy, run_gemm, staged_problem, stages_misaligned, swaps
from .problem import GemmProblem, index_problem
from .sgemm_config import GemmConfig
from .split_k import SPLIT_K_CHOICES, split_k_for, tile_count
from .spec import op_call, sgemm_spec
from .zoo import sgemm_held_out, sgemm_zoo

DTYPES = (torch.float32,)

__all__ = [
    "GemmProblem",
    "sgemm",
    "candidates",
    "default_config",
    "why_unsupported",
    "compile",
    "compile_key",
    "prepare",
    "SPEC",
]

# Shared memory one SM has for all resident CTAs on sm_90 (228 KB; each CTA also reserves 1 KB).
_SMEM_PER_SM_SM90 = 228 * 1024


# ---------------------------------------------------------------------------------------------- configs
def candidates() -> list[GemmConfig]:
    """The sweep space: CTA tiles from 32x32 to 256x128 / 128x256 (8x8 register micro-tiles per thread, 16x8
    and 8x16 for the two largest, 4x4 for 32x32), tile_k 8..32, 2..5 stages, both A shared-memory layouts,
    plain and 4x8 warps, rasterization off/on, occupancy hint off/on. ``why_unsupported`` prunes it per
    problem (shared memory, alignment). The 16x8 micro-tiles need ~255 registers, so they only run one CTA
    per SM: no occupancy hint for them, and no K-major A (its 4-deep fragments would not fit)."""
    shapes = [  # tile_m, tile_n, threads_m, threads_n, warp_rows choices
        (128, 128, 16, 16, (0, 4)),
        (128, 64, 16, 8, (0,)),  # the plain order is already 4x8 warps
        (64, 128, 8, 16, (0, 4)),
        (64, 64, 8, 8, (0,)),
        (256, 128, 16, 16, (0, 4)),
        (128, 256, 16, 16, (0, 4)),
        (32, 32, 8, 8, (0,)),
    ]
    out = []
    for tile_m, tile_n, threads_m, threads_n, warp_rows_choices in shapes:
        big_micro = (tile_m // threads_m) * (tile_n // threads_n) > 64
        for warp_rows in warp_rows_choices:
            for tile_k in (8, 16, 32):
                for num_stages in (2, 3, 4, 5):
                    for a_smem_major in ("m",) if big_micro else ("m", "k"):
                        for raster in (1, 8):
                            for min_ctas in (1,) if big_micro else (1, 2):
                                out.append(
                                    GemmConfig(
                                        tile_m=tile_m,
                                        tile_n=tile_n,
                                        tile_k=tile_k,
                                        num_stages=num_stages,
                                        threads_m=threads_m,
                                        threads_n=threads_n,
                                        a_smem_major=a_smem_major,
                                        raster=raster,
                                        min_ctas_per_sm=min_ctas,
                                        warp_rows=warp_rows,
                                    )
                                )
    # Split-K for the shapes that leave SMs idle: the ladder's two small rungs and the few-tiles rung, every
    # split (the few-tiles rung unsplit too).
    out += [dataclasses.replace(rung, split_k=split) for rung, _, _ in _LADDER[-2:] for split in SPLIT_K_CHOICES[1:]]
    out += [dataclasses.replace(rung, split_k=split)
            for rung in (_FEW_TILES_RUNG, _FEW_TILES_RUNG_K_MAJOR, _SKINNY_N_RUNG) for split in SPLIT_K_CHOICES]
    return out


# The default ladder, largest tile first: (config, CTAs one SM holds, relative throughput of a full SM).
# CTAs per SM follow from ptxas's register counts (scripts/probes/gemm_sass_mix.py, sm_90a): 176 x 256 threads -> 1,
# 176 x 128 -> 2, 148 x 64 -> 6, 72 x 64 -> 14 (capped at 8 here: smaller tiles re-read more from L2).
# The two big rungs are the H200 probe's best at LeetGPU's 8192 x 6144 x 4096 (cuBLAS interleaved):
# 128x128x32 s2 at 50.7 TFLOP/s (1.02x cuBLAS; also the sweep's winner at 4096^3 and 8192^3) and 128x64x8 s4
# with K-major A at 49.5 (0.976 of it). The two small tiles are estimates.
_LADDER = (
    (GemmConfig(tile_m=128, tile_n=128, tile_k=32, num_stages=2, threads_m=16, threads_n=16, a_smem_major="k"), 1, 1.0),
    (GemmConfig(tile_m=128, tile_n=64, tile_k=8, num_stages=4, threads_m=16, threads_n=8, a_smem_major="k"), 2, 0.976),
    (GemmConfig(tile_m=64, tile_n=64, tile_k=8, num_stages=3, threads_m=8, threads_n=8), 6, 0.85),
    (GemmConfig(tile_m=32, tile_n=32, tile_k=8, num_stages=3, threads_m=8, threads_n=8), 8, 0.5),
)


def default_config(problem: GemmProblem) -> GemmConfig:
    """The ladder entry with the smallest estimated time for the problem's M x N: big tiles (most FFMA per
    shared-memory read) when they fill the GPU's 132 SMs in whole waves, smaller ones when a big tile's
    last wave would leave most SMs idle. K-major A needs 16-byte rows of A; otherwise A is transposed.

    Then the shapes the ladder's model misjudges (the H200 probe in docs/notes/gemm.md, "Split-K"): M or N
    up to 32 take the 32x32 rung; M or N up to 128 the 128x64 one where M and N fill its tile (128 x 4096 x
    4096: 111 us split in 2 against the 64x64 rung's 120.7; 8192 x 64 x 4096: 113 against 125.5), else
    the 64x64 one, as does a bigger tile that would leave half the SMs idle (one CTA of 8 warps per SM runs
    far below the rate the model gives it). Problems of
    ``_SPLIT_MIN_FLOPS`` and more then split K (``split_k.split_k_for``) up to half the CTAs the rung's SMs
    hold, in at most ``_MAX_SPLIT`` slices; below that a launch is too short for the workspace round trip to
    pay. A 64x64 problem of at most ``_FEW_TILES`` tiles takes ``_FEW_TILES_RUNG`` (256 threads a tile)
    split in up to 4 instead."""
    config = choose_from_ladder(_LADDER, problem, why_unsupported=why_unsupported, candidates=candidates,
                                family="SGEMM", adapt=_transpose_unaligned_a)
    skinny = _skinny_n(problem)
    if skinny is not None:
        return skinny
    (small, small_ctas, _), (mid, mid_ctas, _) = _LADDER[-1], _LADDER[-2]
    ctas = 1
    swap = None
    wide, wide_ctas, _ = _LADDER[1]
    if min(problem.m, problem.n) <= 32:
        swap, ctas = small, small_ctas
    elif min(problem.m, problem.n) <= 128 and problem.m >= wide.tile_m and problem.n >= wide.tile_n:
        swap, ctas = wide, wide_ctas
    elif min(problem.m, problem.n) <= 128 or (config.tile_m * config.tile_n > mid.tile_m * mid.tile_n
                                              and tile_count(config, problem) * problem.batch < H200_SM_COUNT // 2):
        swap, ctas = mid, mid_ctas
    if swap is not None:
        swap = _transpose_unaligned_a(swap, problem)
        if why_unsupported(swap, problem) is not None:
            return config
        config = swap
    else:
        ctas = next((c for rung, c, _ in _LADDER if (rung.tile_m, rung.tile_n) == (config.tile_m, config.tile_n)), 1)
    if 2 * problem.m * problem.n * problem.k < _SPLIT_MIN_FLOPS:
        return config
    on_mid = swap is not None and (swap.tile_m, swap.tile_n) == (mid.tile_m, mid.tile_n)
    if on_mid and tile_count(config, problem) * problem.batch <= _FEW_TILES:
        rung = _FEW_TILES_RUNG_K_MAJOR if _a_rows_aligned(problem) else _FEW_TILES_RUNG
        few = _split(rung, problem, H200_SM_COUNT)  # about one CTA per SM
        if few is not None:
            return few
    return _split(config, problem, H200_SM_COUNT * ctas // 2) or config


def _split(config: GemmConfig, problem: GemmProblem, target_ctas: int) -> "GemmConfig | None":
    """``config`` with K split for ``problem`` (``split_k.split_k_for`` up to ``_MAX_SPLIT``); None where
    that split config cannot run the problem."""
    split = dataclasses.replace(config, split_k=split_k_for(config, problem, target_ctas, _MAX_SPLIT))
    return split if why_unsupported(split, problem) is None else None


_SPLIT_MIN_FLOPS = 2**28  # 512^3 and up (512^3: 18.9 us on the few-tiles rung split in 2, 23.3 unsplit)
# Splits past 4 lost on the SGEMM (H200, 128x4096x4096 on 64x64 tiles: k2 126 us, k4 133, k8 180, k16 250;
# 64x2048x2048: k4 51.5, k8 63.8), measured while the last slice's sum stalled on each load in turn; with
# the planes loaded whole, k4 runs 122.6 against k2's 124.0, and k8 and k16 are not re-measured.
_MAX_SPLIT = 4
# A 64x64 problem of this many tiles or fewer leaves most SMs empty even split in 4: there the tile runs on
# 256 threads (4x4 per thread, tile_k 16 so B's copy spreads over them) rather than 64, split in up to 4.
# 64x2048x2048 (32 tiles): 30.5 us against the 64-thread tile's 51.5 at k4 and 63.8 at k8 (cuBLAS 23.1);
# 512^3 (64 tiles): 18.9 at k2 against 23.2; with more tiles the 64-thread tile, more CTAs per SM, stays
# ahead (128x4096x4096: 126 against 157-161).
_FEW_TILES = H200_SM_COUNT // 2
_FEW_TILES_RUNG = GemmConfig(tile_m=64, tile_n=64, tile_k=16, num_stages=3, threads_m=16, threads_n=16)
# Where A's rows are 16-byte aligned, the same tile with a K-major A stage and 32-deep k-tiles (16-byte
# copies, twice the bytes in flight): 48x2048x4096 40.8 us against 45.3, 64x2048x2048 26.4 against 28.8
# (cuBLAS 34.7, 23.5; H200 probe).
_FEW_TILES_RUNG_K_MAJOR = dataclasses.replace(_FEW_TILES_RUNG, tile_k=32, a_smem_major="k")

# N up to 32 with many rows (a @ w for a skinny w): the work is streaming A once, and the 32x32 rung's
# 8-deep k-tiles keep ~3 KB in flight per CTA. A 128x32 tile of 128 threads with 32-deep k-tiles and a
# K-major A stage, split to about one CTA per SM: 4096x16x4096 37.8 us against the 32x32 rung's 56.2
# (cuBLAS 44.5); 64x32x32 38.2, 32x32x32 40.9 (H200 probe).
_SKINNY_N = 32
_SKINNY_N_RUNG = GemmConfig(tile_m=128, tile_n=32, tile_k=32, num_stages=3, threads_m=16, threads_n=8,
                            a_smem_major="k")


def _a_rows_aligned(problem: GemmProblem) -> bool:
    return problem.a_major == "k" and problem.a_align == 4


def _skinny_n(problem: GemmProblem) -> "GemmConfig | None":
    """``_SKINNY_N_RUNG`` (split from ``_SPLIT_MIN_FLOPS``) for one product of N <= ``_SKINNY_N`` < M with
    16-byte rows of A; None elsewhere."""
    if not (problem.n <= _SKINNY_N < problem.m and problem.batch == 1 and _a_rows_aligned(problem)):
        return None
    config = _SKINNY_N_RUNG
    if 2 * problem.m * problem.n * problem.k >= _SPLIT_MIN_FLOPS:
        config = _split(config, problem, H200_SM_COUNT) or config
    return config if why_unsupported(config, problem) is None else None


def _transpose_unaligned_a(config: GemmConfig, problem: GemmProblem) -> GemmConfig:
    """A without 16-byte rows is transposed into an M-major tile, copied element by element: the rung's
    tile at tile_k 8 with 3 stages, the shape the M-major rungs were measured with. A column-major A is
    M-major already: the rung's tile with an M-major stage (copied in vectors along M)."""
    if config.a_smem_major == "k" and problem.a_major == "m":
        return dataclasses.replace(config, a_smem_major="m")
    if config.a_smem_major == "k" and problem.a_align != 4:
        return dataclasses.replace(config, a_smem_major="m", tile_k=8, num_stages=3)
    return config


def _kernel_vectors(config: GemmConfig, problem: GemmProblem) -> tuple[int, int, int]:
    """Copy widths the kernel will actually use (an operand is copied element-wise where its stage is
    transposed: a row-major A to an M-major stage, a K-major B to its N-major stage)."""
    a_vector = problem.a_align if (config.a_smem_major == "k" or problem.a_major == "m") else 1
    b_vector = 1 if problem.b_major == "k" else problem.b_align
    c_vector = problem.c_align if problem.c_align == 4 else 1
    return a_vector, b_vector, c_vector


def why_unsupported(config: GemmConfig, problem: GemmProblem) -> "str | None":
    """The one validity predicate (None = supported), checked before anything is compiled."""
    if not isinstance(config, GemmConfig):
        return f"config must be a GemmConfig, got {type(config).__name__}"
    if problem.dtype != "float32":
        return f"sgemm computes float32 only, problem dtype is {problem.dtype}"
    smem = config.smem_bytes(problem.b_major == "k")
    why = smem_problem(smem, _device.shared_optin_bytes(problem.sm))
    if why is not None:
        return why
    if config.min_ctas_per_sm * (smem + 1024) > _SMEM_PER_SM_SM90:
        return (
            f"min_ctas_per_sm={config.min_ctas_per_sm} CTAs of {smem} bytes of shared memory do not fit "
            f"in one SM's {_SMEM_PER_SM_SM90} bytes"
        )
    if problem.a_major == "m" and config.a_smem_major != "m":
        return "an M-major a (column-major) needs a_smem_major='m': its stage keeps M contiguous"
    a_vector, b_vector, _ = _kernel_vectors(config, problem)
    for operand, vector, major in (("a", a_vector, problem.a_major), ("b", b_vector, problem.b_major)):
        why = config.copy_layout_problem(operand, vector, major)
        if why is not None:
            return why
    return batch_split_problem(config, problem) or index_problem(config, problem)


# ---------------------------------------------------------------------------------------------- compile
# Kept on disk too, keyed by the sources of this package (the kernels and the code that shapes them).
_CACHE = CompileCache("sgemm", Path(__file__).parent)


def compile_key(config: GemmConfig, problem: GemmProblem, arch: str) -> tuple:
    """Every compile-time property, nothing dynamic: sizes and leading dimensions are runtime values."""
    return gemm_compile_key("sgemm", config, problem, _kernel_vectors(config, problem), arch)


def compile(config: GemmConfig, problem: GemmProblem, arch: str | None = None):  # noqa: A001
    """Compile (or fetch from the cache) the binary for ``config`` and the problem's compile-time traits.

    Works without a GPU: tensors are fake (dynamic M, N, K and leading dimensions) and ``arch`` is passed
    to the compiler explicitly (default: ``CUTE_DSL_ARCH`` or the current device).
    """
    return compile_cached(_CACHE, config, problem, arch, why_unsupported=why_unsupported, key=compile_key,
                          build=_build)


def _build(config: GemmConfig, problem: GemmProblem, arch: str):
    import cutlass

    from .sgemm_kernel import SgemmKernel

    a_vector, b_vector, c_vector = vectors = _kernel_vectors(config, problem)
    kernel = SgemmKernel(config, a_vector=a_vector, b_vector=b_vector, c_vector=c_vector, beta_zero=problem.beta_zero,
                         batched=problem.batch > 1, a_major=problem.a_major, b_major=problem.b_major)
    return compile_kernel(kernel, cutlass.Float32, vectors, arch, problem, split=config.split_k > 1)


def prepare(config: GemmConfig, problem: GemmProblem, inputs: dict, out) -> CompiledLaunch:
    """The compiled launch of ``config`` for ``problem`` on ``out``'s device (compiled on first use); the
    caller validates the tensors it is given against ``problem`` (see ``compile.CompiledLaunch``)."""
    return gemm_launch(compile(config, problem, _device.arch(out.device.index, arch_specific=True)), config, problem,
                       out.device.index)


# ---------------------------------------------------------------------------------------------- public op
def sgemm(a, b, c=None, *, alpha=1.0, beta=0.0, out=None,
          config: "GemmConfig | _tf32x3.Tf32x3GemmConfig | _gemv.GemvConfig | None" = None):
    """``alpha * a @ b + beta * c`` in FP32 on ``a``'s CUDA device and torch's current stream.

    As accurate as an FP32 FFMA GEMM (cuBLAS with TF32 off): on sm_80 and newer, M and N above 32 run on
    tensor cores as three TF32 products per product (each operand split into a TF32 part and its FP32
    remainder; the sums kept in FP32), 1.3-1.4x cuBLAS's FFMA GEMM on large problems; the skinny shapes
    run on the SIMT FFMA kernel. A ``GemmConfig`` pins the FFMA kernel, a ``Tf32x3GemmConfig`` the
    tensor-core one. NaNs propagate on both; on the tensor-core kernel an infinite input, or a finite one
    within 2^-12 of the float32 maximum (from about 3.4020e38 in magnitude: its TF32 part rounds to
    infinity), makes the sums it enters NaN (inf - inf, or inf * 0) where FFMA gives an infinity or a finite
    sum.

    ``a``: (M, K) or a batch (B, M, K), ``b``: (K, N) or (B, K, N), float32; batches broadcast as
    ``torch.matmul``'s (a single matrix, or a batch of one, repeats over the other's batch; ``x @ w`` runs as
    one GEMM of B * M rows). Each operand's matrices are row-major (stride 1 in the last dim, any leading
    dimension) or column-major (a transposed view such as ``w.t()``), read as they lie (but, on the SIMT kernel, a
    column-major ``b`` with 1024 rows of ``a`` or more, which runs faster from a row-major copy); up to 8 rows times a transposed
    weight (``x @ w.t()``) or a row-major one (``x @ w``), and N up to 8 as its transpose, run on the GEMV variant (``GemvConfig``); rows
    that are not 16-byte aligned run on aligned, zero-padded copies from 1800^3 of work (``op.StagedLaunch``).
    ``c``: the result's shape (another layout than row-major read from a row-major copy), or any shape
    that broadcasts to it as
    ``torch.addmm``'s / ``torch.baddbmm``'s input does (a bias (N,), a column (M, 1), a scalar: read
    through its expansion); read only when ``beta != 0`` (NaN in ``c`` cannot leak otherwise). ``out``: a
    float32 tensor of the result's shape, row-major matrices, to write (``out=c`` updates ``c`` in place);
    it must not overlap ``a`` or ``b``. Returns ``out`` (or a new tensor). Errors name the argument;
    nothing is written on an error. Differentiable in ``a``, ``b`` and ``c`` (``ck.sgemm``; its backward
    runs these GEMMs on transposed views).
    """
    return run_gemm(a, b, c, alpha, beta, out, config, _POLICY, _PLANS)


_PLANS = CallPlans("sgemm")  # by call structure: runtime.plans

# A K-major b goes into its N-major stage by 4-byte transposing copies: at 4096^3 that ran 0.90x cuBLAS
# where a row-major copy of b and the vector path ran 0.97x (docs/notes/gemm.md). The copy's share of
# the work falls as 1/M (K * N floats moved once against 2 * M * N * K flops), so it is taken from M =
# 1024 up (a few percent), and b is read as it lies below that.
COPY_K_MAJOR_B_MIN_ROWS = 1024


def _copies(problem: GemmProblem) -> tuple[bool, bool]:
    """(copy_a, copy_b) for ``GemmPolicy.copies``: an M-major a runs as it lies (vector copies along M); a K-major b
    is copied row-major for M >= ``COPY_K_MAJOR_B_MIN_ROWS`` where the op runs it on the SIMT kernel (the
    only one whose stage transposes it: the transposed GEMV and the 3xTF32 kernel read it as it lies)."""
    return False, (problem.b_major == "k" and problem.m >= COPY_K_MAJOR_B_MIN_ROWS
                   and _variant_order(problem)[0].variant == SPEC.variant)


# ---------------------------------------------------------------------------------------------- registry
SPEC = register(
    sgemm_spec(
        variant="simt_cpasync",
        config_cls=GemmConfig,
        default_config=default_config,
        candidates=candidates,
        why_unsupported=why_unsupported,
        compile=compile,
        prepare=prepare,
        description="FP32 SIMT GEMM: cp.async multistage pipeline, 4x4-blocked register micro-tiles, FFMA",
        bound="fp32",
        sweep_axes=(("tile_m", "tile_n", "tile_k"), ("num_stages",)),
    )
)


def _gemv_standard_problems() -> list[GemmProblem]:
    """Decode steps through a transposed weight: 1 and 8 rows against a 4096 x 4096 weight."""
    return [GemmProblem(m=m, n=4096, k=4096, beta_zero=True, a_align=4, b_align=4, c_align=4, b_major="k")
            for m in (1, 8)]


GEMV_SPEC = register(sgemm_spec(**_gemv.gemv_fields(_gemv_standard_problems)))


# M or N up to this many run on the SIMT kernel's skinny rungs (32x32 tiles, the 128x32 skinny-N tile), whose
# tiles compute no rows or columns of zeros; the 3xTF32 kernel's tiles are 64 wide at least.
TF32X3_MIN_MN = 32


def takes_tf32x3(problem: GemmProblem) -> bool:
    """Whether the op's default runs ``problem`` on the 3xTF32 entry: sm_80 and newer (TF32 MMAs), M and N
    above ``TF32X3_MIN_MN``. It is 1.3-1.4x cuBLAS's FFMA GEMM on the large squares and ahead of the SIMT
    kernel on every everyday shape the H200 probe tried (docs/notes/gemm.md, "SGEMM on tensor cores")."""
    return problem.sm >= 80 and min(problem.m, problem.n) > TF32X3_MIN_MN


def _variant_order(problem: GemmProblem) -> tuple:
    """The GEMV variant for the few-row calls it takes (``gemv.takes``) and the skinny-N calls it runs
    transposed (``gemv.takes_transposed``: the zoo files them under it), the Hopper 3xTF32 GEMM where
    ``sgemm_sm90.takes`` (large aligned products on sm_90), the sm80-style 3xTF32 GEMM where
    :func:`takes_tf32x3`, the SIMT GEMM elsewhere."""
    if _gemv.takes(problem) or _gemv.takes_transposed(problem):
        return GEMV_SPEC, SPEC, _tf32x3.SPEC, _sm90.SPEC
    if _sm90.takes(problem):
        return _sm90.SPEC, _tf32x3.SPEC, SPEC, GEMV_SPEC
    if takes_tf32x3(problem):
        return _tf32x3.SPEC, SPEC, GEMV_SPEC, _sm90.SPEC
    return SPEC, GEMV_SPEC, _tf32x3.SPEC, _sm90.SPEC


# Misaligned rows (a row of A, B or C/out not a multiple of 16 bytes) make the cp.async kernel copy that
# operand in 4-byte pieces; from this much work the op copies it into an aligned, zero-padded buffer instead
# (op.StagedLaunch: one torch op per copy) and runs the aligned kernel. H200 probe in docs/notes/gemm.md,
# "Unaligned rows".
# Staging lost below this on the H200 (in place against staged, us: 1000x1000x999 56.0 / 72.5, 2047x2049x1023
# 226.6 / 239.0, 3001x777x2000 282.8 / 288.9) and won above it (2048x2048x2047 399.2 / 382.0, 4001^3
# 3135 / 2826; cuBLAS 349, 2802).
STAGE_MIN_WORK = 1800 ** 3


def _stage_unaligned(problem: GemmProblem) -> bool:
    """Whether the op runs a misaligned problem on aligned, zero-padded copies of its operands
    (``op.StagedLaunch``): one product of ``STAGE_MIN_WORK`` or more, not the calls the GEMV variant
    takes (a copy of the weight would cost more than the call) and not decode-sized rows."""
    return stages_misaligned(problem, STAGE_MIN_WORK) and min(problem.m, problem.n) > 32


def _runs_as(problem: GemmProblem) -> GemmProblem:
    """The problem the op's kernel runs for ``problem``: its aligned twin where the op stages it, the
    transposed GEMV's for a skinny N."""
    if _stage_unaligned(problem):
        return staged_problem(problem, 4)[0]
    return _gemv.transposed_problem(problem) if _gemv.takes_transposed(problem) else problem


_POLICY = GemmPolicy(DTYPES, (SPEC, GEMV_SPEC, _tf32x3.SPEC, _sm90.SPEC), order=_variant_order,
                     stage=_stage_unaligned, copies=_copies, swap=swaps)

register_zoo("sgemm", sgemm_zoo, lambda problem: _variant_order(problem)[0], sgemm_held_out, _runs_as,
             op_call(sgemm))
