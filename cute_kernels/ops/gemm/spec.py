"""The registry entries of the CuTe GEMM variants: what every one shares (randn inputs, the float64
reference, flops and traffic, a launcher that returns the result) in :func:`gemm_spec`, the one helper that
builds them, and what the two HGEMM variants share (dtypes, the cuBLAS baseline, the oracle's scale, the
standard problems the benchmark report times)."""

from __future__ import annotations

import torch

from ...registry import KernelSpec, settled_baseline
from ...runtime import oracle
from ...runtime.bounded import kept_launch
from .compile import launch_compiled
from .problem import GemmProblem, shape_bucket
from .reference import HALF_GEMM_FLOOR_EPS, gemm_scale

__all__ = [
    "flops",
    "traffic_bytes",
    "make_inputs",
    "reference",
    "launch_from_prepare",
    "torch_gemm",
    "gemm_spec",
    "HGEMM_DTYPES",
    "HGEMM_DTYPE_NAMES",
    "HGEMM_BASELINE_NAME",
    "hgemm_baseline",
    "hgemm_error_scale",
    "hgemm_standard_problems",
    "SGEMM_BASELINE_NAME",
    "sgemm_baseline",
    "sgemm_error_scale",
    "sgemm_standard_problems",
    "sgemm_spec",
]


def flops(problem: GemmProblem) -> float:
    return 2.0 * problem.m * problem.n * problem.k


def traffic_bytes(problem: GemmProblem) -> float:
    """A, B and D once each, and C when it is read."""
    element = 4 if problem.dtype == "float32" else 2
    return element * (problem.m * problem.k + problem.k * problem.n
                      + problem.m * problem.n * (1 if problem.beta_zero else 2))


def make_inputs(problem: GemmProblem, device, generator=None) -> dict:
    """randn A and B (and C when it is read) of the problem's dtype, drawn in FP32 and rounded, as the
    kernel takes them: batches of ``problem.batch`` matrices when it is more than 1, a column-major operand
    (C too, with ``d_major`` "m") as the transposed view of a row-major tensor; alpha = 1.5, beta = 0.5 (0
    when C is not read)."""
    dtype = getattr(torch, problem.dtype)
    batch = (problem.batch,) if problem.batch > 1 else ()

    def randn(rows, cols, transposed=False):
        shape = (*batch, cols, rows) if transposed else (*batch, rows, cols)
        t = torch.randn(*shape, dtype=torch.float32, device=device, generator=generator).to(dtype)
        return t.transpose(-1, -2) if transposed else t

    inputs = {"a": randn(problem.m, problem.k, problem.a_major == "m"),
              "b": randn(problem.k, problem.n, problem.b_major == "k"), "alpha": 1.5, "beta": 0.0}
    if not problem.beta_zero:
        inputs["c"] = randn(problem.m, problem.n, problem.d_major == "m")
        inputs["beta"] = 0.5
    return inputs


def reference(problem: GemmProblem, inputs: dict):
    """alpha * a @ b + beta * c in float64."""
    a, b = inputs["a"].double(), inputs["b"].double()
    ref = inputs.get("alpha", 1.0) * (a @ b)
    if not problem.beta_zero:
        ref = ref + inputs["beta"] * inputs["c"].double()
    return ref


def torch_gemm(inputs: dict):
    """torch's ``alpha * a @ b + beta * c`` on the inputs dict in one cuBLAS call, as cuBLAS's own alpha and
    beta do it: addmm (baddbmm for batches); without c on a zero scalar with beta 0, which torch does not copy
    into the result (a matmul and a ``mul_`` would time a second kernel as the vendor's)."""
    a, b, alpha = inputs["a"], inputs["b"], inputs.get("alpha", 1.0)
    add = torch.baddbmm if a.dim() == 3 else torch.addmm
    if "c" not in inputs or inputs.get("beta", 0.0) == 0.0:
        if alpha == 1.0:
            return torch.matmul(a, b)
        return add(_zero(a), a, b, beta=0.0, alpha=alpha)
    return add(inputs["c"], a, b, beta=inputs["beta"], alpha=alpha)


