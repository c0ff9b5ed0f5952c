"""FP16/BF16 tensor-core GEMM (CuTe DSL): ``hgemm(a, b, c=None, *, alpha=1.0, beta=0.0, out=None,
config=None)``, the op in front of its two variants.

``a`` (M,K) and ``b`` (K,N) are row-major float16 or bfloat16 CUDA tensors of one dtype (any leading
dimension, unit stride in the last dim); the products accumulate in FP32 and the result
``alpha * a @ b + beta * c`` is computed in FP32 and rounded once to the input dtype. ``c`` is read only
when beta != 0; ``out=c`` updates ``c`` in place. The variants are ``hgemm_sm90`` (TMA + wgmma, sm_90 with
16-byte aligned operands) and ``hgemm_sm80`` (cp.async + mma.sync, any alignment); this module holds the
order in which the op tries them and the public op.
"""

from __future__ import annotations

from . import gemv as _gemv
from . import hgemm_sm80 as _sm80
from . import hgemm_sm90 as _sm90
from ...registry import register, register_zoo
from ...runtime import device as _device
from .op import SWAP_MAX_ROWS, CallPlans, GemmPolicy, run_gemm, staged_problem, stages_misaligned, swaps
from .problem import GemmProblem
from .spec import HGEMM_DTYPES as DTYPES
from .spec import hgemm_spec, op_call
from .zoo import hgemm_held_out, hgemm_zoo

__all__ = ["hgemm", "DTYPES", "SM90_MIN_PREFERRED_WORK", "SM90_MIN_PREFERRED_WIDE_WORK", "SM90_MIN_PREFERRED_ROWS",
           "SM90_MIN_PREFERRED_OUTPUT", "SM90_MAX_DECODE_ROWS", "SM90_MIN_DECODE_ROWS",
           "default_variant"]

# Below this much work (M * N * K) the op prefers the sm80-style variant; from SM90_MIN_PREFERRED_WIDE_WORK
# when M and N both reach SM90_MIN_PREFERRED_ROWS and the output holds SM90_MIN_PREFERRED_OUTPUT elements
# (64 tiles of 64 x 64). On the H200 (same-run cuBLAS, fp16) the Hopper variant's small tiles ran 1.01x
# at 512^3, 0.95x at 768^3 and 0.77x at 1000^3 against the sm80-style kernel's 0.78x, 0.66x and 0.55x,
# while decode-sized M (16 rows against 4096 x 4096, 2^28) ran 1.16x on the sm80-style kernel's split-K.
# (Small problems: SM90_MIN_PREFERRED_SMALL_WORK below.) A misaligned call is staged into aligned copies for
# the Hopper variant only from SM90_MIN_PREFERRED_WORK, where the copies were measured to pay.
SM90_MIN_PREFERRED_WORK = 1024 ** 3
SM90_MIN_PREFERRED_WIDE_WORK = 512 ** 3
SM90_MIN_PREFERRED_ROWS = 64
SM90_MIN_PREFERRED_OUTPUT = 512 * 512
# Decode-sized M (up to SM90_MAX_DECODE_ROWS rows, unbatched, a row-major b; through w.t() the Hopper kernel
# reads the weight as it lies, SWAP_SM90_MAX_ROWS) prefers the sm80-style kernel's 16- and 32-row tiles, which
# compute no rows of zeros and split K (16x4096x4096: 1.00x cuBLAS on the H200 against 0.83x on the Hopper
# kernel's 64-row tiles split 2), up to 16 rows. From SM90_MIN_DECODE_ROWS the Hopper kernel's transposed
# 32-column tiles (``hgemm_sm90.DECODE_ROWS``: the weight's columns are the tile's 64 rows, the call's rows its
# 32 columns) run ahead where their tiles fit one wave: on the H100 (same-run cuBLAS, fp16) 32x4096x4096
# 0.95x against the sm80-style kernel's 0.88x, 24x5120x5120 0.94x against 0.87x, 20x6144x4096 1.01x against
# 0.88x; at 16 and 8 rows they tie it (16x4096x4096 0.99x against 0.99x, 8x5120x5120 0.92x against 0.92x).
# Past one wave (32x14336x4096's 224 tiles) the sm80-style kernel ran 1.00x.
# Skinny N (32 or fewer columns of a row-major b against more rows, unbatched:
# ``hgemm_sm90.takes_narrow_columns``) prefers the Hopper kernel's 32-column tiles (``hgemm_sm90.NARROW_COLUMNS``)
# from SM90_MIN_PREFERRED_WIDE_WORK: on the H100 8192x16x4096 ran 0.99x against the sm80-style kernel's 0.82x.
# Otherwise a problem whose Hopper tiles leave half the SMs idle over a long K (``leaves_sms_idle``: few
# tiles, split or streaming a deep ring unsplit) prefers the Hopper variant from SM90_MIN_PREFERRED_WIDE_WORK:
# on the H200 64x1024x4096 ran 0.84-0.86x cuBLAS split 4-8 against the sm80-style kernel's unsplit 0.21x,
# 4096x16x4096 0.86x against its 0.74x.
SM90_MAX_DECODE_ROWS = 32
SM90_MIN_DECODE_ROWS = 17  # 16 rows keep the sm80-style kernel (16x4096x4096 above)
# Small problems (from SM90_MIN_PREFERRED_SMALL_WORK up to SM90_MIN_PREFERRED_WIDE_WORK, M and N of 64 or
# more, tiles enough for half the SMs or a short K) prefer the Hopper variant's 64x64 one-consumer tiles too:
# on the H200 (fp16, same-run cuBLAS, inputs rotated past L2) 128^3 ran 1.05x cuBLAS on them against 0.93x on
# the sm80-style kernel, 256^3 1.02x against 0.91x (bf16 1.03x against 0.86x), 384^3 1.04x against 0.89x,
# 512x256x512 0.99x against 0.62x.
SM90_MIN_PREFERRED_SMALL_WORK = 128 ** 3
# A batch of products prefers the Hopper variant from this much work in all: at 32 x 256^3 (2^29) its
# 128x128 rung ran 8.3 us against the sm80-style variant's 9.6 (torch.bmm 7.8; H200, interleaved medians).
# Smaller batches are unmeasured.
SM90_MIN_PREFERRED_BATCHED_WORK = 2 ** 29


