"""FP16/BF16 tensor-core GEMM (CuTe DSL, mma.sync): ``hgemm(a, b, c=None, *, alpha=1.0, beta=0.0, out=None,
config=None)``.

``a`` (M,K) and ``b`` (K,N) are row-major float16 or bfloat16 CUDA tensors of one dtype (any leading
dimension, unit stride in the last dim); the products accumulate in FP32 and the result
``alpha * a @ b + beta * c`` is computed in FP32 and rounded once to the input dtype. ``c`` is read only
when beta != 0; ``out=c`` updates ``c`` in place. 16-byte aligned rows (multiples of 8 elements, aligned
base) take 128-bit copies everywhere; anything else runs with narrower (8-, 4-byte cp.async, 2-byte
synchronous) copies, predicated, never out of bounds. The kernel is
:class:`~.hgemm_kernel.HgemmKernel`; this module holds the sweep space, the validity predicate, the default
heuristic, compile/launch, the public op and the registry entry.
"""

from __future__ import annotations

import dataclasses

import torch

from ..registry import register
from ..runtime.cute_compile import CompileCache, device_arch
from ..testing import HALF_GEMM_FLOOR_EPS, gemm_scale
from . import problem as _gemm
from .config import SMEM_BYTES_SM90
from .hgemm_config import HgemmConfig
from .hgemm_sm90_config import HgemmSm90Config  # noqa: F401 (the Hopper variant's config, for callers)
from .problem import GemmProblem, make_problem, shape_bucket  # noqa: F401 (make_problem: the GPU tests use it)

__all__ = [
    "hgemm",
    "candidates",
    "default_config",
    "why_unsupported",
    "compile",
    "compile_key",
    "launch",
    "SPEC",
]

