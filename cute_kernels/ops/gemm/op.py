"""The body every public GEMM op shares: a call of a structure seen before runs its plan; a new one is
validated, allocated, measured, given a variant and config (and a compiled kernel), and becomes a plan."""

from __future__ import annotations

import dataclasses

import torch

from ...runtime import checks as _checks
from ...runtime.autograd import check_writable, mark_written
from ...runtime.device import current_stream_handle, on_device
from ...runtime.plans import CallPlans
from ...runtime.workspace import staging_buffer
from ...runtime.dry_run import dry_run, is_dry_run, take_result
from . import gemv
from .problem import (
    GRID_Z_MAX,
    GemmProblem,
    check_out_overlaps,
    expansion_is_rows,
    make_problem,
    may_fold,
    operand_major,
    runs_c_as_expansion,
    trivial_result,
    unit_strides,
    validate_gemm_args,
    widest_dividing,
    widest_vector,
)

__all__ = ["choose_variant", "run_gemm", "GemmPolicy", "GemmPlan", "CallPlans", "StagedLaunch", "staged_problem", "stages_misaligned",
           "Arrangement"]

def choose_variant(specs, problem: GemmProblem, config, device_index: int):
    """(spec, config) that runs ``problem``: with ``config`` given, the entry of ``specs`` whose config class
    it is (ValueError, naming the reason, if that entry does not support the problem); with None, the first
    entry whose chosen config (tuned or heuristic) it supports -- the last entry is the catch-all."""
    if config is None:
        from ... import tuned

        for spec in specs:
            config, supported = tuned.choose_supported(spec, problem, device_index)
            if supported:
                return spec, config
    else:
        spec = next(s for s in specs if isinstance(config, s.config_cls))
    why = spec.why_unsupported(config, problem)
    if why is not None:
        raise ValueError(f"config: {config.short()} cannot run {problem}: {why}")
    return spec, config


@dataclasses.dataclass(frozen=True)
class GemmPolicy:
    """How one GEMM op (``ck.sgemm``, ``ck.hgemm``) runs the calls that name no config: what it takes and
    which of its kernels it prefers, per problem.

    ``dtypes``: the operand dtypes the op takes. ``specs``: its registry entries in order of preference; a
    given config runs on the entry whose config class it is; with none, the first entry whose chosen config
    (tuned or heuristic) it ``supports()`` runs -- e.g. the Hopper HGEMM where TMA can describe the operands,
    the sm80-style one elsewhere. ``order(problem)``: ``specs`` reordered per problem (a measured-speed
    preference; every entry stays in it, so that a given config finds the entry of its class).
    ``stage(problem)``: True where the op runs a misaligned problem faster on aligned copies of its operands
    (:class:`StagedLaunch`) than in place. ``copies(problem)``: (copy_a, copy_b), the column-major operands
    the op runs faster from row-major copies than as they lie. ``swap(problem)``: True where the op runs the
    call as its transpose (``swaps``: a few rows times a transposed weight). A rule left None never applies.
    """

    dtypes: tuple
    specs: tuple
    order: object = None
    stage: object = None
    copies: object = None
    swap: object = None

    def ranked(self, problem: GemmProblem) -> tuple:
        """The entries in the order the op tries them for ``problem``."""
        return self.order(problem) if self.order is not None else self.specs