def _gemv_standard_problems() -> list[GemmProblem]:
    """Decode steps through a transposed weight: 1 and 8 rows against a 4096 x 4096 weight, and 8 against a
    14336 x 4096 one (an MLP's up projection), in both dtypes."""
    return [GemmProblem(m=m, n=n, k=4096, dtype=d, beta_zero=True, a_align=8, b_align=8, c_align=8, b_major="k")
            for d in ("float16", "bfloat16") for m, n in ((1, 4096), (8, 4096), (8, 14336))]


GEMV_SPEC = register(hgemm_spec(**_gemv.gemv_fields(_gemv_standard_problems)))


def _hopper_takes_decode_rows(problem: GemmProblem) -> bool:
    """Whether a decode-sized call of ``SM90_MIN_DECODE_ROWS`` to ``SM90_MAX_DECODE_ROWS`` rows runs the
    Hopper kernel's transposed 32-column tiles in one wave (the comment above ``SM90_MAX_DECODE_ROWS``)."""
    return (SM90_MIN_DECODE_ROWS <= problem.m <= SM90_MAX_DECODE_ROWS
            and _sm90.default_config(problem) == _sm90.DECODE_ROWS
            and _sm90.kernel_tiles(_sm90.DECODE_ROWS, problem) <= _device.H200_SM_COUNT)


def _hopper_takes_narrow_columns(problem: GemmProblem) -> bool:
    """Whether a skinny-N call runs the Hopper kernel's 32-column tiles (the comment above
    ``SM90_MAX_DECODE_ROWS``)."""
    return _sm90.takes_narrow_columns(problem) and problem.m * problem.n * problem.k >= SM90_MIN_PREFERRED_WIDE_WORK


