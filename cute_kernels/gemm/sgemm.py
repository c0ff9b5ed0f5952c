"""FP32 SGEMM (CuTe DSL, SIMT FFMA): ``sgemm(a, b, c=None, *, alpha=1.0, beta=0.0, out=None, config=None)``.

``a`` (M,K) and ``b`` (K,N) are row-major float32 CUDA tensors (any leading dimension, unit stride in the
last dim); the result is ``alpha * a @ b + beta * c`` in exact FP32 (no TF32). ``c`` is read only when
beta != 0. ``out=c`` updates ``c`` in place. The kernel is :class:`~.sgemm_kernel.SgemmKernel`; this module
holds the problem description, the sweep space, the validity predicate, compile/launch and the registry
entry.
"""

from __future__ import annotations

import dataclasses

import torch

from ..registry import KernelSpec, register
from ..testing import gemm_scale
from ..runtime.cute_compile import (
    CompileCache,
    default_arch,
    device_arch,
    dsl_version,
    fake_matrix,
    fake_stream,
    to_cute_matrix,
    torch_current_stream,
)
from .config import SMEM_BYTES_SM90, GemmConfig
from .problem import (
    GemmProblem,
    estimated_time,
    make_problem,
    shape_bucket,
    trivial_result,
    unit_strides,
    validate_gemm_args,
)