class GemmPlan:
    """What every call of one structure (``runtime.plans``) runs: the result's shape, dtype and device,
    whether the call needs a kernel at all, the canonical-stride views, and the compiled launch.

    Per call it checks what the structure does not fix: alpha and beta as float32 (a beta whose float32
    zero-ness differs from the plan's, e.g. 1e-50 against 1.0, takes the full path), which memory ``out``
    overlaps and whether ``out`` may be written; it allocates the result and launches on its device."""

    __slots__ = ("m", "n", "shape", "dtype", "device", "device_index", "beta_zero", "k", "trivial", "views",
                 "launch", "full", "expand_c", "copy_c", "arrange", "plain", "out_guard")

    def __init__(self, *, shape, dtype, device, beta_zero, k, trivial, views, launch, full, expand_c=False,
                 copy_c=False, arrange=None):
        self.shape, (self.m, self.n), self.dtype, self.device, self.device_index = (shape, shape[-2:], dtype, device,
                                                                                   device.index)
        self.beta_zero, self.k, self.trivial, self.views, self.launch, self.full = (beta_zero, k, trivial, views,
                                                                                     launch, full)
        # C broadcasts to the result (torch.addmm's rule) and is read: the kernel reads its expansion, a view
        # (a bias row: leading dimension 0) or, where ``copy_c`` (a column, a scalar), a row-major copy of it.
        self.expand_c = expand_c and not beta_zero and not trivial
        self.copy_c = copy_c
        self.arrange = arrange  # not one row-major product: how the tensors become the kernel's (Arrangement)
        # One matrix launched on the tensors as they are (a bias row as its expansion): the commonest call,
        # whose path below is the shortest.
        self.plain = len(shape) == 2 and not trivial and arrange is None and not views and not copy_c
        self.out_guard = None  # out's overlap checks from pointers alone, taken from the first call with out

    def __call__(self, a, b, c, alpha, beta, out):
        alpha32 = _checks.float32_scalar("alpha", alpha)
        beta32 = _checks.float32_scalar("beta", beta)
        if (beta32 == 0.0) is not self.beta_zero:
            return self.full(a, b, c, alpha, beta, out)
        if out is None and self.plain:
            # a's dtype and device are the result's: new_empty parses no keywords (~0.35 us under torch.empty's)
            result = a.new_empty(self.m, self.n)
            if self.expand_c:
                c = c.expand(self.m, self.n)
            on_device(self.device_index, self.launch, a, b, c, result, alpha32, beta32)
            return result
        clear = False
        if out is not None:
            read_c = None if self.beta_zero else c
            guard = self.out_guard
            if guard is None:
                guard = self.out_guard = _checks.OutGuard(out, (a, b, read_c), may_be=(False, False, True))
            clear = guard.clear(out, a, b, read_c)
            if not clear:
                check_out_overlaps(a, b, c, out, self.beta_zero)
            check_writable("out", out)
        # Sizes as separate ints: torch parses them faster than a tuple (about 1 us of a tiny call).
        if out is not None:
            result = out
        elif len(self.shape) == 2:
            result = torch.empty(self.m, self.n, dtype=self.dtype, device=self.device)
        else:
            result = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        if self.expand_c:
            # A copy is a fresh row-major tensor (clone, not contiguous(), which returns c's own memory where
            # the expansion already is contiguous, a (M, N) c of a batch of one, whose alignment the plan did
            # not measure). A row that lies in out (a row of the result itself) is copied too: out is written
            # while C is read.
            copy = self.copy_c or (out is not None and not clear and _checks.overlaps(out, c))
            c = c.expand(self.shape).clone(memory_format=torch.contiguous_format) if copy else c.expand(self.shape)
        if self.trivial:
            trivial_result(result, c, k=self.k, beta=beta32, beta_zero=self.beta_zero)
        elif self.arrange is not None:
            arrange = self.arrange
            a, b, c, result_run = arrange(a, b, None if self.beta_zero else c, result)
            on_device(self.device_index, self.launch, a, b, c, result_run, alpha32, beta32)
            if arrange.fold_out:  # (an attribute read: the batched calls' host path stays as short)
                arrange.land(result, result_run)
        else:
            if self.views:  # a size-1 dim let torch report strides the kernel's layouts do not take
                a, b, result_run = unit_strides(a), unit_strides(b), unit_strides(result)
                c = unit_strides(c) if (c is not None and not self.beta_zero) else None
            else:
                result_run = result
            on_device(self.device_index, self.launch, a, b, c, result_run, alpha32, beta32)
        if out is not None:
            mark_written(out)
        return result


def _foldable(t, rows: int, repeated_row: bool = False) -> bool:
    """Whether the (B, rows, X) row-major batch ``t`` is one (B * rows, X) matrix: its matrices follow each
    other at the row stride (one-row matrices: a batch stride of at least a row). ``repeated_row``: also
    one row for every row and batch (a bias's expansion: strides 0, 0, 1), a matrix of leading dimension 0."""
    if rows == 1:
        return t.stride(0) >= t.shape[-1] or (repeated_row and t.stride(0) == 0)
    return t.stride(0) == rows * t.stride(1)


