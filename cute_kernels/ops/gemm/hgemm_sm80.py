"""The sm80-style variant of ``hgemm`` (registry entry ``hgemm/sm80_mma``): cp.async multistage pipeline
and mma.sync tensor-core MMAs, FP32 accumulation.

It runs any alignment: 16-byte aligned rows (multiples of 8 elements, aligned base) take 128-bit copies
everywhere; anything else runs with narrower (8-, 4-byte cp.async, 2-byte synchronous) copies, predicated,
never out of bounds. The public op is ``hgemm.hgemm``. The kernel is
:class:`~.hgemm_sm80_kernel.HgemmKernel`; this module holds the sweep space, the validity predicate, the
default heuristic, compile/launch and the registry entry.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ...registry import register
from ...runtime import device as _device
from ...runtime.device import H200_SM_COUNT
from ...runtime.cute_compile import CompileCache
from .compile import CompiledLaunch, alignment_vectors, compile_cached, compile_kernel, gemm_launch
from .compile import compile_key as gemm_compile_key
from .hgemm_sm80_config import HgemmConfig
from .ladder import choose_from_ladder, warp_mma_problem
from .split_k import SPLIT_K_CHOICES
from .split_k import split_k_for as split_k_within
from .problem import GemmProblem
from .spec import HGEMM_DTYPE_NAMES, hgemm_spec

__all__ = [
    "candidates",
    "default_config",
    "why_unsupported",
    "compile",
    "compile_key",
    "prepare",
    "SPEC",
]


# ---------------------------------------------------------------------------------------------- configs
_TILES = (  # tile_m, tile_n, warps_m, warps_n: 64x64 warp tiles for the big ones, 32x64 .. 32x32 below
    (128, 256, 2, 4),
    (256, 128, 4, 2),
    (128, 128, 2, 4),
    (128, 128, 2, 2),
    (128, 64, 2, 2),
    (64, 128, 2, 2),
    (64, 64, 2, 2),
)


def candidates() -> list[HgemmConfig]:
    """The sweep space: the CTA tiles of ``_TILES`` (4 or 8 warps) x tile_k 32/64 x 2..5 stages with
    rasterization on, plus variants of the big tiles (4-atom N permutation, a 128x32 warp tile, plain tile
    order) and the split-K configs (decode rows of 16 and 32, skinny N; every split). ``why_unsupported``
    prunes it per problem (shared memory, alignment)."""
    out = []
    for tile_m, tile_n, warps_m, warps_n in _TILES:
        for tile_k in (32, 64):
            for num_stages in (2, 3, 4, 5):
                out.append(HgemmConfig(tile_m=tile_m, tile_n=tile_n, tile_k=tile_k, num_stages=num_stages,
                                       warps_m=warps_m, warps_n=warps_n))
    big = HgemmConfig()  # 128x256x32, 4 stages, 2x4 warps
    out += [
        dataclasses.replace(big, n_atoms=4),
        dataclasses.replace(big, raster=1),
        dataclasses.replace(big, tile_k=64, num_stages=3, n_atoms=4),
        HgemmConfig(tile_m=256, tile_n=128, warps_m=2, warps_n=4),
        HgemmConfig(tile_m=256, tile_n=128, warps_m=2, warps_n=4, n_atoms=4),
    ]
    # Split-K for the shapes that leave SMs idle: the decode row tiles and the skinny-N tile, each split.
    for base in (_DECODE_ROWS, dataclasses.replace(_DECODE_ROWS, tile_m=32), _SKINNY_N):
        out += [c for c in (dataclasses.replace(base, split_k=split) for split in SPLIT_K_CHOICES) if c not in out]
    return out


# The default ladders, largest tile first: (config, CTAs one SM holds, relative throughput of a full SM).
# CTAs per SM from ptxas (sm_90a, fp16, beta != 0): with 16-byte rows, 128x256 uses 240 registers x 256
# threads -> 1; 128x128 (4 warps) 234 x 128 -> 2; 64x128 160 x 128 -> 3; 64x64 96 x 128 -> 5 (shared memory
# allows more). With narrower copies each thread issues up to 8x more of them and keeps more predicates:
# 128x256 and 4-warp 128x128 spill there (255 registers + 16 / 144 bytes), 8-warp 128x128 does not (254 at
# 2-byte copies), 64x128 takes 190 (2 CTAs/SM), 64x64 168 (3). The throughputs are estimates, not
# measurements: a smaller warp tile reads more shared memory per MMA.
_LADDER = (
    (HgemmConfig(), 1, 1.0),
    (HgemmConfig(tile_m=128, tile_n=128, warps_m=2, warps_n=2), 2, 0.95),
    (HgemmConfig(tile_m=64, tile_n=128, warps_m=2, warps_n=2), 3, 0.8),
    (HgemmConfig(tile_m=64, tile_n=64, warps_m=2, warps_n=2, num_stages=3), 5, 0.6),
)
_NARROW_LADDER = (
    (HgemmConfig(tile_m=128, tile_n=128, warps_m=2, warps_n=4), 1, 0.9),
    (HgemmConfig(tile_m=64, tile_n=128, warps_m=2, warps_n=2), 2, 0.8),
    (HgemmConfig(tile_m=64, tile_n=64, warps_m=2, warps_n=2, num_stages=3), 3, 0.6),
)


# Problems whose M x N tiles leave most SMs idle while K is long (the H200 probe in docs/notes/gemm.md,
# "Split-K"): decode rows (M up to 32) take row tiles of 16 or 32 that compute no rows of zeros past M, and
# skinny N (N up to 64) 128x64 tiles; both split K until about 1.5 CTAs per SM are running.
_DECODE_ROWS = HgemmConfig(tile_m=16, tile_n=128, tile_k=64, num_stages=4, warps_m=1, warps_n=4)
# Decode rows against a narrow weight (N up to _DECODE_NARROW_N) halve the tile's columns, so twice the
# CTAs stream the weight at the same split: on the H100 (fp16, same-run cuBLAS) 16x1024x4096 ran 0.96x on
# 16x64 tiles split 8 (128 CTAs) against 0.92x on 16x128 split 8 (64 CTAs) and 0.85x split 16. Rows of A
# that are not 16-byte aligned keep the 128 columns their short slices were timed on (below).
_DECODE_NARROW_N = 1024
_SKINNY_N = HgemmConfig(tile_m=128, tile_n=64, tile_k=32, num_stages=4, warps_m=2, warps_n=2)
_SPLIT_TARGET_CTAS = 3 * H200_SM_COUNT // 2


# Decode rows whose A rows are not 16-byte aligned copy A element by element, so each k-tile waits longer on
# its loads and more CTAs in flight pay even on short slices: 12 x 1000 x 999 (16 k-tiles) took 15.8 us split
# in 2 (slices of 8), 12.2 in 4 and 11.2 in 8 (slices of 2), cuBLAS 10.5 (fp16; bf16 the same, cuBLAS 13.1;
# H200 probe, docs/notes/gemm.md).
_MISALIGNED_DECODE_MIN_K_TILES = 2


def split_k_for(config: HgemmConfig, problem: GemmProblem) -> int:
    """The split of ``config``'s K walk for ``problem`` (``split_k.split_k_for``, up to ~1.5 CTAs per SM);
    decode rows with a misaligned A keep slices as short as ``_MISALIGNED_DECODE_MIN_K_TILES``."""
    if config.tile_m <= 32 and problem.a_align < 8:
        return split_k_within(config, problem, _SPLIT_TARGET_CTAS, min_k_tiles=_MISALIGNED_DECODE_MIN_K_TILES)
    return split_k_within(config, problem, _SPLIT_TARGET_CTAS)


def default_config(problem: GemmProblem) -> HgemmConfig:
    """Decode rows (M <= 32) take the 16- or 32-row tile (64 columns wide up to N = 1024 where A's rows are
    16-byte aligned, else 128) and skinny N (N <= 64, M larger) the 128x64 one, each split as
    :func:`split_k_for` says (possibly not at all). Everything else takes the ladder entry with the smallest
    estimated time for the problem's M x N (``ladder.estimated_time``): 128x256 tiles when they fill the
    GPU's 132 SMs in whole waves, smaller ones when a big tile's last wave would leave most SMs idle.
    Problems without 16-byte rows everywhere use the ladder whose configs do not spill with narrow copies."""
    skinny = None
    if problem.m <= 32:
        skinny = dataclasses.replace(_DECODE_ROWS, tile_m=16 if problem.m <= 16 else 32,
                                     tile_n=64 if problem.n <= _DECODE_NARROW_N and problem.a_align == 8 else 128)
    elif problem.n <= 64:
        skinny = _SKINNY_N
    if skinny is not None:
        skinny = dataclasses.replace(skinny, split_k=split_k_for(skinny, problem) if problem.batch == 1 else 1)
        if why_unsupported(skinny, problem) is None:
            return skinny
    aligned = min(problem.a_align, problem.b_align, problem.c_align) == 8
    return choose_from_ladder(_LADDER if aligned else _NARROW_LADDER, problem,
                              why_unsupported=why_unsupported, candidates=candidates, family="HGEMM")


def why_unsupported(config: HgemmConfig, problem: GemmProblem) -> "str | None":
    """The one validity predicate (None = supported), checked before anything is compiled. Registers are
    checked by ``HgemmConfig`` itself (they do not depend on the problem)."""
    if not isinstance(config, HgemmConfig):
        return f"config must be an HgemmConfig, got {type(config).__name__}"
    if problem.dtype not in HGEMM_DTYPE_NAMES:
        return f"hgemm computes float16/bfloat16 only, problem dtype is {problem.dtype}"
    return warp_mma_problem(config, problem)


# ---------------------------------------------------------------------------------------------- compile
# Kept on disk too, keyed by the sources of this package (the kernels and the code that shapes them).
_CACHE = CompileCache("hgemm_sm80", Path(__file__).parent)



def compile_key(config: HgemmConfig, problem: GemmProblem, arch: str) -> tuple:
    """Every compile-time property, nothing dynamic: sizes and leading dimensions are runtime values."""
    return gemm_compile_key("hgemm", config, problem, alignment_vectors(problem), arch)


def compile(config: HgemmConfig, problem: GemmProblem, arch: str | None = None):  # noqa: A001
    """Compile (or fetch from the cache) the binary for ``config`` and the problem's compile-time traits.

    Works without a GPU: tensors are fake (dynamic M, N, K and leading dimensions) and ``arch`` is passed
    to the compiler explicitly (default: ``CUTE_DSL_ARCH`` or the current device).
    """
    return compile_cached(_CACHE, config, problem, arch, why_unsupported=why_unsupported, key=compile_key,
                          build=_build)


def _build(config: HgemmConfig, problem: GemmProblem, arch: str):
    from .hgemm_sm80_kernel import DTYPES as CUTE_DTYPES
    from .hgemm_sm80_kernel import HgemmKernel

    av, bv, cv = vectors = alignment_vectors(problem)
    kernel = HgemmKernel(config, dtype=problem.dtype, a_vector=av, b_vector=bv, c_vector=cv,
                         beta_zero=problem.beta_zero, batched=problem.batch > 1, a_major=problem.a_major,
                         b_major=problem.b_major)
    return compile_kernel(kernel, CUTE_DTYPES[problem.dtype], vectors, arch, problem, split=config.split_k > 1)


def prepare(config: HgemmConfig, problem: GemmProblem, inputs: dict, out) -> CompiledLaunch:
    """The compiled launch of ``config`` for ``problem`` on ``out``'s device (compiled on first use); the
    caller validates the tensors it is given against ``problem`` (see ``compile.CompiledLaunch``)."""
    return gemm_launch(compile(config, problem, _device.arch(out.device.index, arch_specific=True)), config, problem,
                       out.device.index)


# ---------------------------------------------------------------------------------------------- registry
SPEC = register(
    hgemm_spec(
        variant="sm80_mma",
        config_cls=HgemmConfig,
        default_config=default_config,
        candidates=candidates,
        why_unsupported=why_unsupported,
        compile=compile,
        prepare=prepare,
        description="FP16/BF16 tensor-core GEMM: cp.async multistage, swizzled smem, ldmatrix, mma.sync "
                    "m16n8k16 (FP32 accumulate), smem-staged epilogue",
        sweep_axes=(("tile_m", "tile_n", "tile_k"), ("num_stages",)),
    )
)