DTYPES = (torch.float16, torch.bfloat16)
_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


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
    order). ``why_unsupported`` prunes it per problem (shared memory, alignment)."""
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
    return out


# The default ladders, largest tile first: (config, CTAs one SM holds, relative throughput of a full SM).
# CTAs per SM from ptxas (sm_90a, fp16, beta != 0): with 16-byte rows, 128x256 uses 240 registers x 256
# threads -> 1; 128x128 (4 warps) 234 x 128 -> 2; 64x128 160 x 128 -> 3; 64x64 96 x 128 -> 5 (shared memory
# allows more). With narrower copies each thread issues up to 8x more of them and keeps more predicates:
# 128x256 and 4-warp 128x128 spill there (255 registers + 16 / 144 bytes), 8-warp 128x128 does not (254 at
# 2-byte copies), 64x128 takes 190 (2 CTAs/SM), 64x64 168 (3). Throughputs are estimates (a smaller warp
# tile reads more shared memory per MMA) until the H200 probe measures them.
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


def default_config(problem: GemmProblem) -> HgemmConfig:
    """The ladder entry with the smallest estimated time for the problem's M x N (``problem.estimated_time``):
    128x256 tiles when they fill the GPU's 132 SMs in whole waves, smaller ones when a big tile's last wave
    would leave most SMs idle. Problems without 16-byte rows everywhere use the ladder whose configs do not
    spill with narrow copies."""
    aligned = min(problem.a_align, problem.b_align, problem.c_align) == 8
    return _gemm.choose_from_ladder(_LADDER if aligned else _NARROW_LADDER, problem,
                                    why_unsupported=why_unsupported, candidates=candidates, family="HGEMM")


def why_unsupported(config: HgemmConfig, problem: GemmProblem) -> "str | None":
    """The one validity predicate (None = supported), checked before anything is compiled. Registers are
    checked by ``HgemmConfig`` itself (they do not depend on the problem)."""
    if not isinstance(config, HgemmConfig):
        return f"config must be an HgemmConfig, got {type(config).__name__}"
    if problem.dtype not in _DTYPE_NAMES.values():
        return f"hgemm computes float16/bfloat16 only, problem dtype is {problem.dtype}"
    why = _gemm.smem_problem(config.smem_bytes(), SMEM_BYTES_SM90)
    if why is not None:
        return why
    return _gemm.copy_layouts_problem(config, problem.a_align, problem.b_align)


# ---------------------------------------------------------------------------------------------- compile
_CACHE = CompileCache()


def _vectors(problem: GemmProblem) -> tuple[int, int, int]:
    """Copy widths of A, B and C/D: the widest each operand's alignment allows (the kernel has copies of
    every width down to one element)."""
    return problem.a_align, problem.b_align, problem.c_align


def compile_key(config: HgemmConfig, problem: GemmProblem, arch: str) -> tuple:
    """Every compile-time property, nothing dynamic: sizes and leading dimensions are runtime values."""
    return _gemm.compile_key("hgemm", config, problem.dtype, _vectors(problem), problem.beta_zero, arch)


def compile(config: HgemmConfig, problem: GemmProblem, arch: str | None = None):  # noqa: A001
    """Compile (or fetch from the cache) the binary for ``config`` and the problem's compile-time traits.

    Works without a GPU: tensors are fake (dynamic M, N, K and leading dimensions) and ``arch`` is passed
    to the compiler explicitly (default: ``CUTE_DSL_ARCH`` or the current device).
    """
    return _gemm.compile_cached(_CACHE, config, problem, arch, why_unsupported=why_unsupported, key=compile_key,
                                build=_build)


def _build(config: HgemmConfig, problem: GemmProblem, arch: str):
    from .hgemm_kernel import DTYPES as CUTE_DTYPES
    from .hgemm_kernel import HgemmKernel

    av, bv, cv = vectors = _vectors(problem)
    kernel = HgemmKernel(config, dtype=problem.dtype, a_vector=av, b_vector=bv, c_vector=cv,
                         beta_zero=problem.beta_zero)
    return _gemm.compile_kernel(kernel, CUTE_DTYPES[problem.dtype], vectors, arch)


def launch(config: HgemmConfig, problem: GemmProblem, inputs: dict, out) -> None:
    """Run on ``out``'s device and torch's current stream. ``inputs``: a, b, optional c, alpha, beta.

    The caller has validated the tensors against ``problem`` (see ``problem.launch_compiled``).
    """
    compiled = compile(config, problem, device_arch(out.device))
    _gemm.launch_compiled(compiled, problem, inputs, out)


# ---------------------------------------------------------------------------------------------- public op
def hgemm(a, b, c=None, *, alpha=1.0, beta=0.0, out=None, config=None):
    """``alpha * a @ b + beta * c`` with FP32 accumulation on ``a``'s CUDA device and torch's current stream.

    ``a``: (M, K), ``b``: (K, N), ``c``: (M, N), all float16 or all bfloat16, row-major (stride 1 in the
    last dim, any leading dimension). alpha and beta are applied in FP32 and the result is rounded once to
    the input dtype. ``c`` is read only when ``beta != 0`` (NaN in ``c`` cannot leak otherwise). ``out``: an
    (M, N) tensor of the same dtype to write (``out=c`` updates ``c`` in place); it must not overlap ``a``
    or ``b``. Returns ``out`` (or a new tensor). Errors name the argument; nothing is written on an error.

    Variants: on an sm_90 GPU with operands TMA can describe (16-byte aligned base addresses and rows) and
    at least 4096^3 of work, the Hopper kernel (``hgemm_sm90``, TMA + wgmma) runs; elsewhere this module's
    sm80-style one (cp.async + mma.sync, any alignment). ``config`` picks the variant by its type: an ``HgemmSm90Config`` or an
    ``HgemmConfig``; with None, the tuned or heuristic config of the first variant that supports the call.
    """
    return _gemm.run_gemm(a, b, c, alpha=alpha, beta=beta, out=out, config=config, dtypes=DTYPES,
                          specs=(_sm90.SPEC, SPEC), order=_variant_order)


def _variant_order(problem) -> tuple:
    """The variants to try, in order: the Hopper kernel first for problems it is measured fast on."""
    return (_sm90.SPEC, SPEC) if _sm90.prefers(problem) else (SPEC, _sm90.SPEC)


# ---------------------------------------------------------------------------------------------- registry
def baseline(problem: GemmProblem, inputs: dict):
    """cuBLAS through torch in the same dtype (FP32 accumulation, one rounding of the result)."""
    if problem.beta_zero:
        return torch.mm(inputs["a"], inputs["b"]).mul_(inputs.get("alpha", 1.0))
    return torch.addmm(inputs["c"], inputs["a"], inputs["b"], beta=inputs["beta"], alpha=inputs["alpha"])


def error_scale(problem: GemmProblem, inputs: dict):
    """Per-element scale of the oracle: the magnitude of the result (``testing.gemm_scale`` with
    ``k_growth=False``). A 16-bit result accumulated in FP32 is off by its final rounding, at most half an
    ulp of that magnitude, so ours passes ``testing.compare``'s floor of a few ulps whatever cuBLAS does,
    while a lost K term (~1/sqrt(K) of it) or a wrong element does not."""
    return gemm_scale(
        inputs["a"], inputs["b"], inputs.get("c"), alpha=inputs.get("alpha", 1.0), beta=inputs.get("beta", 0.0),
        k_growth=False,
    )


def standard_problems() -> list[GemmProblem]:
    """The issues' sizes: 4096^3 and 8192^3 in both dtypes, then LeetGPU's 1024^3 (latency-bound)."""
    return [GemmProblem(m=s, n=s, k=s, dtype=d, beta_zero=True, a_align=8, b_align=8, c_align=8)
            for d in ("float16", "bfloat16") for s in (4096, 8192)] + [
        GemmProblem(m=1024, n=1024, k=1024, dtype="float16", beta_zero=True, a_align=8, b_align=8, c_align=8)]


SPEC = register(
    _gemm.gemm_spec(
        op="hgemm",
        variant="sm80_mma",
        dtypes=DTYPES,
        config_cls=HgemmConfig,
        default_config=default_config,
        candidates=candidates,
        why_unsupported=why_unsupported,
        compile=compile,
        launch=launch,
        baseline=baseline,
        standard_problems=standard_problems,
        description="FP16/BF16 tensor-core GEMM: cp.async multistage, swizzled smem, ldmatrix, mma.sync "
                    "m16n8k16 (FP32 accumulate), smem-staged epilogue",
        baseline_name="torch.mm / torch.addmm (cuBLAS)",
        bound="fp16",
        sweep_axes=(("tile_m", "tile_n", "tile_k"), ("num_stages",)),
        shape_bucket=shape_bucket,
        error_scale=error_scale,
        error_floor_eps=HALF_GEMM_FLOOR_EPS,  # the same oracle as testing.gemm_verdict
    )
)

# The Hopper variant registers itself on import and reuses this module's registry pieces (baseline,
# error_scale, standard_problems), so it is imported last; ``hgemm`` above dispatches to it at call time.
from . import hgemm_sm90 as _sm90  # noqa: E402