def _fold(t):
    """The (B * rows, X) matrix of a batch for which :func:`_foldable` holds."""
    batch, rows, cols = t.shape
    ld = t.stride(1) if rows > 1 else t.stride(0)
    return t.as_strided((batch * rows, cols), (ld, 1))


def _batch_of(t, batch: int):
    """``t`` as a batch of ``batch`` matrices: a single matrix (2-D, or a batch of one) repeats with batch
    stride 0, as torch.matmul broadcasts it."""
    if t.dim() == 2:
        t = t.unsqueeze(0)
    return t.expand(batch, t.shape[1], t.shape[2]) if t.shape[0] != batch else t


class Arrangement:
    """How the tensors of a call that is not one row-major product become the kernel's operands, decided
    once per call structure (``prepare_gemm``) and applied per call, all views but the copies:

    - ``copy_a`` / ``copy_b``: a column-major operand runs from a row-major copy (``contiguous()``: one torch
      op on the current stream) where the op's policy finds that faster (``copies``: the SGEMM's K-major b
      from 1024 rows) or no variant takes it as it lies;
    - ``fold``: a batch whose ``b`` is one matrix for all (``x @ w``), with ``a`` and the result batches of
      row-major matrices one after the other, is one GEMM of B * M rows: no batch at all;
    - ``batch``: otherwise, batches of ``batch`` matrices (> 1), a single ``a`` or ``b`` repeating with batch
      stride 0; a batch of one is its matrix;
    - every operand with the canonical strides of its majorness (``unit_strides``).

    ``passthrough``: the structure's tensors are the kernel's as they are (full batches with canonical
    strides, the common ``torch.bmm`` call): per call nothing is remade.
    """

    __slots__ = ("copy_a", "copy_b", "fold", "batch", "a_major", "b_major", "passthrough", "fold_c", "fold_out")

    def __init__(self, copy_a: bool, copy_b: bool, fold: bool, batch: int, a_major: str, b_major: str,
                 fold_c: bool = False, fold_out: bool = False):
        self.copy_a, self.copy_b, self.fold, self.batch = copy_a, copy_b, fold, batch
        self.a_major, self.b_major = a_major, b_major  # of the operands after the copies
        # A fold that c's or out's layout would keep from folding (a batch past the grid, which runs only
        # folded): c read from a row-major copy, the result written to a fresh one and copied into out
        # (``land``) after the launch.
        self.fold_c, self.fold_out = fold_c, fold_out
        self.passthrough = False

    def __call__(self, a, b, c, result):
        if self.passthrough:
            return a, b, c, result
        if self.copy_a:
            a = a.contiguous()
        if self.copy_b:
            b = b.contiguous()
        if self.fold:
            if self.fold_c and c is not None:
                c = c.contiguous()
            if self.fold_out:
                result = torch.empty(result.shape, dtype=result.dtype, device=result.device)
            a, result = _fold(a), _fold(result)
            b = unit_strides(b if b.dim() == 2 else b[0], self.b_major)
            return a, b, (None if c is None else _fold(c)), result
        if self.batch > 1:
            a, b = _batch_of(a, self.batch), _batch_of(b, self.batch)
            c = None if c is None else _batch_of(c, self.batch)
        else:
            a, b, result = (t if t.dim() == 2 else t[0] for t in (a, b, result))
            c = None if c is None else (c if c.dim() == 2 else c[0])
        return (unit_strides(a, self.a_major), unit_strides(b, self.b_major),
                None if c is None else unit_strides(c), unit_strides(result))

    def land(self, result, result_run) -> None:
        """After the launch: the fresh result of a ``fold_out`` arrangement copied into the call's."""
        if self.fold_out:
            take_result(result, result_run.view(result.shape))

    @staticmethod
    def of(a, b, c, result, copy_a: bool = False, copy_b: bool = False) -> "Arrangement":
        """The arrangement of validated tensors (``c`` only when it is read, expanded to the result's
        shape); ``copy_a`` / ``copy_b``: make row-major copies of those operands. A batch past the kernels'
        grid reaches an arrangement only where it folds (the others run in chunks, ``BatchChunks``): from
        row-major copies of whichever of a, c and out keep it from folding as they lie."""
        batch = result.shape[0] if result.dim() == 3 else 1
        m = result.shape[-2]
        past_grid = batch > GRID_Z_MAX
        if past_grid and not (operand_major("a", a) == "row" and _foldable(a, m)):
            copy_a = True
        a_major = "row" if copy_a else operand_major("a", a)
        b_major = "row" if copy_b else operand_major("b", b)
        fold_c = c is not None and not _foldable(c, m, repeated_row=True)
        fold_out = not _foldable(result, m)
        fold = (batch > 1 and may_fold(a, b, result.shape) and a_major == "row" and (copy_a or _foldable(a, m))
                and (past_grid or not (fold_c or fold_out)))
        arrangement = Arrangement(copy_a, copy_b, fold, batch, a_major, b_major, fold and fold_c, fold and fold_out)
        ran = arrangement(a, b, c, result)
        arrangement.passthrough = all(x is y for x, y in zip(ran, (a, b, c, result)))
        return arrangement