def _variant_order(problem: GemmProblem) -> tuple:
    """Every variant, in the order to try them: the GEMV kernel first for the few-row calls it takes, the
    Hopper kernel first for problems it is measured fast on (a measured-speed policy, not a correctness
    limit: ``supports()`` says what each can run; the sm80-style kernel runs everything, so the GEMV
    kernel after it is there only for a given ``GemvConfig``)."""
    if _gemv.takes(problem):
        return (GEMV_SPEC, _sm80.SPEC, _sm90.SPEC)
    work = problem.m * problem.n * problem.k * problem.batch
    wide = (problem.batch == 1 and min(problem.m, problem.n) >= SM90_MIN_PREFERRED_ROWS
            and problem.m * problem.n >= SM90_MIN_PREFERRED_OUTPUT)
    if problem.batch == 1 and problem.b_major == "k" and problem.m <= SWAP_MAX_ROWS:
        # Decode rows through w.t() the op does not swap (_swaps): the Hopper kernel reads the weight as it lies.
        return (_sm90.SPEC, _sm80.SPEC, GEMV_SPEC)
    if problem.batch == 1 and problem.m <= SM90_MAX_DECODE_ROWS:
        if _hopper_takes_decode_rows(problem):
            return (_sm90.SPEC, _sm80.SPEC, GEMV_SPEC)
        return (_sm80.SPEC, _sm90.SPEC, GEMV_SPEC)
    if _hopper_takes_narrow_columns(problem):
        return (_sm90.SPEC, _sm80.SPEC, GEMV_SPEC)
    # The Hopper config is asked only for the one products the skinny and small rules weigh.
    idle = (problem.batch == 1 and work >= SM90_MIN_PREFERRED_SMALL_WORK and _sm90.leaves_sms_idle(problem))
    skinny = work >= SM90_MIN_PREFERRED_WIDE_WORK and idle
    small = (problem.batch == 1 and min(problem.m, problem.n) >= SM90_MIN_PREFERRED_ROWS and not idle
             and SM90_MIN_PREFERRED_SMALL_WORK <= work < SM90_MIN_PREFERRED_WIDE_WORK)
    if (work >= SM90_MIN_PREFERRED_WORK or (wide and work >= SM90_MIN_PREFERRED_WIDE_WORK) or skinny or small
            or (problem.batch > 1 and work >= SM90_MIN_PREFERRED_BATCHED_WORK)):
        return (_sm90.SPEC, _sm80.SPEC, GEMV_SPEC)
    return (_sm80.SPEC, _sm90.SPEC, GEMV_SPEC)


# Past 16 rows on sm_90 a call through w.t() runs directly: the Hopper kernel reads w.t() as it lies (a
# K-major B through TMA) at least as fast as the swap runs it. On an H100 (same-run cuBLAS, weights rotated
# past L2) 32x6144x4096 fp16 ran 0.99x cuBLAS direct against 0.66x swapped (onto the sm80-style kernel's
# copies), and 24x4096x4096 0.81-0.88x direct against 0.81x (docs/notes/gemm.md, "Decode rows through w.t()").
SWAP_SM90_MAX_ROWS = 16


def _swaps(problem: GemmProblem) -> bool:
    """HGEMM's swap rule (``op.swaps``): on sm_90, where the Hopper kernel reads the call as it lies (every
    row 16-byte aligned), only up to ``SWAP_SM90_MAX_ROWS`` rows; elsewhere op.swaps' own bound."""
    hopper_reads = problem.sm >= 90 and min(problem.a_align, problem.b_align, problem.c_align) >= 8
    return swaps(problem, SWAP_SM90_MAX_ROWS if hopper_reads else SWAP_MAX_ROWS)


def _stage_unaligned(problem: GemmProblem) -> bool:
    """Whether the op runs a misaligned problem on aligned, zero-padded copies of its operands
    (``op.StagedLaunch``): on sm_90 from 1024^3 of work, where the Hopper variant on the copies beats the
    sm80-style kernel's narrow copies in place by far more than the copies cost (docs/notes/gemm.md,
    "Unaligned rows"); not the calls the GEMV variant takes (a copy of the weight would cost more than
    the call), nor decode-sized rows, which run the sm80-style kernel whatever their alignment."""
    return (stages_misaligned(problem, SM90_MIN_PREFERRED_WORK) and problem.sm >= 90
            and problem.m > SM90_MAX_DECODE_ROWS)