def _zero(like: torch.Tensor) -> torch.Tensor:
    """A zero scalar of ``like``'s dtype and device, made once: addmm's ignored bias at beta 0."""
    key = (like.dtype, like.device)
    zero = _zeros.get(key)
    if zero is None:
        zero = _zeros[key] = torch.zeros((), dtype=like.dtype, device=like.device)
    return zero


_zeros: dict = {}


def op_call(gemm_op):
    """``call(inputs, out)`` for ``register_zoo``: the public op (``ck.hgemm`` or ``ck.sgemm``) on an
    entry's inputs dict, writing ``out``."""
    def call(inputs: dict, out):
        return gemm_op(inputs["a"], inputs["b"], inputs.get("c"), alpha=inputs.get("alpha", 1.0),
                       beta=inputs.get("beta", 0.0), out=out)

    return call


# The launches of the registry launchers that keep theirs (``gemm_spec(keep_launches=True)``), by config (whose
# class names the entry), problem, device and the operands' layouts. Keyed by caller-driven shapes: bounded.
_kept_launches: dict = {}


def launch_from_prepare(prepare, keep_launches: bool = False):
    """The registry's launcher (it returns the result) from a family's ``prepare``: the same compiled
    launch the op's plans hold, run once on the inputs dict. ``keep_launches``: the launch prepared for a
    layout of a, b and out is kept and run again (``bounded.kept_launch``), for launches whose set-up
    (tensor maps) would otherwise be timed on every one of the benchmark's and sweeps' repeated calls."""
    def run(config, problem, inputs, out):
        launch = (kept_launch(_kept_launches, prepare, config, problem, inputs, out, (inputs["a"], inputs["b"], out))
                  if keep_launches else prepare(config, problem, inputs, out))
        launch_compiled(launch, inputs, out)
        return out

    return run


def gemm_spec(*, prepare, backend: str = "cute", keep_launches: bool = False, column_major_result: bool = False,
              **fields) -> KernelSpec:
    """A GEMM variant's registry entry: what every CuTe GEMM shares (backend, randn inputs, the float64
    reference, flops and traffic, a launcher built on the variant's ``prepare``) and the variant's own
    ``fields``. ``prepare(config, problem, inputs, out)`` gives the :class:`~.compile.CompiledLaunch` for
    ``out``'s device (compiling it on first use). ``keep_launches``: the registry's launcher keeps the
    launch of each layout (``launch_from_prepare``) where ``prepare`` makes a fresh one with set-up of its
    own each time; the op's plans keep theirs anyway. ``column_major_result``: the variant writes a
    column-major C and result (``GemmProblem.d_major == "m"``); the others refuse such problems."""
    if not column_major_result:
        fields["why_unsupported"] = _row_major_result_only(fields["why_unsupported"])
    return KernelSpec(backend=backend, launch=launch_from_prepare(prepare, keep_launches), prepare=prepare,
                      make_inputs=make_inputs, reference=reference, flops=flops, bytes=traffic_bytes, **fields)


def _row_major_result_only(why_unsupported):
    def why(config, problem: GemmProblem):
        if problem.d_major != "n":
            return "this variant writes row-major results only (d_major 'n'; the Hopper kernel takes 'm')"
        return why_unsupported(config, problem)

    why.__doc__ = why_unsupported.__doc__
    return why


# ---------------------------------------------------------------------------------------------- hgemm
HGEMM_DTYPES = (torch.float16, torch.bfloat16)
HGEMM_DTYPE_NAMES = ("float16", "bfloat16")  # GemmProblem.dtype of each

HGEMM_BASELINE_NAME = "torch.mm / torch.addmm (cuBLAS)"


def hgemm_baseline(problem: GemmProblem, inputs: dict):
    """cuBLAS through torch in the same dtype (FP32 accumulation, one rounding of the result)."""
    return torch_gemm(inputs)