# A few rows times a transposed weight (``F.linear`` in a decode step: x (M, K) @ w.t()) runs as its
# transpose, out^T = w @ x^T (``_prepare_swapped``): the weight is then a row-major A read in place and the
# skinny side becomes N, which the kernels split over K. Run directly, the Hopper kernel (the only one
# taking w.t() as it lies) ran 8.5x slower than cuBLAS at M = 1 and 16 (N = K = 4096, fp16; measured before
# it had split-K, which it now uses only past 32 rows), and the cp.async kernels would copy the whole
# weight per call. Measured only for those decode shapes; bounded by rows and by work (from 1024^3 the
# Hopper kernel's tiles fill the GPU).
SWAP_MAX_ROWS = 64
SWAP_MAX_WORK = 1024 ** 3


def swaps(problem: GemmProblem, max_rows: int = SWAP_MAX_ROWS) -> bool:
    """Whether a few rows times a transposed weight run as their transpose (``_prepare_swapped``): up to
    ``max_rows`` rows (an op's swap rule may bound them lower, as HGEMM's does where the Hopper kernel reads
    the call as it lies), not the rows the GEMV variant takes (``gemv.takes``), which reads the weight as
    it lies. An op names its rule as ``GemmPolicy.swap``; SGEMM's is this one."""
    return (problem.batch == 1 and problem.a_major == "k" and problem.b_major == "k"
            and problem.m <= max_rows and SWAP_MAX_ROWS < problem.n
            and problem.m * problem.n * problem.k < SWAP_MAX_WORK
            and not gemv.takes(problem))


class SwappedLaunch:
    """``out = alpha * a @ b + beta * c`` for a row-major ``a`` (M, K) and a column-major ``b`` (K, N) run as
    ``out^T = alpha * b^T @ a^T + beta * c^T``: ``b^T`` is a row-major (N, K) view (no copy), ``a^T`` and
    ``c^T`` row-major copies of M x K and M x N elements (M is small: ``swaps``), the (N, M) result copied
    into ``out`` transposed. Each copy is one torch op on the current stream."""

    __slots__ = ("inner",)

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, a, b, c, out, alpha, beta) -> None:
        m, n = out.shape
        result = torch.empty(n, m, dtype=out.dtype, device=out.device)
        # unit_strides: with M == 1 a.t() is already contiguous but keeps a row stride of K.
        self.inner(b.t(), unit_strides(a.t().contiguous()), None if c is None else unit_strides(c.t().contiguous()),
                   result, alpha, beta)
        take_result(out, result.t())


def _prepare_swapped(problem: GemmProblem, policy: GemmPolicy, device, dtype):
    """The swapped launch of ``problem`` (``swaps``): the variant and config of its transpose (an aligned
    row-major (N, K) A, a fresh (K, M) B, a fresh (N, M) result), prepared for ``device``. Where that config
    has a transposed twin that runs the call's own problem (``HgemmSm90Config.transposed``: the Hopper
    kernel), the twin: a binary that takes x, w.t(), c and out as they lie and runs their transpose, writing
    out^T where out lies (a plain launch, no per-call views or copies). Elsewhere (the sm80-style kernel)
    ``SwappedLaunch``'s copies."""
    widest = widest_vector(problem.dtype)
    fresh = widest_dividing(problem.m, widest)
    swapped = GemmProblem(m=problem.n, n=problem.m, k=problem.k, dtype=problem.dtype, beta_zero=problem.beta_zero,
                          a_align=problem.b_align, b_align=fresh, c_align=fresh, sm=problem.sm)
    spec, config = choose_variant(policy.ranked(swapped), swapped, None, device.index)
    if getattr(config, "transposed", None) is not None:
        # The twin of the config chosen for the swapped problem, whatever that config's own ``transposed``
        # says: a tuned entry records false (it ran the swapped problem as it is, the N x M product the
        # twin's kernel runs), and the swap runs the transpose either way.
        twin = dataclasses.replace(config, transposed=True)
        if spec.why_unsupported(twin, problem) is None:
            return _prepare_chosen(spec, twin, problem, device, dtype)
    return SwappedLaunch(_prepare_chosen(spec, config, swapped, device, dtype))