def default_variant(problem: GemmProblem):
    """The entry a call of ``problem`` runs with no config and no tuned table: the first in the op's order
    whose heuristic config supports it (the op's choice, ``op.choose_variant``, less the tuned tables)."""
    for spec in _variant_order(problem):
        if spec.supports(spec.default_config(problem), problem):
            return spec
    raise ValueError(f"no hgemm variant runs {problem}")


def hgemm(a, b, c=None, *, alpha=1.0, beta=0.0, out=None, config=None):
    """``alpha * a @ b + beta * c`` with FP32 accumulation on ``a``'s CUDA device and torch's current stream.

    ``a``: (M, K) or a batch (B, M, K), ``b``: (K, N) or (B, K, N), all float16 or all bfloat16; batches
    broadcast as ``torch.matmul``'s (a single matrix, or a batch of one, repeats over the other's batch;
    ``x @ w`` runs as one GEMM of B * M rows). Each operand's matrices are row-major (stride 1 in the last
    dim, any leading dimension) or column-major (a transposed view such as ``w.t()``), read as they lie by
    both variants. alpha and beta are applied in FP32 and
    the result is rounded once to the input dtype. ``c``: the result's shape (a layout other than row-major read from a
    row-major copy, as torch.addmm takes any), or any shape that broadcasts to it as ``torch.addmm``'s / ``torch.baddbmm``'s input does (a bias (N,), a column (M, 1),
    a scalar: read through its expansion); read only when ``beta != 0`` (NaN in ``c`` cannot leak
    otherwise). ``out``: a tensor of the result's shape and dtype, row-major matrices, to write (``out=c``
    updates ``c`` in place); it must not overlap ``a`` or ``b``. Returns ``out`` (or a new tensor). Errors
    name the argument; nothing is written on an error. Differentiable in ``a``, ``b`` and ``c``
    (``ck.hgemm``; its backward runs these GEMMs on transposed views).

    Variants: on an sm_90 GPU with operands TMA can describe (16-byte aligned base addresses and rows) and
    at least 1024^3 of work (512^3 with 64 rows and columns or more and 512^2 outputs, or with so few tiles
    that the Hopper kernel splits K; 128^3 to 512^3 with 64 rows and columns or more, unsplit; 2^29 for a
    batch) and, unbatched, more than 32 rows, the Hopper kernel (``hgemm_sm90``, TMA + wgmma) runs; so do 17
    to 32 rows times a row-major ``b`` of at most 132 x 64 columns (on transposed 32-column tiles: the
    weight's columns are the tile's rows) and 32 or fewer columns of a row-major ``b`` from 512^3 of work (on
    32-column tiles); elsewhere the sm80-style one (``hgemm_sm80``, cp.async + mma.sync, any alignment). Both
    read column-major operands as they lie. A few rows times a transposed weight (``x @ w.t()``): up to 8 rows
    (16 with 16-byte rows) run on the GEMV variant (``gemv``: one row on FP32 FMAs, more on tensor cores;
    16-byte rows); up to 64 on sm_90 on the Hopper kernel, which reads w.t() as it lies, and elsewhere (and
    the rows up to 16 the GEMV variant declines) as the transpose ``w @ x.t()``, so the weight is read row by
    row in place (on the Hopper kernel the transposed result is written in place too; elsewhere through a
    copy). ``config`` picks the variant by its type: an ``HgemmSm90Config``, an ``HgemmConfig`` or a
    ``GemvConfig``. With None, the tuned or heuristic config of the first variant that supports the call,
    except that a misaligned call of at least 1024^3 of work on sm_90 runs the Hopper kernel on aligned,
    zero-padded copies of its operands.
    """
    return run_gemm(a, b, c, alpha, beta, out, config, _POLICY, _PLANS)


_PLANS = CallPlans("hgemm")  # by call structure: runtime.plans
_POLICY = GemmPolicy(DTYPES, (_sm90.SPEC, _sm80.SPEC, GEMV_SPEC), order=_variant_order, stage=_stage_unaligned,
                     swap=_swaps)


def _runs_as(problem: GemmProblem) -> GemmProblem:
    """The problem the op's kernel runs for ``problem``: its aligned twin where the op stages it."""
    return staged_problem(problem, 8)[0] if _stage_unaligned(problem) else problem


register_zoo("hgemm", hgemm_zoo, default_variant, hgemm_held_out, _runs_as, op_call(hgemm))
