"""The tensor-core variant of ``sgemm`` (registry entry ``sgemm/tf32x3_mma``): FP32 GEMM as three TF32 MMAs
per product (big x big + big x small + small x big) with each k-tile's sums folded into FP32, as accurate as
an FFMA GEMM (the oracle of the SIMT entry: twice cuBLAS's FP32 error). Its kernel is
:class:`~.sgemm_tf32x3_kernel.Tf32x3GemmKernel` (the sm80-style HGEMM's pipeline with another MMA and main
loop); this module holds its sweep space, validity predicate, default heuristic, compile/launch and the
registry entry. The public op is ``sgemm.sgemm``, which runs this entry where ``sgemm`` routes to it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ...registry import register
from ...runtime import device as _device
from ...runtime.cute_compile import CompileCache
from ...runtime.device import H200_SM_COUNT
from .compile import CompiledLaunch, alignment_vectors, compile_cached, compile_kernel, gemm_launch
from .compile import compile_key as gemm_compile_key
from .ladder import choose_from_ladder, warp_mma_problem
from .problem import GemmProblem
from .sgemm_tf32x3_config import Tf32x3GemmConfig
from .spec import sgemm_spec
from .split_k import SPLIT_K_CHOICES, split_k_for

__all__ = ["candidates", "default_config", "why_unsupported", "compile", "compile_key", "prepare", "SPEC"]

# The tiles whose fragment registers fit (``Tf32x3GemmConfig.fragment_registers``): tile_m, tile_n, warps_m,
# warps_n.
_TILES = (
    (128, 128, 2, 4),
    (128, 64, 2, 2),
    (64, 128, 2, 2),
    (64, 64, 2, 2),
)


def candidates() -> list[Tf32x3GemmConfig]:
    """The sweep space: the tiles of ``_TILES`` x tile_k 16/32 x 2..5 stages, then the ladder's three
    smaller rungs split in 2 and 4. ``why_unsupported`` prunes it per problem (shared memory, alignment).
    Registers are estimated, not compiled: some of these spill (128x64 at tile_k 32, most big tiles with
    rows that are not 16-byte aligned; see the ladders)."""
    out = [Tf32x3GemmConfig(tile_m=tm, tile_n=tn, tile_k=tk, num_stages=s, warps_m=wm, warps_n=wn)
           for tm, tn, wm, wn in _TILES for tk in (16, 32) for s in (2, 3, 4, 5)]
    for rung, _, _ in _LADDER[1:]:
        out += [c for c in (dataclasses.replace(rung, split_k=split) for split in SPLIT_K_CHOICES[1:3]) if c not in out]
    return out


# The default ladder, largest tile first: (config, CTAs one SM holds, relative throughput of a full SM).
# Registers from ptxas (sm_90a, 16-byte rows): 128x128 (8 warps) 208 -> 1 CTA per SM; 64x128 216 x 128
# threads -> 2; 128x64 at tile_k 16 218 -> 2 (232 at tile_k 32); 64x64 128 -> 4 (counted as 3, the figure
# the probe's choices below were checked against); none spills. H200 probe
# (docs/notes/gemm.md, "SGEMM on tensor cores"): 128x128 s4 leads the large squares (4096^3 2007 us, cuBLAS
# 2678), 64x64 the shapes of a few waves of it (1536^3 146 us against 128x64's 156; 777x3001x2000 205 against
# 64x128's 233), 128x64x16 s4 2047x2049x1023 (169 us against 128x64x32's 183).
_LADDER = (
    (Tf32x3GemmConfig(tile_m=128, tile_n=128, tile_k=32, num_stages=4, warps_m=2, warps_n=4), 1, 1.0),
    (Tf32x3GemmConfig(tile_m=64, tile_n=128, tile_k=32, num_stages=3, warps_m=2, warps_n=2), 2, 1.0),
    (Tf32x3GemmConfig(tile_m=128, tile_n=64, tile_k=16, num_stages=4, warps_m=2, warps_n=2), 2, 0.97),
    (Tf32x3GemmConfig(tile_m=64, tile_n=64, tile_k=32, num_stages=3, warps_m=2, warps_n=2), 3, 0.85),
)
# Rows that are not 16-byte aligned copy element by element, and the per-copy predicates and addresses make
# every bigger tile spill (ptxas: 128x128, 64x128 and 128x64 255 registers + 96-104 bytes); 64x64 takes 164.
# The probe ran 777x3001x2000 (B, C misaligned) at 205 us on it, the best, and 2047x2049x1023 at 189 against
# 128x64's 183.
_NARROW_LADDER = (_LADDER[-1],)
# Split-K up to about one and a half CTAs per SM, slices of at least 8 k-tiles.
_SPLIT_TARGET_CTAS = 3 * H200_SM_COUNT // 2
_MAX_SPLIT = 4


def default_config(problem: GemmProblem) -> Tf32x3GemmConfig:
    """The ladder entry with the smallest estimated time for the problem's M x N (``ladder.estimated_time``;
    64x64 tiles where any operand's rows are not 16-byte aligned), K split (up to ``_MAX_SPLIT``) where its
    tiles leave SMs idle."""
    aligned = min(problem.a_align, problem.b_align, problem.c_align) == 4
    config = choose_from_ladder(_LADDER if aligned else _NARROW_LADDER, problem, why_unsupported=why_unsupported,
                                candidates=candidates, family="3xTF32 SGEMM")
    if problem.batch == 1:
        split = dataclasses.replace(config, split_k=split_k_for(config, problem, _SPLIT_TARGET_CTAS, _MAX_SPLIT))
        if why_unsupported(split, problem) is None:
            return split
    return config


def why_unsupported(config: Tf32x3GemmConfig, problem: GemmProblem) -> "str | None":
    """The one validity predicate (None = supported), checked before anything is compiled. Registers are
    checked by the config itself (they do not depend on the problem)."""
    if not isinstance(config, Tf32x3GemmConfig):
        return f"config must be a Tf32x3GemmConfig, got {type(config).__name__}"
    if problem.dtype != "float32":
        return f"the 3xTF32 sgemm computes float32 only, problem dtype is {problem.dtype}"
    if problem.sm < 80:
        return f"TF32 MMAs need sm_80 or newer, the device is sm_{problem.sm}"
    return warp_mma_problem(config, problem)


# ---------------------------------------------------------------------------------------------- compile
# Kept on disk too, keyed by the sources of this package (the kernels and the code that shapes them).
_CACHE = CompileCache("sgemm_tf32x3", Path(__file__).parent)



def compile_key(config: Tf32x3GemmConfig, problem: GemmProblem, arch: str) -> tuple:
    """Every compile-time property, nothing dynamic: sizes and leading dimensions are runtime values."""
    return gemm_compile_key("sgemm_tf32x3", config, problem, alignment_vectors(problem), arch)


def compile(config: Tf32x3GemmConfig, problem: GemmProblem, arch: str | None = None):  # noqa: A001
    """Compile (or fetch from the cache) the binary for ``config`` and the problem's compile-time traits;
    works without a GPU (fake tensors, ``arch`` explicit or ``CUTE_DSL_ARCH``)."""
    return compile_cached(_CACHE, config, problem, arch, why_unsupported=why_unsupported, key=compile_key,
                          build=_build)


def _build(config: Tf32x3GemmConfig, problem: GemmProblem, arch: str):
    import cutlass

    from .sgemm_tf32x3_kernel import Tf32x3GemmKernel

    av, bv, cv = vectors = alignment_vectors(problem)
    kernel = Tf32x3GemmKernel(config, dtype="float32", a_vector=av, b_vector=bv, c_vector=cv,
                              beta_zero=problem.beta_zero, batched=problem.batch > 1, a_major=problem.a_major,
                              b_major=problem.b_major)
    return compile_kernel(kernel, cutlass.Float32, vectors, arch, problem, split=config.split_k > 1)


def prepare(config: Tf32x3GemmConfig, problem: GemmProblem, inputs: dict, out) -> CompiledLaunch:
    """The compiled launch of ``config`` for ``problem`` on ``out``'s device (compiled on first use)."""
    return gemm_launch(compile(config, problem, _device.arch(out.device.index, arch_specific=True)), config, problem,
                       out.device.index)


# ---------------------------------------------------------------------------------------------- registry
SPEC = register(
    sgemm_spec(
        variant="tf32x3_mma",
        config_cls=Tf32x3GemmConfig,
        default_config=default_config,
        candidates=candidates,
        why_unsupported=why_unsupported,
        compile=compile,
        prepare=prepare,
        description="FP32 GEMM on tensor cores: 3xTF32 mma.sync m16n8k8 (big/small halves), each k-tile's "
                    "sums folded into FP32; cp.async multistage, swizzled smem, smem-staged epilogue",
        bound="tf32x3",
        sweep_axes=(("tile_m", "tile_n", "tile_k"), ("num_stages",)),
    )
)