def _prepare_inner(problem: GemmProblem, policy: GemmPolicy, device, dtype):
    """The compiled launch of the variant and config the op chooses for ``problem``, a stand-in problem of a
    launch that copies its operands (staged, swapped), prepared for ``device``. The GEMM entries' ``prepare``
    reads only the device of the tensors it is given, so empty ones stand in for the copies."""
    spec, config = choose_variant(policy.ranked(problem), problem, None, device.index)
    return _prepare_chosen(spec, config, problem, device, dtype)


def _prepare_chosen(spec, config, problem: GemmProblem, device, dtype):
    """``spec``'s launch of ``config`` for ``problem`` on ``device``, empty tensors standing in for the
    operands (``prepare`` reads only their device)."""
    empty = torch.empty(0, dtype=dtype, device=device)
    return on_device(device.index, spec.prepare, config, problem,
                     {"a": empty, "b": empty, "c": None if problem.beta_zero else empty}, empty)


def _padded(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class StagedLaunch:
    """A launch on copies of the operands in 16-byte-aligned, zero-padded buffers: K and N rounded up to the
    widest vector, so a fast variant that needs aligned rows (TMA) runs a problem whose rows are not. Per
    call: A and B copied into their buffers where they are not aligned already (the pad columns and rows
    are zero, so they add nothing to any dot product), C too when it is read and not aligned; the kernel
    writes an aligned (M, N padded) result, whose first N columns are copied into the caller's result when
    that is not aligned itself. Each copy is one torch op on the current stream, so the call stays
    stream-ordered and graph-capturable. The buffers are kept per stream and thread
    (``workspace.staging_buffer``: zeroed once, the pads never written), so a call costs one copy per staged
    operand; under graph capture, and for buffers too large to keep, they are fresh (``F.pad``) each call."""

    __slots__ = ("inner", "k_pad", "n_pad", "stage_a", "stage_b", "stage_c", "stage_out")

    def __init__(self, inner, k_pad: int, n_pad: int, stages: "tuple[bool, bool, bool, bool]"):
        self.inner, self.k_pad, self.n_pad = inner, k_pad, n_pad
        self.stage_a, self.stage_b, self.stage_c, self.stage_out = stages

    def __call__(self, a, b, c, out, alpha, beta) -> None:
        m, k = a.shape
        n = b.shape[1]
        device = a.device
        stream = current_stream_handle(device.index) if device.type == "cuda" else 0
        if self.stage_a:
            a = self._staged("a", a, device, stream, (m, self.k_pad))
        if self.stage_b:
            b = self._staged("b", b, device, stream, (self.k_pad, self.n_pad))
        if c is not None and self.stage_c:
            c = self._staged("c", c, device, stream, (m, self.n_pad))
        if self.stage_out:
            kept = staging_buffer("out", device, stream, out.dtype, (m, self.n_pad), (m, n))
            result = torch.empty(m, self.n_pad, dtype=out.dtype, device=device) if kept is None else kept[0]
        else:
            result = out
        self.inner(a, b, c, result, alpha, beta)
        if self.stage_out:
            take_result(out, result[:, :n] if kept is None else kept[1])

    @staticmethod
    def _staged(role: str, t, device, stream: int, shape: tuple):
        """``t`` copied into the top-left corner of a zeroed, row-major ``shape`` buffer."""
        kept = staging_buffer(role, device, stream, t.dtype, shape, tuple(t.shape))
        if kept is None:
            if tuple(t.shape) == shape:  # no padding: a row-major copy (F.pad would clone t's own strides)
                return t.clone(memory_format=torch.contiguous_format)
            import torch.nn.functional as F

            return F.pad(t, (0, shape[1] - t.shape[1], 0, shape[0] - t.shape[0]))  # a fresh, row-major tensor
        kept[1].copy_(t.detach())  # no autograd history on a buffer that outlives the call
        return kept[0]


def staged_problem(problem: GemmProblem, widest: int) -> "tuple[GemmProblem, tuple[bool, bool, bool, bool]]":
    """The aligned problem :class:`StagedLaunch` runs for ``problem`` (K and N padded to ``widest``), and
    which of A, B, C and the result need aligned copies: A where its rows are not aligned or K is padded; B
    also where N is padded or K is (it needs the extra zero rows); C (read only when beta != 0) and the
    result where their rows are not aligned or N is padded."""
    k_pad, n_pad = _padded(problem.k, widest), _padded(problem.n, widest)
    stage_a = problem.a_align != widest or k_pad != problem.k
    stage_b = problem.b_align != widest or k_pad != problem.k or n_pad != problem.n
    stage_c_out = problem.c_align != widest or n_pad != problem.n
    # A staged copy is row-major (StagedLaunch._staged makes it so); an operand used in place keeps its
    # majorness.
    aligned = GemmProblem(m=problem.m, n=n_pad, k=k_pad, dtype=problem.dtype, beta_zero=problem.beta_zero,
                          a_align=widest, b_align=widest, c_align=widest, sm=problem.sm,
                          a_major="k" if stage_a else problem.a_major, b_major="n" if stage_b else problem.b_major)
    return aligned, (stage_a, stage_b, stage_c_out and not problem.beta_zero, stage_c_out)


def stages_misaligned(problem: GemmProblem, min_work: int) -> bool:
    """What every op's staging rule (``GemmPolicy.stage``) asks first: one product of ``min_work``
    (M * N * K) or more whose rows are not all aligned to the widest vector, and not a call the GEMV variant
    takes, directly or transposed (a copy of the weight would cost more than the call)."""
    aligned = min(problem.a_align, problem.b_align, problem.c_align) == widest_vector(problem.dtype)
    return (not aligned and problem.batch == 1 and problem.m * problem.n * problem.k >= min_work
            and not gemv.takes(problem) and not gemv.takes_transposed(problem))


def prepare_gemm(a, b, c, alpha, beta, out, config, policy: GemmPolicy) -> GemmPlan:
    """The plan of a GEMM call, after every check of it in order (nothing allocated or written before
    they pass): the problem measured, the variant and config chosen (or the given config checked), the
    kernel compiled and loaded for the result's device.

    ``policy``: the op's dtypes, kernels and rules (:class:`GemmPolicy`); its rules apply only where the call
    names no config.
    """
    _checks.no_fake(a=a, b=b, c=c, out=out)  # before anything reads a pointer
    check_writable("out", out)  # as torch refuses an in-place write to an inference tensor: first
    config_classes = tuple(spec.config_cls for spec in policy.specs)
    shape, k, alpha, beta = validate_gemm_args(
        a, b, c, alpha=alpha, beta=beta, out=out, config=config, config_cls=config_classes, dtypes=policy.dtypes
    )
    m, n = shape[-2:]
    beta_zero = beta == 0.0
    if len(shape) == 3 and shape[0] > GRID_Z_MAX and not may_fold(a, b, shape):
        chunk_plans = CallPlans("gemm batch chunks", max_entries=8)
        return BatchChunks(shape, a.dtype, a.device, lambda a, b, c, alpha, beta, out: run_gemm(
            a, b, c, alpha, beta, out, config, policy, chunk_plans))

    def full(a, b, c, alpha, beta, out):  # this call's values do not fit the plan: prepared afresh
        return prepare_gemm(a, b, c, alpha, beta, out, config, policy)(
            a, b, c, alpha, beta, out)

    device = a.device
    expand_c = c is not None and runs_c_as_expansion(c, shape)
    copy_c = expand_c and not beta_zero and not expansion_is_rows(c, shape)
    fields = dict(shape=shape, dtype=a.dtype, device=device, beta_zero=beta_zero, k=k, full=full, expand_c=expand_c,
                  copy_c=copy_c)
    if copy_c:
        # Every call of this plan gives the kernel a row-major copy of c's expansion: measured on a stand-in.
        c = c.expand(shape).contiguous() if m == 1 else torch.empty(shape, dtype=c.dtype, device=c.device)
    elif expand_c and not beta_zero:
        c = c.expand(shape)
    if m == 0 or n == 0 or k == 0 or (len(shape) == 3 and shape[0] == 0):
        return GemmPlan(trivial=True, views=False, launch=None, **fields)
    result = out if out is not None else torch.empty(shape, dtype=a.dtype, device=device)
    c_read = c if (c is not None and not beta_zero) else None
    if len(shape) == 2 and operand_major("a", a) == "row" and operand_major("b", b) == "row":
        # One row-major product: the plan's own path (no arrangement).
        a_run, b_run, out_run = unit_strides(a), unit_strides(b), unit_strides(result)
        c_run = unit_strides(c_read) if c_read is not None else None
        views = a_run is not a or b_run is not b or out_run is not result or (c_run is not None and c_run is not c)
        arrange = None
    else:
        arrange = Arrangement.of(a, b, c_read, result)
        a_run, b_run, c_run, out_run = arrange(a, b, c_read, result)
        views = False
    problem = make_problem(a_run, b_run, c_run, beta=beta, out=out_run)
    copies, stage, swap = policy.copies, policy.stage, policy.swap
    if arrange is not None and config is None and copies is not None and any(copies(problem)):
        arrange, (a_run, b_run, c_run, out_run), problem = _copied(a, b, c_read, result, beta, *copies(problem))
    if config is None and stage is not None and stage(problem):
        launch = _prepare_staged(problem, policy, device, a.dtype)
        return GemmPlan(trivial=False, views=views, launch=launch, arrange=arrange, **fields)
    if config is None and swap is not None and swap(problem):
        launch = _prepare_swapped(problem, policy, device, a.dtype)
        return GemmPlan(trivial=False, views=views, launch=launch, arrange=arrange, **fields)
    if config is None and gemv.takes_transposed(problem):
        inner = _prepare_inner(gemv.transposed_problem(problem), policy, device, a.dtype)
        launch = gemv.TransposedLaunch(inner, copy_x=problem.b_major != "k")
        return GemmPlan(trivial=False, views=views, launch=launch, arrange=arrange, **fields)
    try:
        spec, chosen = choose_variant(policy.ranked(problem), problem, config, device.index)
    except ValueError:
        if arrange is None or (problem.a_major, problem.b_major) == ("k", "n") or isinstance(config, gemv.GemvConfig):
            raise
        # No variant takes these majors (a given config's kernel may not): row-major copies, on top of the
        # copies the op's policy already chose.
        arrange, (a_run, b_run, c_run, out_run), problem = _copied(
            a, b, c_read, result, beta, arrange.copy_a or problem.a_major != "k",
            arrange.copy_b or problem.b_major != "n")
        spec, chosen = choose_variant(policy.ranked(problem), problem, config, device.index)
    launch = on_device(device.index, spec.prepare, chosen, problem, {"a": a_run, "b": b_run, "c": c_run}, out_run)
    return GemmPlan(trivial=False, views=views, launch=launch, arrange=arrange, **fields)


class BatchChunks:
    """A batch past the kernels' grid (GRID_Z_MAX products) that does not fold into one GEMM: run as
    consecutive chunks of at most GRID_Z_MAX products, each a call of the op on the chunk's slices of a, b,
    c (those with the batch; one that broadcasts over it is passed whole) and the result, planned as such
    calls are. The whole call's checks ran before this plan was made; per call it repeats those that depend
    on the tensors' addresses (out against a, b and c), and prepares every chunk's plan with launches off
    (compiles, loads and each chunk's own checks) before any chunk is written: a chunk that fails there
    leaves the result as it was."""

    __slots__ = ("shape", "dtype", "device", "run")

    def __init__(self, shape, dtype, device, run):
        self.shape, self.dtype, self.device = shape, dtype, device
        self.run = run  # the op on one chunk, with plans of its own

    def __call__(self, a, b, c, alpha, beta, out):
        if out is None:
            result = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        else:
            check_out_overlaps(a, b, c, out, _checks.float32_scalar("beta", beta) == 0.0)
            result = out
        batch = self.shape[0]
        chunks = []
        for start in range(0, batch, GRID_Z_MAX):
            chunk = slice(start, min(batch, start + GRID_Z_MAX))
            chunks.append((*(t[chunk] if t is not None and t.dim() == 3 and t.shape[0] == batch else t
                             for t in (a, b, c)), result[chunk]))
        if not is_dry_run():
            with dry_run():  # the plans (a dry run launches nothing and writes nothing into the result)
                for a_part, b_part, c_part, part in chunks:
                    self.run(a_part, b_part, c_part, alpha, beta, part)
        for a_part, b_part, c_part, part in chunks:
            self.run(a_part, b_part, c_part, alpha, beta, part)
        return result


def _copied(a, b, c_read, result, beta, copy_a: bool, copy_b: bool):
    """The arrangement that runs row-major copies of the named operands, its tensors and their problem."""
    arrange = Arrangement.of(a, b, c_read, result, copy_a=copy_a, copy_b=copy_b)
    ran = arrange(a, b, c_read, result)
    return arrange, ran, make_problem(*ran[:3], beta=beta, out=ran[3])


def _prepare_staged(problem: GemmProblem, policy: GemmPolicy, device, dtype) -> StagedLaunch:
    """The staged launch of a misaligned ``problem``: the variant and config of its aligned twin, prepared
    for ``device`` (the per-call copies are :class:`StagedLaunch`'s)."""
    widest = widest_vector(problem.dtype)
    aligned, stages = staged_problem(problem, widest)
    return StagedLaunch(_prepare_inner(aligned, policy, device, dtype), aligned.k, aligned.n, stages)


def run_gemm(a, b, c, alpha, beta, out, config, policy: GemmPolicy, plans: CallPlans):
    """The body of a public GEMM op: the plan of this call's structure from ``plans`` (made by
    :func:`prepare_gemm` on the structure's first call), run on this call's tensors and scalars. The ops
    pass every argument by position: keywords cost a tiny call's host path measurably."""
    # beta's float32 zero-ness in the key keeps beta=0 and beta=1 calls apart (each has its plan; a beta such
    # as 1e-50, zero in float32, shares beta=0's); the plan itself decides on the float32 value.
    t = type(beta)
    if (type(a) is _TENSOR and type(b) is _TENSOR and config is None and type(alpha) is float and t is float
            and (c is None or type(c) is _TENSOR) and (out is None or type(out) is _TENSOR)):
        # The commonest calls (two plain tensors, float scalars, a plain c and out or none, no config), their
        # key written out: c's six parts or None, then out's six parts or None (a part that is None never
        # starts a tensor's six, which start with a dtype, so no two kinds of call meet).
        try:
            key = (_PLAIN_CALL, a.dtype, a.device, a.shape, a.stride(), a.data_ptr() & 31, a.is_neg(),
                   b.dtype, b.device, b.shape, b.stride(), b.data_ptr() & 31, b.is_neg(),
                   -_FLOAT32_ZERO_BOUND <= beta <= _FLOAT32_ZERO_BOUND)
            key += (None,) if c is None else (c.dtype, c.device, c.shape, c.stride(), c.data_ptr() & 31, c.is_neg())
            if out is not None:
                key += (out.dtype, out.device, out.shape, out.stride(), out.data_ptr() & 31, out.is_neg())
        except RuntimeError:  # a tensor without strides or storage (sparse, nested): the full path names it
            key = None
        if key is not None:
            return plans.keyed(key, prepare_gemm, a, b, c, alpha, beta, out, config, policy)(a, b, c, alpha, beta,
                                                                                            out)
    beta_is_zero = (-_FLOAT32_ZERO_BOUND <= beta <= _FLOAT32_ZERO_BOUND) if (t is float or t is int) else None
    plan = plans.plan((a, b, c, out, alpha, beta, beta_is_zero, config), prepare_gemm,
                      a, b, c, alpha, beta, out, config, policy)
    return plan(a, b, c, alpha, beta, out)


_FLOAT32_ZERO_BOUND = _checks.FLOAT32_ZERO_BOUND  # bound once: read on every call
_TENSOR = torch.Tensor
_PLAIN_CALL = object()  # the marker of run_gemm's own key (CallPlans.keyed)
