"""The GEMM ops' whole front end on CPU, with each variant's compiled kernel replaced by a float64 emulation:
every check, the arrangement a call gets (folds, batches with stride-0 operands, copies, the decode swap,
staging), the plans, trivial calls and the backward run as on a GPU, and the results are compared with
torch.matmul. The emulation also checks what the compiled function would check (ranks, unit strides, the
divisibility of leading dimensions and batch strides, pointer alignment), so a view the kernel would refuse
fails here too. What it cannot cover is the kernels themselves: the GPU tier does."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

import cute_kernels as ck
from cute_kernels import tuned
from cute_kernels.ops.gemm import compile as compile_module
from cute_kernels.ops.gemm import gemv as gemv_module
from cute_kernels.ops.gemm import hgemm as hgemm_module
from cute_kernels.ops.gemm import hgemm_sm80, hgemm_sm90
from cute_kernels.ops.gemm import op as op_module
from cute_kernels.ops.gemm import sgemm as sgemm_module
from cute_kernels.ops.gemm import sgemm_sm90, sgemm_tf32x3
from cute_kernels.runtime import checks, dry_run, plans


def _vectors(spec, config, problem):
    if spec is sgemm_module.SPEC:
        return sgemm_module._kernel_vectors(config, problem)
    if spec in (hgemm_sm80.SPEC, sgemm_tf32x3.SPEC):
        return compile_module.alignment_vectors(problem)
    return hgemm_sm90._VECTORS


def _emulated(problem, vectors):
    """A stand-in for the compiled function of ``problem``: its argument checks on the tensors as a call
    passes them (a (M, K), b (K, N), c and d (M, N), column-major with ``d_major`` "m", batched with a
    leading L), then the product in float64,
    rounded once into D. (tests/test_gemm_signatures_cpu.py runs the real compiled functions' checks.)"""
    batched = problem.batch > 1

    def check(name, t, row_major, vector):
        assert t.dim() == (3 if batched else 2), (name, tuple(t.shape))
        unit, ld = (-1, -2) if row_major else (-2, -1)
        if t.shape[unit] != 1:
            assert t.stride(unit) == 1, (name, "unit stride", t.stride())
        if t.shape[ld] != 1:
            assert t.stride(ld) % vector == 0, (name, "leading dimension", t.stride(), vector)
        if batched and t.shape[0] != 1:
            assert t.stride(0) % vector == 0, (name, "batch stride", t.stride(), vector)
        assert t.data_ptr() % (vector * t.element_size()) == 0, (name, "alignment", vector)

    def compiled(a, b, c, d, alpha, beta, *extra):
        check("a", a, problem.a_major == "k", vectors[0])
        check("b", b, problem.b_major == "n", vectors[1])
        check("c", c, problem.d_major == "n", vectors[2])
        check("d", d, problem.d_major == "n", vectors[2])
        product = torch.matmul(a.double(), b.double())
        result = alpha * product + (0.0 if problem.beta_zero else beta * c.double())
        d.copy_(result.to(d.dtype))

    return compiled


def _emulated_gemv(problem):
    """A stand-in for the GEMV launch of ``problem``: the kernel's reads (x rows at a's row stride, w rows at
    b's column stride, unit strides assumed along K, c and out at both their strides) rebuilt from the
    pointers and strides it is given, then the product in float64, rounded once into out."""
    vector = gemv_module._vector(problem)

    def view(t, rows, cols, ld, cs=1):
        return torch.as_strided(t, (rows, cols), (ld, cs), t.storage_offset())

    def launch(a, b, c, out, alpha, beta):
        m, k = a.shape
        n = out.shape[1]
        if problem.b_major == "n":  # gemv_rows_kernel: x by the element, b's rows in chunks along N
            assert k == 1 or a.stride(1) == 1, ("unit stride of x along K", a.stride())
            assert n == 1 or b.stride(1) == 1, ("unit stride of b along N", b.stride())
            if vector > 1:
                assert b.stride(0) % vector == 0 and b.data_ptr() % 16 == 0 and n % vector == 0, ("b", b.stride())
            x, w = view(a, m, k, a.stride(0)).double(), view(b, k, n, b.stride(0)).double()
            result = alpha * (x @ w)
            if beta != 0.0:
                result = result + beta * view(c, m, n, *c.stride()).double()
            view(out, m, n, *out.stride()).copy_(result.to(out.dtype))
            return
        assert k == 1 or (a.stride(1) == 1 and b.stride(0) == 1), ("unit strides along K", a.stride(), b.stride())
        if vector > 1:
            for name, t, ld in (("a", a, a.stride(0)), ("b", b, b.stride(1))):
                assert ld % vector == 0 and t.data_ptr() % 16 == 0, (name, "alignment", ld)
            assert k % vector == 0, ("K", k, vector)
        x, w = view(a, m, k, a.stride(0)).double(), view(b, n, k, b.stride(1)).double()
        result = alpha * (x @ w.T)
        if beta != 0.0:
            result = result + beta * view(c, m, n, *c.stride()).double()
        view(out, m, n, *out.stride()).copy_(result.to(out.dtype))

    return launch


SM90_LAUNCHES = []  # every call of the emulated Hopper 3xTF32 launch, for the tests that route calls there


def _emulated_sm90():
    """A stand-in for the Hopper 3xTF32 launch: its own check of the tensors it is given (what its tensor
    maps can describe; C only where beta reads it), then the product in float64, rounded once into out."""

    def launch(a, b, c, out, alpha, beta):
        SM90_LAUNCHES.append((tuple(a.shape), tuple(b.stride())))
        c = c if beta != 0.0 else None
        assert sgemm_sm90.why_not(a, b, 90, out, c) is None, sgemm_sm90.why_not(a, b, 90, out, c)
        result = alpha * torch.matmul(a.double(), b.double())
        if c is not None:
            result = result + beta * c.double()
        out.copy_(result.to(out.dtype))

    return launch


class _EmulatedSpec:
    """A registry entry whose prepare gives the emulated launch (everything else is the entry's own)."""

    def __init__(self, spec):
        self._spec = spec

    def __getattr__(self, name):
        return getattr(self._spec, name)

    def prepare(self, config, problem, inputs, out):
        assert self._spec.why_unsupported(config, problem) is None
        if self._spec.variant == "gemv":
            return _emulated_gemv(problem)
        if self._spec is sgemm_sm90.SPEC:
            return _emulated_sm90()
        compiled = _emulated(problem, _vectors(self._spec, config, problem))
        return compile_module.CompiledLaunch(compiled, problem.beta_zero)


@pytest.fixture
def emulated(monkeypatch):
    """ck.sgemm / ck.hgemm on CPU tensors, each variant's kernel emulated; the heuristic configs (no tuned
    tables) and a fresh set of plans."""
    monkeypatch.setattr(checks, "cuda_tensor", lambda name, t: t)
    monkeypatch.setattr(op_module, "on_device", lambda index, fn, *args: fn(*args))
    monkeypatch.setattr(tuned, "choose_supported",
                        lambda spec, problem, device: (lambda c: (c, spec.supports(c, problem)))(spec.default_config(problem)))
    entries = (sgemm_module.SPEC, sgemm_module.GEMV_SPEC, sgemm_tf32x3.SPEC, sgemm_sm90.SPEC, hgemm_sm80.SPEC, hgemm_sm90.SPEC,
               hgemm_module.GEMV_SPEC)
    wrapped = {id(s): _EmulatedSpec(s) for s in entries}
    for module in (sgemm_module, hgemm_module):
        policy = module._POLICY
        monkeypatch.setattr(module, "_POLICY", dataclasses.replace(
            policy, specs=tuple(wrapped[id(s)] for s in policy.specs),
            order=lambda p, order=policy.order: tuple(wrapped[id(s)] for s in order(p))))
    plans.clear_all()
    yield
    plans.clear_all()


def _operand(shape, transposed, dtype=torch.float32):
    if transposed:
        shape = (*shape[:-2], shape[-1], shape[-2])
    t = torch.randn(shape).to(dtype)
    return t.transpose(-1, -2) if transposed else t


def _expect(a, b, c=None, alpha=1.0, beta=0.0):
    ref = alpha * torch.matmul(a.double(), b.double())
    return ref if c is None or beta == 0 else ref + beta * c.double()


CASES = [  # a shape, b shape, c shape (None: no c)
    ((5, 7), (7, 9), None), ((3, 5, 7), (7, 9), (9,)), ((5, 7), (3, 7, 9), (5, 1)), ((3, 5, 7), (3, 7, 9), (3, 1, 9)),
    ((1, 5, 7), (4, 7, 9), (1, 5, 9)), ((4, 1, 7), (7, 70), (70,)), ((2, 70), (70, 130), ()), ((3, 70), (70, 100), None),
]


@pytest.mark.parametrize("a_shape, b_shape, c_shape", CASES)
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_results_match_torch_matmul(emulated, a_shape, b_shape, c_shape, layout, dtype):
    op = ck.sgemm if dtype == torch.float32 else ck.hgemm
    a, b = _operand(a_shape, layout[0] == "T", dtype), _operand(b_shape, layout[1] == "T", dtype)
    c = None if c_shape is None else torch.randn(c_shape).to(dtype)
    beta = 0.0 if c is None else 0.5
    for _ in range(2):  # the first call prepares the plan, the second runs it
        out = op(a, b, c, alpha=1.5, beta=beta)
        torch.testing.assert_close(out.double(), _expect(a, b, c, 1.5, beta), rtol=2e-3, atol=2e-3)


def _launched(monkeypatch):
    """The (a, b, c, out) of every kernel launch the op makes from here on (``on_device``'s calls of a launch;
    in a dry run a launch launches nothing, so those are not counted)."""
    received = []
    real = op_module.on_device
    monkeypatch.setattr(op_module, "on_device",
                        lambda index, fn, *args: (received.append(args[:4]) if len(args) == 6 and not dry_run.is_dry_run()
                                                  else None) or real(index, fn, *args))
    return received


@pytest.mark.parametrize("rows", [40, 1])
@pytest.mark.parametrize("c_shape, a_view", [((96,), True), ((1, 96), True), ((1, 1, 96), True), ((4, 1, 96), False),
                                              ("matrix", False), ("column", False), ((), False)])
def test_a_broadcast_c_reaches_the_kernel_as_a_view_where_it_is_one_row(emulated, monkeypatch, rows, c_shape, a_view):
    """torch.addmm's broadcast c: a bias row (one row for every result row of every batch) reaches the kernel
    as its expansion, a view of c's own memory (leading dimension and batch stride 0), on every call of the
    plan, and x @ w still folds its batch into one matrix (decode rows included: (B, 1, K)); a column or a
    scalar (column stride 0, which the kernels' C layout does not take), one matrix or one row per batch, as a
    fresh row-major copy of the expansion."""
    a_view = a_view or (c_shape == "matrix" and rows == 1)  # a (1, 96) matrix is a bias row
    c_shape = {"matrix": (rows, 96), "column": (rows, 1)}.get(c_shape, c_shape)
    received = _launched(monkeypatch)
    a, b = torch.randn(4, rows, 64), torch.randn(64, 96)
    c = torch.randn(c_shape)
    for _ in range(2):  # the call that prepares the plan, then the plan's own path
        received.clear()
        out = ck.sgemm(a, b, c, alpha=1.5, beta=0.5)
        torch.testing.assert_close(out.double(), _expect(a, b, c, 1.5, 0.5), rtol=1e-4, atol=1e-4)
        ((kernel_a, _, kernel_c, _),) = received
        shares = kernel_c.untyped_storage().data_ptr() == c.untyped_storage().data_ptr()
        whole = tuple(c_shape) == (4, rows, 96)  # (4, 1, 96) for one-row matrices: no broadcast at all
        assert shares is (a_view or whole), (c_shape, kernel_c.shape, kernel_c.stride())
        if not a_view:
            assert kernel_c.stride(-1) == 1 and kernel_c.stride(-2) == kernel_c.shape[-1]
        if a_view or len(c_shape) < 3:
            assert kernel_a.dim() == 2, "the batch folds into one matrix"


@pytest.mark.parametrize("op, dtype", [(ck.sgemm, torch.float32), (ck.hgemm, torch.float16)])
@pytest.mark.parametrize("batch", [None, 3])
def test_a_column_major_c_is_read_from_a_row_major_copy(emulated, monkeypatch, op, dtype, batch):
    """torch.addmm takes c in any layout: a column-major c of the result's shape (a transposed view, batched
    too) reaches the kernel as a fresh row-major copy, on the plan's first call and its repeats, and c is
    left as it was."""
    received = _launched(monkeypatch)
    lead = () if batch is None else (batch,)
    a, b = torch.randn(*lead, 40, 64).to(dtype), torch.randn(64, 24).to(dtype)
    c = torch.randn(*lead, 24, 40).to(dtype).transpose(-1, -2)
    before = c.clone()
    for _ in range(2):
        received.clear()
        out = op(a, b, c, alpha=1.5, beta=0.5)
        torch.testing.assert_close(out.double(), _expect(a, b, c, 1.5, 0.5), rtol=2e-3, atol=2e-3)
        ((_, _, kernel_c, _),) = received
        assert kernel_c.stride(-1) == 1 and kernel_c.untyped_storage().data_ptr() != c.untyped_storage().data_ptr()
    assert torch.equal(c, before)


@pytest.mark.parametrize("op, dtype", [(ck.sgemm, torch.float32), (ck.hgemm, torch.float16)])
def test_a_row_of_out_as_c_is_read_from_a_copy(emulated, monkeypatch, op, dtype):
    """c a row of out itself (``out[:1]``, in place by pointer and strides) with beta != 0: the kernel would
    write that row while every row reads it, so the op hands the kernel a copy of the expansion."""
    received = _launched(monkeypatch)
    for a_shape, out_shape, row in (((40, 64), (40, 96), lambda o: o[:1]), ((4, 1, 64), (4, 1, 96), lambda o: o[:1, :1])):
        a, b = torch.randn(a_shape).to(dtype), torch.randn(64, 96).to(dtype)
        out = torch.randn(out_shape).to(dtype)
        expect = _expect(a, b, row(out).clone(), 1.0, 1.0)
        received.clear()
        assert op(a, b, row(out), beta=1.0, out=out) is out
        torch.testing.assert_close(out.double(), expect, rtol=2e-3, atol=2e-3)
        kernel_c = received[0][2]
        assert kernel_c.untyped_storage().data_ptr() != out.untyped_storage().data_ptr()


@pytest.mark.parametrize("a_shape, b_shape", [((3, 2, 0), (0, 4)), ((2, 3), (3, 3, 0)), ((0, 2, 3), (3, 4)),
                                              ((0, 2, 3), (1, 3, 4)), ((3, 0, 5), (5, 4))])
def test_calls_without_a_kernel_have_torch_matmul_shapes(emulated, a_shape, b_shape):
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    expect = torch.matmul(a, b)
    out = ck.sgemm(a, b)
    assert out.shape == expect.shape and torch.equal(out, expect)
    c = torch.randn(expect.shape[-1])
    torch.testing.assert_close(ck.sgemm(a, b, c, beta=2.0), expect + 2.0 * c)  # K == 0: beta * c
    # A full-shape c and an out of a batch of no matrices have no layout to check (and no first matrix).
    full_c, out = torch.randn(expect.shape), torch.empty(expect.shape)
    assert ck.sgemm(a, b, full_c, beta=2.0, out=out) is out and out.shape == expect.shape


@pytest.mark.parametrize("op, dtype", [(ck.sgemm, torch.float32), (ck.hgemm, torch.float16)])
def test_a_misaligned_c_whose_expansion_is_contiguous_reaches_the_kernel_copied(emulated, op, dtype):
    """c (M, N) for a batch of one: its expansion to (1, M, N) is already contiguous, so contiguous() would
    hand the kernel c's own memory, one element off the alignment the plan measured on an aligned stand-in
    (the emulated kernel asserts the alignment it was compiled for); a copy is fresh memory."""
    a, b = torch.randn(1, 8, 16).to(dtype), torch.randn(16, 16).to(dtype)
    c = torch.randn(8 * 16 + 1).to(dtype)[1:].view(8, 16)
    expect = (a.double() @ b.double() + c.double()).to(dtype)
    for _ in range(2):  # the first call and the plan's repeat
        torch.testing.assert_close(op(a, b, c, beta=1.0), expect, rtol=1e-2, atol=1e-2)


GRAD_CASES = [  # (a, b) factories: the reviewer's cases whose backward built operands the ops refuse, and more
    lambda: (torch.randn(4, 5), torch.randn(3, 5, 7)[..., :1]),
    lambda: (torch.randn(3, 5, 7)[..., 0:1].transpose(1, 2), torch.randn(5, 6)),
    lambda: (torch.randn(3, 1, 5), torch.randn(5, 6)),
    lambda: (torch.randn(1, 1), torch.randn(3, 1, 1)),
    lambda: (torch.randn(1, 0), torch.randn(1, 0, 1)),
    lambda: (torch.randn(3, 4, 5), torch.randn(6, 5).t()),
    lambda: (torch.randn(5, 4).t(), torch.randn(3, 5, 6)),
]


@pytest.mark.parametrize("case", range(len(GRAD_CASES)))
@pytest.mark.parametrize("reduce", ["sum", "batch-sum-squared"])
def test_gradients_match_autograd(emulated, case, reduce):
    a0, b0 = GRAD_CASES[case]()
    a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    ta, tb = a0.double().requires_grad_(), b0.double().requires_grad_()

    def loss(y):
        return y.sum() if reduce == "sum" or y.dim() == 2 else (y.sum(0) ** 2).sum()

    ours = torch.autograd.grad(loss(ck.sgemm(a, b, alpha=1.5)), (a, b))
    theirs = torch.autograd.grad(loss(1.5 * torch.matmul(ta, tb)), (ta, tb))
    for g, t in zip(ours, theirs):
        assert g.shape == t.shape
        torch.testing.assert_close(g.double(), t, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("a_shape, b_shape", [((5, 4, 7), (7, 6)), ((4, 7), (5, 7, 6)), ((1, 4, 7), (5, 7, 6))])
def test_a_broadcast_operands_gradient_folded_past_the_extent_runs_in_chunks(emulated, monkeypatch, a_shape, b_shape):
    """The gradient of an operand that broadcast over the batch is one GEMM whose K is the batch folded with
    rows (or columns); where that K passes the kernels' extent (here lowered to 10) it runs over chunks of
    whole batches (2, 2 and 1 of 4 rows; five of one batch of 6 columns), their products summed."""
    from cute_kernels import torch_ops

    monkeypatch.setattr(torch_ops, "FOLD_MAX_K", 10)
    chunks = []
    batch_chunks = torch_ops._batch_chunks
    monkeypatch.setattr(torch_ops, "_batch_chunks", lambda *args: chunks.append(batch_chunks(*args)) or chunks[-1])
    a0, b0 = torch.randn(a_shape), torch.randn(b_shape)
    a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    ta, tb = a0.double().requires_grad_(), b0.double().requires_grad_()
    ours = torch.autograd.grad((ck.sgemm(a, b, alpha=1.5) ** 2).sum(), (a, b))
    theirs = torch.autograd.grad(((1.5 * torch.matmul(ta, tb)) ** 2).sum(), (ta, tb))
    for g, t in zip(ours, theirs):
        assert g.shape == t.shape
        torch.testing.assert_close(g.double(), t, rtol=1e-4, atol=1e-4)
    assert chunks == ([[(0, 2), (2, 4), (4, 5)]] if len(a_shape) == 3 and a_shape[0] == 5
                      else [[(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]])


def test_decode_rows_times_a_transposed_weight(emulated, monkeypatch):
    """x (M, K) @ w.t() with few rows: up to 8 rows on the GEMV variant (w read as it lies), and up to 16
    16-bit 16-byte rows where its tensor-core kernel's grid fills the GPU; more as the transpose (op.SwappedLaunch; M == 1 of a
    misaligned 16-bit x included there, where x^T is already contiguous but not in the kernel's canonical
    strides), but 16-bit 16-byte rows past 16, which the Hopper kernel runs as they lie
    (hgemm.SWAP_SM90_MAX_ROWS; CPU problems describe the H200)."""
    prepared = []
    swapped = op_module._prepare_swapped
    monkeypatch.setattr(op_module, "_prepare_swapped", lambda *args: prepared.append("swap") or swapped(*args))
    for m, dtype, op, aligned, n in itertools.product((1, 3, 8, 9, 16, 17, 64), (torch.float32, torch.float16),
                                                      (ck.sgemm, ck.hgemm), (True, False), (200, 2200)):
        if (op is ck.sgemm) != (dtype == torch.float32):
            continue
        k = 96 if aligned else 97
        x, w, bias = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype), torch.randn(n).to(dtype)
        prepared.clear()
        out = op(x, w.t(), bias, beta=1.0)
        torch.testing.assert_close(out.double(), _expect(x, w.t(), bias, 1.0, 1.0), rtol=2e-3, atol=2e-3)
        # 9-16 rows: the tensor-core kernel where its grid fills the GPU's SMs (2200 columns: 138 CTAs).
        gemv = m <= 8 or (m <= 16 and dtype == torch.float16 and aligned and n == 2200)
        swap = not gemv and (dtype == torch.float32 or not aligned or m <= hgemm_module.SWAP_SM90_MAX_ROWS)
        assert prepared == (["swap"] if swap else []), (m, dtype, aligned, prepared)


def test_a_skinny_n_runs_as_the_transposed_gemv(emulated, monkeypatch):
    """sgemm with N <= 8 and more rows than the GEMV takes runs as out^T = b^T @ a^T on it
    (gemv.TransposedLaunch): b^T copied row-major only where b is row-major, out^T and c^T as transposed
    views; N of 9, a column-major a and hgemm stay on the tile kernels."""
    from cute_kernels.ops.gemm import gemv as gemv_ops

    launched = []
    call = gemv_ops.TransposedLaunch.__call__
    monkeypatch.setattr(gemv_ops.TransposedLaunch, "__call__",
                        lambda self, *args: launched.append(self.copy_x) or call(self, *args))
    for m, n, k, b_major, a_major in ((300, 8, 96, "row", "row"), (300, 5, 97, "col", "row"), (40, 1, 64, "row", "row"),
                                      (300, 9, 96, "row", "row"), (300, 8, 96, "row", "col")):
        a = _operand((m, k), a_major == "col")
        b = _operand((k, n), b_major == "col")
        bias = torch.randn(n)
        launched.clear()
        out = ck.sgemm(a, b, bias, alpha=0.5, beta=1.0)
        torch.testing.assert_close(out.double(), _expect(a, b, bias, 0.5, 1.0), rtol=1e-4, atol=1e-4)
        expected = [b_major == "row"] if n <= 8 and a_major == "row" else []
        assert launched == expected, (m, n, k, b_major, a_major, launched)
    # One column of b, 4 bytes off 16-byte alignment: b^T is contiguous as it lies, so only a real copy gives
    # the kernel the aligned rows its vector loads need (the emulated launch asserts them).
    a, b = torch.randn(300, 96), torch.randn(97)[1:].unsqueeze(1)
    launched.clear()
    torch.testing.assert_close(ck.sgemm(a, b).double(), _expect(a, b), rtol=1e-4, atol=1e-4)
    assert launched == [True]
    launched.clear()
    ck.hgemm(torch.randn(300, 96).half(), torch.randn(96, 8).half())
    assert launched == []


def test_a_pinned_gemv_config_runs_wherever_the_variant_supports_the_call(emulated):
    """A GemvConfig runs on the GEMV variant even where the op would not route the call there (16-bit rows
    past one that are not 16-byte aligned), and names the reason where the variant cannot run it."""
    from cute_kernels.ops.gemm import GemvConfig

    for op, dtype in ((ck.hgemm, torch.float16), (ck.sgemm, torch.float32)):
        x, w = torch.randn(5, 98).to(dtype)[:, 1:], torch.randn(40, 98).to(dtype)[:, 1:]
        out = op(x, w.t(), config=GemvConfig(False, 8, 4))
        torch.testing.assert_close(out.double(), _expect(x, w.t()), rtol=2e-3, atol=2e-3)
        with pytest.raises(ValueError, match="M=17 rows"):
            op(torch.randn(17, 97).to(dtype), w.t(), config=GemvConfig())


def test_gemv_default_configs():
    """One row on the FP32-FMA kernel; 16-bit 16-byte rows past one (up to 16) on tensor cores: on sm_90 the
    TMA kernel for 9-16 rows and from N = 8192, elsewhere the warp-MMA kernel with K split over 16, 8 or 4
    warps so the grid holds about 4096 warps; float32 and 16-bit rows that are not 16-byte aligned on FP32
    FMAs, with more columns per warp and K over more warps as rows grow."""
    from cute_kernels.ops.gemm import GemmProblem, GemvConfig

    def config(m, n, dtype="float16", align=8, sm=80):
        return gemv_module.default_config(GemmProblem(m=m, n=n, k=4096, dtype=dtype, a_align=align, b_align=align,
                                                      c_align=align, b_major="k", sm=sm))

    tma = GemvConfig(True, tma_stages=gemv_module.TMA_DEFAULT_STAGES)
    assert config(9, 4096, sm=90) == config(16, 4096, sm=90) == config(2, 8192, sm=90) == tma
    assert config(8, 4096, sm=90) == GemvConfig(True, 16, 1) and config(1, 14336, sm=90) == GemvConfig(False, 8, 4)
    assert config(16, 4096, align=1, sm=90) == GemvConfig(False, 8, 4, 2, 4)
    assert config(1, 4096) == GemvConfig(False, 8, 4) and config(4, 4096, "float32", 4) == GemvConfig(False, 8, 4)
    assert config(2, 4096) == GemvConfig(True, 16, 1) and config(8, 8192) == GemvConfig(True, 8, 1)
    assert config(8, 14336) == GemvConfig(True, 4, 1)
    assert config(3, 4096, align=1) == GemvConfig(False, 8, 4, 4, 4)
    assert config(8, 4096, align=1) == GemvConfig(False, 8, 4, 2, 4)
    assert config(5, 4096, "float32", 4) == GemvConfig(False, 8, 2, 4, 8)
    assert config(16, 4096, "float32", 4) == GemvConfig(False, 8, 4, 1, 4)
    assert config(16, 4096) == GemvConfig(True, 16, 1) and config(12, 14336) == GemvConfig(True, 8, 2, 2)
    assert config(16, 4096, align=1) == GemvConfig(False, 8, 4, 2, 4)


def test_only_sgemm_copies_a_column_major_b_and_only_from_1024_rows(emulated, monkeypatch):
    """sgemm reads a column-major b as it lies below ``COPY_K_MAJOR_B_MIN_ROWS`` rows and from a row-major
    copy from there (its transposing stage copies ran slower at 4096^3); hgemm's kernels read it as it lies."""
    copied = []
    arrangement_of = op_module.Arrangement.of

    def recording(*args, **kwargs):
        arrangement = arrangement_of(*args, **kwargs)
        copied.append((arrangement.copy_a, arrangement.copy_b))
        return arrangement

    monkeypatch.setattr(op_module.Arrangement, "of", staticmethod(recording))
    rows = sgemm_module.COPY_K_MAJOR_B_MIN_ROWS
    for op, dtype, m in itertools.product((ck.sgemm, ck.hgemm), (torch.float32, torch.float16), (rows - 1, rows)):
        if (op is ck.sgemm) != (dtype == torch.float32):
            continue
        a, b = _operand((m, 40), True, dtype), _operand((40, 24), True, dtype)
        copied.clear()
        torch.testing.assert_close(op(a, b).double(), _expect(a, b), rtol=2e-3, atol=2e-3)
        assert copied[-1] == (False, op is ck.sgemm and m >= rows), (op, m, copied)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_gemv_tensor_core_kernel_compiles_for_16_rows_and_32_columns(arch):
    """The tensor-core GEMV's row and column groups (9-16 rows of x, 32 output columns per CTA), with K split
    across CTAs too (an instantiation of its own), compile for both archs the CPU tier checks, through the
    variant's own compile and names."""
    from cute_kernels.ops.gemm import GemmProblem, GemvConfig

    names = []
    for m, columns, warps, dtype, k_ctas in ((16, 1, 16, "float16", 1), (9, 2, 8, "bfloat16", 1),
                                             (16, 2, 4, "float16", 1), (12, 2, 16, "float16", 1),
                                             (16, 2, 8, "float16", 2), (3, 1, 16, "bfloat16", 4)):
        problem = GemmProblem(m=m, n=4096, k=4096, dtype=dtype, a_align=8, b_align=8, c_align=8, b_major="k")
        config = GemvConfig(True, warps, 2, columns, k_ctas=k_ctas)
        assert gemv_module.why_unsupported(config, problem) is None
        assert gemv_module.columns_per_cta(config, problem) == 16 * columns
        assert gemv_module.compile(config, problem, arch).data[:4] == b"\x7fELF"
        names.append(gemv_module.name_expression(config, problem))
    assert any(name.endswith(", 2, 2, true>") for name in names)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_gemv_default_kernels_do_not_spill(arch):
    """Every kernel the GEMV's default picks (1-16 rows, both 16-bit dtypes and float32, N from a few CTAs to
    an LLM's MLP) keeps to registers under the NVRTC that compiles it; CI runs this under its newest NVRTC
    and under 13.0, the H200's. Sweep candidates are not held to it: ptxas's own register targets differ
    between releases (13.0 spills a loop counter of the 16-warp, 2-in-flight, 16-row kernel at 40 registers
    that 13.5 keeps), and a sweep times a candidate as it compiles. The 16-row, 32-column warp-MMA kernel of
    8 warps (the default off sm_90) keeps to 64 registers on sm_90a too, four CTAs an SM: with the split's
    code in it, it took 74 and three, and ran 16 x 14336 x 4096 at 52.8 us where it had run 41.6 (H200,
    docs/notes/gemm.md)."""
    from cute_kernels.ops.gemm import GemmProblem
    from cute_kernels.runtime import nvrtc

    sm = 90 if arch == "sm_90a" else 80
    names = set()
    for m, n, dtype in itertools.product((1, 2, 5, 8, 9, 12, 16), (1000, 4096, 14336),
                                         ("float16", "bfloat16", "float32")):
        align = 4 if dtype == "float32" else 8
        problem = GemmProblem(m=m, n=n, k=4096, dtype=dtype, a_align=align, b_align=align, c_align=align,
                              b_major="k", sm=sm)
        if gemv_module.takes(problem):
            names.add(gemv_module.name_expression(gemv_module.default_config(problem), problem))
    assert any("gemv_mma_kernel" in name for name in names) and any("gemv_kernel<" in name for name in names)
    assert any("gemv_tma_kernel" in name for name in names) == (sm == 90)
    for name, usage in nvrtc.resource_usage(gemv_module.SOURCE, sorted(names), arch).items():
        assert not (usage.spill_stores or usage.spill_loads or usage.stack), (name, usage)
    if arch == "sm_90a":
        problem = GemmProblem(m=16, n=14336, k=4096, dtype="float16", a_align=8, b_align=8, c_align=8, b_major="k",
                              sm=80)
        default = gemv_module.name_expression(gemv_module.default_config(problem), problem)
        assert default == "gemv::gemv_mma_kernel<__half, 8, 2, 2, 2, false>"
        assert nvrtc.resource_usage(gemv_module.SOURCE, [default], arch)[default].registers <= 64


def test_gemv_tma_kernel_config_rules():
    """The TMA GEMV (``tma_stages``): a tensor-core config with no warps, unroll, columns or k_warps of its own,
    a ring depth from ``TMA_STAGES``; sm_90 and the tensor-core kernel's rows only, 128 output columns a CTA,
    its own instantiation with and without the K split."""
    from cute_kernels.ops.gemm import GemmProblem, GemvConfig

    for bad in (dict(tensor_cores=False), dict(warps=16), dict(unroll=2), dict(columns=2)):
        with pytest.raises(ValueError, match="tma_stages"):
            GemvConfig(**{"tensor_cores": True, "tma_stages": 8, **bad})
    with pytest.raises(ValueError, match="tma_stages"):
        GemvConfig(True, tma_stages=5)
    config = GemvConfig(True, tma_stages=8, k_ctas=2)
    assert config.short() == "tma_s8_k2" and config in gemv_module.candidates()
    problem = GemmProblem(m=16, n=14336, k=4096, dtype="bfloat16", a_align=8, b_align=8, c_align=8, b_major="k")
    assert gemv_module.why_unsupported(config, problem) is None
    assert gemv_module.columns_per_cta(config, problem) == 128
    assert gemv_module.name_expression(config, problem) == "gemv::gemv_tma_kernel<__nv_bfloat16, 8, true>"
    assert gemv_module.name_expression(GemvConfig(True, tma_stages=4), problem).endswith(", 4, false>")
    assert "sm_90" in gemv_module.why_unsupported(config, dataclasses.replace(problem, sm=80))
    for other in (dict(dtype="float32", a_align=4, b_align=4, c_align=4), dict(a_align=4)):
        for tma_config in (config, GemvConfig(True, tma_stages=8)):
            assert "16-bit" in gemv_module.why_unsupported(tma_config, dataclasses.replace(problem, **other))
    assert "M=17" in gemv_module.why_unsupported(config, dataclasses.replace(problem, m=17))


def test_gemv_tma_kernel_compiles_to_wgmma_without_spills():
    """Every ring depth of the TMA GEMV, split or not, both 16-bit types, compiles for sm_90a through the
    variant's own compile without spills or serialised wgmmas, and its ring fits the opt-in shared memory."""
    from cute_kernels.ops.gemm import GemmProblem, GemvConfig
    from cute_kernels.runtime import nvrtc
    from cute_kernels.runtime.device import SM90_SHARED_OPTIN_BYTES

    names = []
    for stages, k_ctas, dtype in itertools.product(gemv_module.TMA_STAGES, (1, 2), ("float16", "bfloat16")):
        problem = GemmProblem(m=12, n=4096, k=4096, dtype=dtype, a_align=8, b_align=8, c_align=8, b_major="k")
        config = GemvConfig(True, tma_stages=stages, k_ctas=k_ctas)
        assert gemv_module.tma_shared_bytes(config) <= SM90_SHARED_OPTIN_BYTES
        assert gemv_module.compile(config, problem, "sm_90a").data[:4] == b"\x7fELF"
        names.append(gemv_module.name_expression(config, problem))
    for name, usage in nvrtc.resource_usage(gemv_module.SOURCE, names, "sm_90a").items():
        assert not (usage.spill_stores or usage.spill_loads or usage.stack or usage.wgmma_serialized), (name, usage)


def test_gemv_k_split_across_ctas_is_a_tensor_core_or_row_major_weight_config():
    """k_ctas (K split across CTAs, their partial tiles summed by the last): tensor-core configs, or FP32-FMA
    ones on a row-major weight, refused for the problems the FMA kernel of a transposed weight runs, named in
    tables, and the launch's Params carry the workspace pointers at the offsets gemv.cu's static_assert
    fixes (120 bytes)."""
    import ctypes

    from cute_kernels.ops.gemm import GemmProblem, GemvConfig

    config = GemvConfig(True, 8, 2, 2, k_ctas=2)
    assert config.short() == "mma_w8_u2_c2_k2" and GemvConfig(True, 8, 2, 2).short() == "mma_w8_u2_c2"
    assert GemvConfig(False, 8, 4, 1, 8, k_ctas=4).short() == "simt_w8_u4_c1_s8_k4"
    with pytest.raises(ValueError, match="k_ctas"):
        GemvConfig(True, 8, 2, k_ctas=3)
    aligned = GemmProblem(m=16, n=4096, k=4096, dtype="float16", a_align=8, b_align=8, c_align=8, b_major="k")
    assert gemv_module.why_unsupported(config, aligned) is None
    for other in (dataclasses.replace(aligned, dtype="float32", a_align=4, b_align=4, c_align=4),
                  dataclasses.replace(aligned, k=4095, a_align=1, b_align=1)):
        assert "row-major weight's kernel only" in gemv_module.why_unsupported(config, other)
    fma_split = GemvConfig(False, 8, 4, k_ctas=2)
    assert "row-major weight's kernel only" in gemv_module.why_unsupported(fma_split, dataclasses.replace(aligned, m=4))
    assert gemv_module.why_unsupported(fma_split, dataclasses.replace(aligned, m=4, b_major="n")) is None
    assert any(c.k_ctas > 1 for c in gemv_module.candidates())
    assert ctypes.sizeof(gemv_module.Params) == 120
    assert gemv_module.Params.partials.offset == 104 and gemv_module.Params.arrivals.offset == 112


def test_gemv_k_split_covers_every_k_block_once():
    """gemv_mma_kernel's share of CTA y: k-blocks [min(B, y * ceil(B / Y)), min(B, (y + 1) * ceil(B / Y))):
    together every block exactly once, whatever B and Y (a CTA past the end walks none and still arrives)."""
    for blocks in range(1, 300):
        for ctas in (1, 2, 4, 8):
            per_cta = -(-blocks // ctas)
            walked = []
            for y in range(ctas):
                first = min(blocks, y * per_cta)
                walked += range(first, min(blocks, first + per_cta))
            assert walked == list(range(blocks)), (blocks, ctas)


def test_sgemm_runs_the_hopper_3xtf32_entry_where_it_routes(emulated, monkeypatch):
    """ck.sgemm reaches the tf32x3_wgmma entry's launch (the thresholds lowered so that small CPU problems
    qualify) with tensors its maps describe: plain, through a weight, with a bias, in place, x @ w folded
    into one product; a given config runs there too, a column-major a on a row-major copy; batches run there
    (a single a repeated over b's batch at batch stride 0)."""
    monkeypatch.setattr(sgemm_sm90, "TAKES_MIN_TILES", 1)
    monkeypatch.setattr(sgemm_sm90, "TAKES_MIN_K", 1)
    SM90_LAUNCHES.clear()
    a, b, w = torch.randn(64, 40), torch.randn(40, 48), torch.randn(48, 40)
    torch.testing.assert_close(ck.sgemm(a, b).double(), _expect(a, b))
    torch.testing.assert_close(ck.sgemm(a, w.t()).double(), _expect(a, w.t()))
    bias = torch.randn(48)
    torch.testing.assert_close(ck.sgemm(a, b, bias, beta=0.5).double(), _expect(a, b) + 0.5 * bias.double())
    c = torch.randn(64, 48)
    expect = _expect(a, b) + c.double()
    assert ck.sgemm(a, b, c, beta=1.0, out=c) is c
    torch.testing.assert_close(c.double(), expect)
    x = torch.randn(3, 64, 40)
    torch.testing.assert_close(ck.sgemm(x, b).double(), _expect(x, b))
    assert len(SM90_LAUNCHES) == 5 and SM90_LAUNCHES[-1][0] == (192, 40)
    # Skinny products stay on the other entries.
    ck.sgemm(torch.randn(16, 40), b)
    assert len(SM90_LAUNCHES) == 5
    config = sgemm_sm90.Sm90Tf32x3Config(2)
    torch.testing.assert_close(ck.sgemm(a.t().contiguous().t(), b, config=config).double(), _expect(a, b))
    assert len(SM90_LAUNCHES) == 6
    xb, yb = torch.randn(2, 64, 40), torch.randn(2, 40, 48)
    torch.testing.assert_close(ck.sgemm(xb, yb, config=config).double(), _expect(xb, yb))
    torch.testing.assert_close(ck.sgemm(a, yb).double(), _expect(a, yb))  # a repeated over b's batch
    assert len(SM90_LAUNCHES) == 8 and SM90_LAUNCHES[-1][0] == (2, 64, 40)


def test_a_staged_column_major_operand_copied_into_fresh_memory_is_row_major(emulated, monkeypatch):
    """Where no kept staging buffer serves (graph capture, a large operand), a staged operand is copied into
    fresh memory: row-major, as the staged problem says, even where no padding is added (a column-major a
    whose K needs none: a bare F.pad would be a clone that keeps its strides)."""
    from cute_kernels.runtime import workspace

    monkeypatch.setattr(sgemm_module, "STAGE_MIN_WORK", 1)
    monkeypatch.setattr(workspace, "STAGING_BYTES", 0)  # every staged operand in fresh memory
    staged = []
    run = op_module.StagedLaunch.__call__
    monkeypatch.setattr(op_module.StagedLaunch, "__call__", lambda self, *args: staged.append(1) or run(self, *args))
    a, b = torch.randn(64, 63).t(), torch.randn(64, 64)  # (63, 64) column-major, leading dimension 63: misaligned
    torch.testing.assert_close(ck.sgemm(a, b).double(), _expect(a, b), rtol=1e-4, atol=1e-4)
    assert staged


@pytest.mark.parametrize("a_transposed", [False, True])
def test_a_batch_past_the_grid_folds_through_copies_where_layouts_keep_it_apart(emulated, a_transposed):
    """A batch past the kernels' grid (65535) runs only folded (one GEMM of B * M rows): a column-major a,
    a c and an out whose matrices are apart run through row-major copies (the result copied into out), as
    the fake implementation accepts them."""
    batch = 70000
    a = _operand((batch, 3, 8), a_transposed)
    b = torch.randn(8, 4)
    c = torch.randn(batch, 4, 4)[:, :3]
    buffer = torch.full((batch, 4, 4), float("nan"))
    out = buffer[:, :3]
    for _ in range(2):  # the first call, then the plan's
        assert ck.sgemm(a, b, c, beta=0.5, out=out) is out
        torch.testing.assert_close(out.double(), _expect(a, b, c, beta=0.5), rtol=1e-5, atol=1e-5)
        assert torch.isnan(buffer[:, 3]).all()
    # A row-major a that folds as it lies is not copied for an out that does not.
    arranged = [p.arrange for p in sgemm_module._PLANS._plans.values()
                if isinstance(p, op_module.GemmPlan) and p.arrange is not None]
    assert len(arranged) == 1 and arranged[0].fold and arranged[0].fold_out and arranged[0].fold_c
    assert arranged[0].copy_a is a_transposed


@pytest.mark.parametrize("a_shape, b_shape, c_shape", [
    ((3, 8), (70000, 8, 4), None),  # one a times a batch of b: no fold
    ((70000, 3, 8), (70000, 8, 4), (70000, 3, 4)),
    ((70000, 3, 8), (1, 8, 4), (4,)),  # folds: one GEMM, as before
])
def test_a_batch_past_the_grid_that_does_not_fold_runs_in_chunks(emulated, monkeypatch, a_shape, b_shape, c_shape):
    """torch.bmm takes any batch; the kernels' grid holds 65535 products: a batch past it that does not fold
    into one GEMM runs as chunks of at most 65535 (slices of the batched operands, one that broadcasts
    passed whole), into one result, on the first call and the plan's repeats; an out that overlaps an
    operand is refused on a repeat too, before anything is written."""
    received = _launched(monkeypatch)
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    c = None if c_shape is None else torch.randn(c_shape)
    beta = 0.0 if c is None else 0.5
    folds = b_shape[0] == 1
    for _ in range(2):
        received.clear()
        out = ck.sgemm(a, b, c, beta=beta)
        torch.testing.assert_close(out.double(), _expect(a, b, c, beta=beta), rtol=1e-5, atol=1e-5)
        assert len(received) == (1 if folds else 2)
        assert all(kernel_a.dim() == 2 or kernel_a.shape[0] <= 65535 for kernel_a, *_ in received)
    if a.dim() == 3 and not folds:
        fresh = torch.empty(a.shape)[..., :4]
        ck.sgemm(a, b, c, beta=beta, out=fresh)  # the plan of this structure
        overlapping = a[..., :4]
        before = a.clone()
        with pytest.raises(ValueError, match="^out: "):
            ck.sgemm(a, b, c, beta=beta, out=overlapping)
        assert torch.equal(a, before)


def test_a_chunk_that_cannot_run_leaves_the_result_unwritten(emulated, monkeypatch):
    """Every chunk's plan is made before any chunk runs: a last chunk whose preparation fails (here a
    refusal planted for its 4465 products) leaves out as it was, the first chunk unwritten too."""
    real = op_module.prepare_gemm

    def refusing(a, b, *args):
        if b.dim() == 3 and b.shape[0] == 70000 - 65535:
            raise ValueError("b: planted refusal of the last chunk")
        return real(a, b, *args)

    monkeypatch.setattr(op_module, "prepare_gemm", refusing)
    received = _launched(monkeypatch)
    a, b = torch.randn(3, 8), torch.randn(70000, 8, 4)
    out = torch.full((70000, 3, 4), 7.0)
    with pytest.raises(ValueError, match="planted refusal"):
        ck.sgemm(a, b, out=out)
    assert not received and torch.equal(out, torch.full((70000, 3, 4), 7.0))


def test_a_batch_past_the_grid_folded_by_copies_keeps_the_ops_copy_policy(emulated):
    """The folded problem (B * M rows) is the one the op's copy policy judges: a K-major b on the FFMA kernel is
    copied row-major from 1024 rows, as for any GEMM of that many rows."""
    batch = 70000
    a, w = torch.randn(batch, 2, 8), torch.randn(16, 8)
    out = torch.full((batch, 3, 16), float("nan"))[:, :2]
    assert ck.sgemm(a, w.t(), out=out) is out
    torch.testing.assert_close(out.double(), _expect(a, w.t()), rtol=1e-5, atol=1e-5)
    arranged = [p.arrange for p in sgemm_module._PLANS._plans.values() if p.arrange is not None]
    assert len(arranged) == 1 and arranged[0].fold and arranged[0].copy_b and not arranged[0].copy_a


def test_gemv_rows_kernel_config_rules_and_default():
    """A row-major weight (x @ w, b (K, N) row-major) runs gemv_rows_kernel: FP32 FMAs, one 16-byte chunk of
    columns per lane (the scalar path where N's rows are misaligned), 1-8 rows of x; the default splits K
    over the CTA's 8 warps and across CTAs until about two CTAs an SM; the op takes float32 there."""
    from cute_kernels.ops.gemm import GemmProblem, GemvConfig

    problem = GemmProblem(m=1, n=4096, k=4096, dtype="float32", a_align=4, b_align=4, c_align=4, b_major="n")
    config = gemv_module.default_config(problem)
    assert config == GemvConfig(False, 8, 4, 1, 8, k_ctas=8)
    assert gemv_module.columns_per_cta(config, problem) == 128
    assert gemv_module.name_expression(config, problem) == "gemv::gemv_rows_kernel<float, 1, 8, 8, 4, 4, true>"
    assert gemv_module.takes(problem) and not gemv_module.takes(dataclasses.replace(problem, m=9))
    for dtype in ("float16", "bfloat16"):  # measured slower than the tiles there (gemv.ROW_MAJOR_TAKES_DTYPES)
        assert not gemv_module.takes(dataclasses.replace(problem, dtype=dtype, a_align=8, b_align=8, c_align=8))
    half = dataclasses.replace(problem, m=3, dtype="float16", a_align=1, b_align=8, c_align=8)
    assert gemv_module.name_expression(gemv_module.default_config(half), half).startswith(
        "gemv::gemv_rows_kernel<__half, 4, 8, 8, 8, 4, ")
    unaligned = dataclasses.replace(problem, n=77, b_align=1)
    assert gemv_module.columns_per_cta(config, unaligned) == 32
    short = dataclasses.replace(problem, k=100)
    assert gemv_module.default_config(short).k_ctas == 1  # each CTA keeps at least 64 rows of K
    for bad in (GemvConfig(True), GemvConfig(False, 8, 4, 2), GemvConfig(True, tma_stages=4)):
        assert "FP32 FMAs" in gemv_module.why_unsupported(bad, problem)
    assert "M=9" in gemv_module.why_unsupported(config, dataclasses.replace(problem, m=9))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_gemv_rows_kernel_defaults_compile_without_spills(arch):
    """Every gemv_rows_kernel the default picks (1-8 rows, three dtypes, aligned and scalar chunks, split or
    not) compiles without spills or stack: its accumulators, indexed by unrolled loops, stay in registers."""
    from cute_kernels.ops.gemm import GemmProblem
    from cute_kernels.runtime import nvrtc

    names = set()
    for dtype, m, (n, k, aligned) in itertools.product(("float32", "float16", "bfloat16"), (1, 2, 3, 5, 8),
                                                       ((4096, 4096, True), (77, 1000, False), (1000, 100, True))):
        align = (4 if dtype == "float32" else 8) if aligned else 1
        problem = GemmProblem(m=m, n=n, k=k, dtype=dtype, a_align=align, b_align=align, c_align=align, b_major="n")
        names.add(gemv_module.name_expression(gemv_module.default_config(problem), problem))
    assert any(name.endswith("true>") for name in names) and any(name.endswith("false>") for name in names)
    for name, usage in nvrtc.resource_usage(gemv_module.SOURCE, sorted(names), arch).items():
        assert not (usage.spill_stores or usage.spill_loads or usage.stack), (name, usage)