__all__ = [
    "GemmProblem",
    "sgemm",
    "candidates",
    "default_config",
    "why_unsupported",
    "compile",
    "launch",
    "make_problem",
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
    return out


# The default ladder, largest tile first: (config, CTAs one SM holds, relative throughput of a full SM).
# CTAs per SM follow from ptxas's register counts (cuobjdump -res-usage, sm_90a): 176 x 256 threads -> 1,
# 144 x 128 -> 3, 148 x 64 -> 6, 72 x 64 -> 14 (capped at 8 here: smaller tiles re-read more from L2).
# Throughputs: 128x128 ak s4 and 128x64 from the H200 probe of 2026-11-29 (47.1 and 46.8 TFLOP/s at
# 8192^3, wave-quantisation removed); the two small tiles are estimates.
_LADDER = (
    (GemmConfig(tile_m=128, tile_n=128, tile_k=8, num_stages=4, threads_m=16, threads_n=16, a_smem_major="k"), 1, 1.0),
    (GemmConfig(tile_m=128, tile_n=64, tile_k=8, num_stages=3, threads_m=16, threads_n=8), 3, 0.98),
    (GemmConfig(tile_m=64, tile_n=64, tile_k=8, num_stages=3, threads_m=8, threads_n=8), 6, 0.85),
    (GemmConfig(tile_m=32, tile_n=32, tile_k=8, num_stages=3, threads_m=8, threads_n=8), 8, 0.5),
)


def default_config(problem: GemmProblem) -> GemmConfig:
    """The ladder entry with the smallest estimated time for the problem's M x N: big tiles (most FFMA per
    shared-memory read) when they fill the GPU's 132 SMs in whole waves, smaller ones when a big tile's
    last wave would leave most SMs idle. K-major A needs 16-byte rows of A; otherwise A is transposed."""
    best = None
    for config, ctas, throughput in _LADDER:
        if config.a_smem_major == "k" and problem.a_align != 4:
            config = dataclasses.replace(config, a_smem_major="m", num_stages=3)
        if why_unsupported(config, problem) is not None:
            continue
        t = estimated_time(config, ctas, throughput, problem)
        if best is None or t < best[0]:
            best = (t, config)
    if best is not None:
        return best[1]
    for fallback in candidates():
        if why_unsupported(fallback, problem) is None:
            return fallback
    raise ValueError(f"no SGEMM config supports {problem}")


def _kernel_vectors(config: GemmConfig, problem: GemmProblem) -> tuple[int, int, int]:
    """Copy widths the kernel will actually use (A is copied element-wise when it is transposed)."""
    a_vector = problem.a_align if config.a_smem_major == "k" else 1
    c_vector = problem.c_align if problem.c_align == 4 else 1
    return a_vector, problem.b_align, c_vector


def why_unsupported(config: GemmConfig, problem: GemmProblem) -> "str | None":
    """The one validity predicate (None = supported), checked before anything is compiled."""
    if not isinstance(config, GemmConfig):
        return f"config must be a GemmConfig, got {type(config).__name__}"
    if problem.dtype != "float32":
        return f"sgemm computes float32 only, problem dtype is {problem.dtype}"
    smem = config.smem_bytes()
    if smem > SMEM_BYTES_SM90:
        return f"needs {smem} bytes of shared memory, more than the {SMEM_BYTES_SM90} a CTA may have"
    if config.min_ctas_per_sm * (smem + 1024) > _SMEM_PER_SM_SM90:
        return (
            f"min_ctas_per_sm={config.min_ctas_per_sm} CTAs of {smem} bytes of shared memory do not fit "
            f"in one SM's {_SMEM_PER_SM_SM90} bytes"
        )
    a_vector, b_vector, _ = _kernel_vectors(config, problem)
    for operand, vector in (("a", a_vector), ("b", b_vector)):
        why = config.copy_layout_problem(operand, vector)
        if why is not None:
            return why
    return None


# ---------------------------------------------------------------------------------------------- compile
_CACHE = CompileCache()


def compile_key(config: GemmConfig, problem: GemmProblem, arch: str) -> tuple:
    """Every compile-time property, nothing dynamic: sizes and leading dimensions are runtime values."""
    a_vector, b_vector, c_vector = _kernel_vectors(config, problem)
    return (
        "sgemm",
        config,
        "float32",
        "A:K-major",
        "B:N-major",
        "C:N-major",
        a_vector,
        b_vector,
        c_vector,
        problem.beta_zero,
        arch,
        dsl_version(),
    )


def compile(config: GemmConfig, problem: GemmProblem, arch: str | None = None):  # noqa: A001
    """Compile (or fetch from the cache) the binary for ``config`` and the problem's compile-time traits.

    Works without a GPU: tensors are fake (dynamic M, N, K and leading dimensions) and ``arch`` is passed
    to the compiler explicitly (default: ``CUTE_DSL_ARCH`` or the current device).
    """
    why = why_unsupported(config, problem)
    if why is not None:
        raise ValueError(f"config {config.short()} does not support {problem}: {why}")
    arch = arch or default_arch()
    key = compile_key(config, problem, arch)
    return _CACHE.get(key, lambda: _build(config, problem, arch))


def _build(config: GemmConfig, problem: GemmProblem, arch: str):
    import cutlass
    import cutlass.cute as cute

    from .sgemm_kernel import SgemmKernel

    a_vector, b_vector, c_vector = _kernel_vectors(config, problem)
    kernel = SgemmKernel(config, a_vector=a_vector, b_vector=b_vector, c_vector=c_vector, beta_zero=problem.beta_zero)
    f32 = cutlass.Float32
    m, n, k = cute.sym_int(), cute.sym_int(), cute.sym_int()
    # Each leading dimension is its own symbol; its divisibility is the alignment the caller proved.
    a = fake_matrix(f32, m, k, cute.sym_int64(divisibility=a_vector), row_major=True, align_elems=a_vector)
    b = fake_matrix(f32, n, k, cute.sym_int64(divisibility=b_vector), row_major=False, align_elems=b_vector)
    c = fake_matrix(f32, m, n, cute.sym_int64(divisibility=c_vector), row_major=True, align_elems=c_vector)
    d = fake_matrix(f32, m, n, cute.sym_int64(divisibility=c_vector), row_major=True, align_elems=c_vector)
    return cute.compile(kernel, a, b, c, d, f32(1.0), f32(0.0), fake_stream(), options=f"--gpu-arch {arch}")


def launch(config: GemmConfig, problem: GemmProblem, inputs: dict, out) -> None:
    """Run on ``out``'s device and torch's current stream. ``inputs``: a, b, optional c, alpha, beta.

    The caller has validated the tensors against ``problem`` (shapes, strides, alignment): the compiled
    executor checks nothing.
    """
    import cutlass

    compiled = compile(config, problem, device_arch(out.device))
    a_vector, b_vector, c_vector = _kernel_vectors(config, problem)
    a, b = inputs["a"], inputs["b"]
    c = inputs.get("c")
    if problem.beta_zero or c is None:
        c = out  # never read: the beta == 0 binary has no load of C
    compiled(
        to_cute_matrix(a, align_elems=a_vector),
        to_cute_matrix(b.t(), align_elems=b_vector, row_major=False),  # (N, K) view, N contiguous
        to_cute_matrix(c, align_elems=c_vector),
        to_cute_matrix(out, align_elems=c_vector),
        cutlass.Float32(float(inputs.get("alpha", 1.0))),
        cutlass.Float32(float(inputs.get("beta", 0.0))),
        torch_current_stream(out.device),
    )


# ---------------------------------------------------------------------------------------------- public op
def sgemm(a, b, c=None, *, alpha=1.0, beta=0.0, out=None, config: GemmConfig | None = None):
    """``alpha * a @ b + beta * c`` in exact FP32 on ``a``'s CUDA device and torch's current stream.

    ``a``: (M, K), ``b``: (K, N), ``c``: (M, N) float32, row-major (stride 1 in the last dim, any leading
    dimension). ``c`` is read only when ``beta != 0`` (NaN in ``c`` cannot leak otherwise). ``out``: an
    (M, N) float32 tensor to write (``out=c`` updates ``c`` in place); it must not overlap ``a`` or ``b``.
    Returns ``out`` (or a new tensor). Errors name the argument; nothing is written on an error.
    """
    m, n, k, beta_zero = validate_gemm_args(
        a, b, c, alpha=alpha, beta=beta, out=out, config=config, config_cls=GemmConfig, dtypes=(torch.float32,)
    )
    result = out if out is not None else torch.empty((m, n), dtype=torch.float32, device=a.device)
    if trivial_result(result, c, k=k, beta=beta, beta_zero=beta_zero):
        return result

    a_run, b_run, out_run = unit_strides(a), unit_strides(b), unit_strides(result)
    c_run = unit_strides(c) if (c is not None and not beta_zero) else None
    problem = make_problem(a_run, b_run, c_run, beta=beta, out=out_run)
    if config is None:
        config = SPEC.choose_config(problem, result.device.index)
    why = why_unsupported(config, problem)
    if why is not None:
        raise ValueError(f"config: {config.short()} cannot run {problem}: {why}")
    with torch.cuda.device(result.device):
        launch(config, problem, {"a": a_run, "b": b_run, "c": c_run, "alpha": alpha, "beta": beta}, out_run)
    return result


# ---------------------------------------------------------------------------------------------- registry
def _make_inputs(problem: GemmProblem, device, generator=None) -> dict:
    import torch

    def randn(*shape):
        return torch.randn(*shape, dtype=torch.float32, device=device, generator=generator)

    inputs = {"a": randn(problem.m, problem.k), "b": randn(problem.k, problem.n), "alpha": 1.5, "beta": 0.0}
    if not problem.beta_zero:
        inputs["c"] = randn(problem.m, problem.n)
        inputs["beta"] = 0.5
    return inputs


def _reference(problem: GemmProblem, inputs: dict):
    a, b = inputs["a"].double(), inputs["b"].double()
    ref = inputs.get("alpha", 1.0) * (a @ b)
    if not problem.beta_zero:
        ref = ref + inputs["beta"] * inputs["c"].double()
    return ref


def _baseline(problem: GemmProblem, inputs: dict):
    """cuBLAS through torch with TF32 off (exact FP32, like ours)."""
    import torch

    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        if problem.beta_zero:
            return torch.mm(inputs["a"], inputs["b"]).mul_(inputs.get("alpha", 1.0))
        return torch.addmm(inputs["c"], inputs["a"], inputs["b"], beta=inputs["beta"], alpha=inputs["alpha"])
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def _error_scale(problem: GemmProblem, inputs: dict):
    """Per-element error scale of a length-K FP32 dot product (see ``testing.gemm_scale``): the oracle
    allows twice cuBLAS's error plus a few eps of it, however either kernel orders its sums."""
    return gemm_scale(
        inputs["a"], inputs["b"], inputs.get("c"), alpha=inputs.get("alpha", 1.0), beta=inputs.get("beta", 0.0)
    )


def _launch_spec(config, problem, inputs, out):
    launch(config, problem, inputs, out)
    return out


def _standard_problems() -> list[GemmProblem]:
    # The sizes: square 2048/4096/8192 and LeetGPU's 8192 x 6144 x 4096, all with alpha=1.5, beta=0.5.
    squares = [GemmProblem(m=s, n=s, k=s, beta_zero=False) for s in (2048, 4096, 8192)]
    return squares + [GemmProblem(m=8192, n=6144, k=4096, beta_zero=False)]


SPEC = register(
    KernelSpec(
        op="sgemm",
        variant="simt_cpasync",
        backend="cute",
        dtypes=(torch.float32,),
        config_cls=GemmConfig,
        default_config=default_config,
        candidates=candidates,
        why_unsupported=why_unsupported,
        compile=compile,
        launch=_launch_spec,
        make_inputs=_make_inputs,
        reference=_reference,
        baseline=_baseline,
        flops=lambda p: 2.0 * p.m * p.n * p.k,
        bytes=lambda p: 4.0 * (p.m * p.k + p.k * p.n + p.m * p.n * (1 if p.beta_zero else 2)),
        standard_problems=_standard_problems,
        description="FP32 SIMT GEMM: cp.async multistage pipeline, 4x4-blocked register micro-tiles, FFMA",
        baseline_name="torch.addmm (cuBLAS, TF32 off)",
        bound="fp32",
        sweep_axes=(("tile_m", "tile_n", "tile_k"), ("num_stages",)),
        shape_bucket=shape_bucket,
        error_scale=_error_scale,
    )
)