def hgemm_error_scale(problem: GemmProblem, inputs: dict):
    """Per-element scale of the oracle: the magnitude of the result (``reference.gemm_scale`` with
    ``k_growth=False``). A 16-bit result accumulated in FP32 is off by its final rounding, at most half an
    ulp of that magnitude, so ours passes ``oracle.compare``'s floor of a few ulps whatever cuBLAS does,
    while a lost K term (~1/sqrt(K) of it) or a wrong element does not."""
    return gemm_scale(
        inputs["a"], inputs["b"], inputs.get("c"), alpha=inputs.get("alpha", 1.0), beta=inputs.get("beta", 0.0),
        k_growth=False,
    )


def hgemm_standard_problems() -> list[GemmProblem]:
    """The issues' sizes: 4096^3 and 8192^3 in both dtypes, then LeetGPU's 1024^3 (latency-bound)."""
    return [GemmProblem(m=s, n=s, k=s, dtype=d, beta_zero=True, a_align=8, b_align=8, c_align=8)
            for d in ("float16", "bfloat16") for s in (4096, 8192)] + [
        GemmProblem(m=1024, n=1024, k=1024, dtype="float16", beta_zero=True, a_align=8, b_align=8, c_align=8)]


def hgemm_spec(**fields) -> KernelSpec:
    """An HGEMM variant's registry entry: ``gemm_spec`` plus what the HGEMM variants share (dtypes, the
    cuBLAS baseline, the standard problems, the result-magnitude oracle with its floor, the shape bucket)
    and the variant's own ``fields``, which take precedence (the GEMV entry's own standard problems)."""
    shared = dict(op="hgemm", dtypes=HGEMM_DTYPES, baseline=hgemm_baseline, standard_problems=hgemm_standard_problems,
                  baseline_name=HGEMM_BASELINE_NAME, bound="fp16", shape_bucket=shape_bucket,
                  error_scale=hgemm_error_scale,
                  error_floor_eps=HALF_GEMM_FLOOR_EPS)  # the same oracle as reference.gemm_verdict
    return gemm_spec(**{**shared, **fields})


# ---------------------------------------------------------------------------------------------- sgemm
SGEMM_BASELINE_NAME = "torch.addmm (cuBLAS, TF32 off)"


def sgemm_eager_baseline(problem: GemmProblem, inputs: dict):
    """cuBLAS through torch with TF32 off (FP32 FFMA, the accuracy ours matches): the call, and the setting
    made once around the wall figure's calls."""
    return (lambda: torch_gemm(inputs)), oracle.fp32_matmuls


sgemm_baseline = settled_baseline(sgemm_eager_baseline)


def sgemm_error_scale(problem: GemmProblem, inputs: dict):
    """Per-element error scale of a length-K FP32 dot product (see ``reference.gemm_scale``): the oracle
    allows twice cuBLAS's error plus a few eps of it, however either kernel orders its sums."""
    return gemm_scale(
        inputs["a"], inputs["b"], inputs.get("c"), alpha=inputs.get("alpha", 1.0), beta=inputs.get("beta", 0.0)
    )


def sgemm_standard_problems() -> list[GemmProblem]:
    """The issue's sizes: square 2048/4096/8192 and LeetGPU's 8192 x 6144 x 4096, all with alpha=1.5,
    beta=0.5."""
    squares = [GemmProblem(m=s, n=s, k=s, beta_zero=False) for s in (2048, 4096, 8192)]
    return squares + [GemmProblem(m=8192, n=6144, k=4096, beta_zero=False)]


def sgemm_spec(**fields) -> KernelSpec:
    """An SGEMM GEMM entry's registry entry: ``gemm_spec`` plus what the SIMT and 3xTF32 entries share (dtype,
    the cuBLAS FP32 baseline, the standard problems, the FP32 oracle's scale, the shape bucket) and the
    entry's own ``fields``."""
    shared = dict(op="sgemm", dtypes=(torch.float32,), baseline=sgemm_baseline, eager_baseline=sgemm_eager_baseline,
                  standard_problems=sgemm_standard_problems, baseline_name=SGEMM_BASELINE_NAME, shape_bucket=shape_bucket, error_scale=sgemm_error_scale)
    return gemm_spec(**{**shared, **fields})
