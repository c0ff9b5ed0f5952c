"""CPU tier for batched and transposed GEMMs (issue 24): the argument rules, the arrangement a call's
tensors get (fold, batch with broadcast, copies, canonical strides), the problem measured on it, the
variants' validity predicates, sm_90a compiles of every new kernel flavour, the traced (fake) path and the
autograd registration."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels as ck
from cute_kernels import torch_ops
from cute_kernels.ops.gemm import GemmConfig, GemmProblem, HgemmConfig, HgemmSm90Config
from cute_kernels.ops.gemm import hgemm_sm80, hgemm_sm90, sgemm
from cute_kernels.ops.gemm.op import Arrangement
from cute_kernels.ops.gemm.problem import make_problem, operand_major, result_shape, validate_gemm_args

F16 = torch.float16


def _validate(a, b, c=None, beta=0.0, out=None, dtypes=(torch.float32,)):
    return validate_gemm_args(a, b, c, alpha=1.0, beta=beta, out=out, config=None, config_cls=GemmConfig,
                              dtypes=dtypes)


# ---------------------------------------------------------------------------------------------- arguments
def test_majorness_of_views():
    x = torch.randn(6, 4)
    assert operand_major("a", x) == "row"
    assert operand_major("a", x.t()) == "col"
    assert operand_major("a", torch.randn(3, 6, 4).transpose(1, 2)) == "col"
    assert operand_major("a", torch.randn(1, 4).t()) == "row"  # one column: both, row wins
    assert operand_major("a", torch.randn(8, 10)[:, :4]) == "row"  # a slice of a wider matrix
    with pytest.raises(ValueError, match="a: expected row-major matrices"):
        operand_major("a", torch.randn(8, 8)[::2, ::2])


@pytest.mark.parametrize("a_shape, b_shape, expect", [
    ((5, 3), (3, 4), (5, 4)),
    ((2, 5, 3), (3, 4), (2, 5, 4)),
    ((5, 3), (2, 3, 4), (2, 5, 4)),
    ((2, 5, 3), (2, 3, 4), (2, 5, 4)),
    ((1, 5, 3), (6, 3, 4), (6, 5, 4)),
])
def test_result_shapes_follow_torch_matmul(a_shape, b_shape, expect):
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    assert result_shape(a, b) == expect == tuple(torch.matmul(a, b).shape)
    with pytest.raises(ValueError, match="a: expected a CUDA tensor"):  # every structural check passed
        _validate(a, b)


@pytest.mark.parametrize("c_shape", [(4,), (1, 4), (5, 1), (), (2, 1, 4), (1, 5, 4), (2, 5, 4), (5, 4)])
def test_batched_c_broadcasts_as_baddbmm(c_shape):
    a, b, c = torch.randn(2, 5, 3), torch.randn(3, 4), torch.randn(c_shape)
    with pytest.raises(ValueError, match="a: expected a CUDA tensor"):  # every structural check passed
        _validate(a, b, c, beta=1.0)


def test_bad_batched_c_and_out_are_refused_naming_them():
    a, b = torch.randn(2, 5, 3), torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match=r"c: expected shape \(2, 5, 4\) or one that broadcasts"):
        _validate(a, b, torch.randn(3, 5, 4), beta=1.0)
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 5, 4\)"):
        _validate(a, b, out=torch.empty(5, 4))
    with pytest.raises(ValueError, match="out: expected row-major"):
        _validate(a, b, out=torch.empty(2, 4, 5).transpose(1, 2))
    # A batch past the grid is not refused: the op runs it folded or in chunks (test_gemm_front_end_cpu).
    for a, b in (((70000, 1, 1), (70000, 1, 1)), ((70000, 40000, 1), (1, 1))):
        with pytest.raises(ValueError, match="^a: expected a CUDA tensor"):  # the device check, after the others
            _validate(torch.empty(a, device="meta"), torch.empty(b, device="meta"))


def test_a_batch_past_the_grid_passes_where_it_folds():
    """A batch of a times one b matrix runs as one GEMM of B * M rows, so the grid's batch limit is not its."""
    for b in (torch.empty(1, 1, device="meta"), torch.empty(1, 1, 1, device="meta")):
        with pytest.raises(ValueError, match="a: expected a CUDA tensor"):  # every structural check passed
            _validate(torch.empty(70000, 2, 1, device="meta"), b)


# ---------------------------------------------------------------------------------------------- arrangement
def _arrange(a, b, out=None, c=None):
    result = out if out is not None else torch.empty(result_shape(a, b))
    arrangement = Arrangement.of(a, b, c, result)
    return arrangement, arrangement(a, b, c, result)


def test_x_at_w_folds_into_one_gemm():
    a, w = torch.randn(4, 6, 8), torch.randn(8, 5)
    arrangement, (a_run, b_run, _, out_run) = _arrange(a, w)
    assert arrangement.fold
    assert a_run.shape == (24, 8) and out_run.shape == (24, 5) and b_run.shape == (8, 5)
    assert make_problem(a_run, b_run, out=out_run).batch == 1
    torch.testing.assert_close(a_run @ b_run, torch.matmul(a, w).reshape(24, 5))


def test_a_strided_batch_does_not_fold_and_a_single_operand_repeats_with_stride_zero():
    a = torch.randn(4, 10, 8)[:, :6]  # batch stride 80, not 6 rows x 8
    w = torch.randn(8, 5)
    arrangement, (a_run, b_run, _, out_run) = _arrange(a, w)
    assert not arrangement.fold and arrangement.batch == 4
    assert b_run.shape == (4, 8, 5) and b_run.stride(0) == 0
    problem = make_problem(a_run, b_run, out=out_run)
    assert (problem.batch, problem.a_major, problem.b_major) == (4, "k", "n")


def test_transposed_operands_keep_their_majorness_and_batches_of_one_are_matrices():
    a, b = torch.randn(1, 8, 6).transpose(1, 2), torch.randn(5, 8).t()
    arrangement, (a_run, b_run, _, out_run) = _arrange(a, b)
    assert arrangement.batch == 1 and a_run.dim() == 2 and out_run.dim() == 2
    problem = make_problem(a_run, b_run, out=out_run)
    assert (problem.a_major, problem.b_major) == ("m", "k")
    assert a_run.stride() == (1, 6) and b_run.stride() == (1, 8)


def test_copies_make_row_major_operands():
    a, b = torch.randn(3, 8, 6).transpose(1, 2), torch.randn(5, 8).t()
    result = torch.empty(3, 6, 5)
    arrangement = Arrangement.of(a, b, None, result, copy_a=True, copy_b=True)
    a_run, b_run, _, out_run = arrangement(a, b, None, result)
    problem = make_problem(a_run, b_run, out=out_run)
    assert (problem.a_major, problem.b_major, problem.batch) == ("k", "n", 1)  # a's copy folds
    torch.testing.assert_close(torch.matmul(a_run, b_run), torch.matmul(a, b).reshape(18, 5))


# ---------------------------------------------------------------------------------------------- variants
def test_the_variants_take_every_layout_and_refuse_batched_split_k():
    transposed = GemmProblem(m=64, n=64, k=64, a_major="m", b_major="k")
    assert sgemm.why_unsupported(GemmConfig(), transposed) is None
    assert "needs a_smem_major='m'" in sgemm.why_unsupported(GemmConfig(a_smem_major="k"), transposed)
    assert sgemm.default_config(transposed).a_smem_major == "m"
    half = GemmProblem(m=64, n=64, k=64, dtype="float16", b_major="k", a_major="m", a_align=8, b_align=8, c_align=8)
    assert hgemm_sm80.why_unsupported(HgemmConfig(tile_m=64, tile_n=64, warps_m=2, warps_n=2), half) is None
    assert hgemm_sm90.why_unsupported(HgemmSm90Config(), half) is None
    assert "split-K" in hgemm_sm80.why_unsupported(HgemmConfig(split_k=2), GemmProblem(**{**half.__dict__, "batch": 3}))
    batched = GemmProblem(m=64, n=64, k=4096, batch=4)
    assert "split-K" in sgemm.why_unsupported(GemmConfig(split_k=2), batched)
    assert sgemm.default_config(batched).split_k == 1


COMPILES = [
    ("sgemm", sgemm, GemmConfig(), GemmProblem(m=64, n=64, k=64, batch=3)),
    ("sgemm-beta", sgemm, GemmConfig(), GemmProblem(m=64, n=64, k=64, batch=3, beta_zero=False, a_align=1)),
] + [
    (f"sgemm-{a}{b}-align{align}", sgemm, config,
     GemmProblem(m=256, n=256, k=256, a_align=align, b_align=align, c_align=align, a_major=a, b_major=b,
                 beta_zero=align == 4))
    for a in "km" for b in "nk" for align in (4, 1) if (a, b) != ("k", "n")
    for config in (GemmConfig(), GemmConfig(tile_m=32, tile_n=32, tile_k=8, threads_m=8, threads_n=8),
                   GemmConfig(a_smem_major="k")) if not (a == "m" and config.a_smem_major == "k")
] + [
    ("sm80", hgemm_sm80, HgemmConfig(), GemmProblem(m=64, n=64, k=64, dtype="float16", batch=3, a_align=8,
                                                      b_align=8, c_align=8)),
] + [
    (f"sm80-{a}{b}-align{align}", hgemm_sm80, config,
     GemmProblem(m=256, n=256, k=256, dtype="float16", a_align=align, b_align=align, c_align=align, a_major=a,
                 b_major=b, beta_zero=align == 8))
    for a in "km" for b in "nk" for align in (8, 2) if (a, b) != ("k", "n")
    for config in (HgemmConfig(), HgemmConfig(tile_m=16, tile_n=128, tile_k=64, num_stages=4, warps_m=1, warps_n=4))
] + [
    (f"sm90-{a}{b}-b{batch}", hgemm_sm90, HgemmSm90Config(cluster_m=2),
     GemmProblem(m=512, n=512, k=512, dtype="bfloat16", a_align=8, b_align=8, c_align=8, batch=batch, a_major=a,
                 b_major=b, beta_zero=batch == 1))
    for a in "km" for b in "nk" for batch in (1, 5)
]


@pytest.mark.parametrize("name, variant, config, problem", COMPILES, ids=[c[0] for c in COMPILES])
def test_new_flavours_compile_for_sm90a(name, variant, config, problem):
    assert os.environ.get("CUTE_DSL_ARCH", "sm_90a") == "sm_90a" or torch.cuda.is_available()
    assert variant.compile(config, problem, "sm_90a") is not None


def test_compile_keys_tell_layouts_and_batches_apart():
    plain = GemmProblem(m=64, n=64, k=64, dtype="float16", a_align=8, b_align=8, c_align=8)
    keys = {hgemm_sm90.compile_key(HgemmSm90Config(), p, "sm_90a") for p in (
        plain, GemmProblem(**{**plain.__dict__, "a_major": "m"}), GemmProblem(**{**plain.__dict__, "b_major": "k"}),
        GemmProblem(**{**plain.__dict__, "batch": 2}), GemmProblem(**{**plain.__dict__, "batch": 7}))}
    assert len(keys) == 4  # batches of 2 and 7 share a binary (the batch is a runtime value)


# ---------------------------------------------------------------------------------------------- traced and autograd
@pytest.fixture
def compiling(monkeypatch):
    monkeypatch.setattr(torch_ops, "_is_compiling", lambda: True)


def test_traced_batched_and_transposed_calls_have_torch_shapes(compiling):
    with FakeTensorMode():
        a, b = torch.empty(3, 8, 4, device="cuda", dtype=F16), torch.empty(6, 4, device="cuda", dtype=F16)
        assert ck.hgemm(a, b.t()).shape == (3, 8, 6)
        assert ck.sgemm(torch.empty(4, 8, device="cuda").t(), torch.empty(2, 4, 5, device="cuda")).shape == (2, 8, 5)


def test_gemm_custom_ops_have_a_backward():
    """An input requiring grad takes the custom op, which autograd records (no refusal): here it reaches
    the device check, the last one, with CPU tensors."""
    a = torch.randn(4, 3, requires_grad=True)
    with pytest.raises(ValueError, match="a: expected a CUDA tensor"):
        ck.sgemm(a, torch.randn(3, 2))
    with pytest.raises(ValueError, match="out: ck.sgemm with out= does not support automatic differentiation"):
        ck.sgemm(a, torch.randn(3, 2), out=torch.empty(4, 2))


# ---------------------------------------------------------------------------------------------- decode rows
def test_a_few_rows_times_a_transposed_weight_runs_as_its_transpose():
    from cute_kernels.ops.gemm.hgemm import _swaps as hgemm_swaps
    from cute_kernels.ops.gemm.op import SwappedLaunch, swaps

    decode = GemmProblem(m=24, n=4096, k=4096, dtype="float32", a_align=4, b_align=4, c_align=4, b_major="k")
    assert swaps(decode) and swaps(GemmProblem(**{**decode.__dict__, "m": 64, "k": 2048}))
    assert not swaps(GemmProblem(**{**decode.__dict__, "m": 8}))  # the GEMV variant's rows
    # HGEMM's rule on sm_90: up to 16 rows the GEMV variant does not take; past them the Hopper kernel as
    # they lie.
    half = GemmProblem(**{**decode.__dict__, "dtype": "float16", "a_align": 8, "b_align": 8, "c_align": 8})
    assert not hgemm_swaps(half) and not hgemm_swaps(GemmProblem(**{**half.__dict__, "m": 17}))
    assert swaps(half)  # the bound is HGEMM's own
    assert hgemm_swaps(GemmProblem(**{**half.__dict__, "sm": 80}))  # off sm_90 the swap stays
    assert hgemm_swaps(GemmProblem(**{**half.__dict__, "a_align": 4, "k": 4092}))  # x's rows not 16-byte aligned
    decode = half
    for rule in (swaps, hgemm_swaps):
        assert not rule(GemmProblem(**{**decode.__dict__, "m": 16}))  # its tensor-core kernel's, 16-byte rows
        assert rule(GemmProblem(**{**decode.__dict__, "m": 16, "a_align": 1, "k": 4095}))  # rows not 16-byte aligned
        assert not rule(GemmProblem(**{**decode.__dict__, "m": 65, "k": 2048, "a_align": 1}))  # past SWAP_MAX_ROWS
        assert not rule(GemmProblem(**{**decode.__dict__, "b_major": "n", "sm": 80}))  # row-major b: runs as it is
        assert not rule(GemmProblem(**{**decode.__dict__, "batch": 2, "sm": 80}))
        assert not rule(GemmProblem(**{**decode.__dict__, "m": 64, "n": 65536, "k": 65536, "sm": 80}))  # SWAP_MAX_WORK

    seen = {}

    def inner(a, b, c, out, alpha, beta):  # a stand-in kernel: row-major operands only
        assert a.stride(1) == 1 and b.stride(1) == 1 and (c is None or c.stride(1) == 1)
        seen["shapes"] = (tuple(a.shape), tuple(b.shape), tuple(out.shape))
        out.copy_(alpha * a @ b + (0 if c is None else beta * c))

    x, w, c = torch.randn(3, 16), torch.randn(24, 16), torch.randn(3, 24)
    out = torch.full((3, 24), float("nan"))
    SwappedLaunch(inner)(x, w.t(), c, out, 1.5, 0.5)
    assert seen["shapes"] == ((24, 16), (16, 3), (24, 3))
    torch.testing.assert_close(out, 1.5 * x @ w.t() + 0.5 * c)


def _decode(m, n, k, **fields):
    """x (m, k) @ w.t() with w (n, k), fp16, 16-byte rows: the problem the op measures."""
    return GemmProblem(**{**dict(m=m, n=n, k=k, dtype="float16", a_align=8, b_align=8, c_align=8, b_major="k"),
                          **fields})


def _swap_launch(problem):
    """The op's swapped launch of ``problem`` (``op._prepare_swapped``, every prepare a stand-in): the
    launch's type name, and the variant, config and problem it was prepared with."""
    from cute_kernels.ops.gemm import hgemm as hgemm_module
    from cute_kernels.ops.gemm import op as op_module

    prepared = []

    def on_device(index, prepare_fn, config, problem, inputs, out):
        spec = next(s for s in hgemm_module._POLICY.specs if s.prepare is prepare_fn)
        prepared.append((spec.variant, config, problem))
        return lambda *args: None

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(op_module, "on_device", on_device)
        launch = op_module._prepare_swapped(problem, hgemm_module._POLICY, torch.device("cpu"), torch.float16)
    (one,) = prepared
    return type(launch).__name__, one


def _swapped(problem, **fields):
    """The swapped problem ``op._prepare_swapped`` chooses a config for: (N, K) row-major A, a fresh B and result."""
    return GemmProblem(**{**dict(m=problem.n, n=problem.m, k=problem.k, dtype=problem.dtype, a_align=8, b_align=8,
                                 c_align=8), **fields})


def test_the_swap_runs_the_transposed_twin_where_the_swapped_problems_variant_is_hoppers():
    """Where the swapped problem's chosen variant is the Hopper kernel, the op prepares that config's
    transposed twin (``HgemmSm90Config.transposed``) for the call's own problem: a plain launch that takes
    x, w.t(), c and out as they lie and writes out^T where out lies. Where the twin cannot run the call (out's
    rows not 16-byte aligned) and on the sm80-style kernel, ``SwappedLaunch``'s copies."""
    decode = _decode(32, 4096, 4096)
    name, (variant, config, problem) = _swap_launch(decode)
    assert (name, variant, config.transposed, problem) == ("function", "sm90_wgmma", True, decode)
    assert config == dataclasses.replace(hgemm_sm90.default_config(_swapped(decode)), transposed=True)

    misaligned_out = _decode(32, 4096, 4096, c_align=4)
    name, (variant, config, problem) = _swap_launch(misaligned_out)
    assert (name, variant, config.transposed, problem) == ("SwappedLaunch", "sm90_wgmma", False,
                                                           _swapped(misaligned_out))

    name, (variant, config, problem) = _swap_launch(_decode(17, 11008, 4096))
    assert (name, variant, type(config), problem.m, problem.b_major) == ("SwappedLaunch", "sm80_mma", HgemmConfig,
                                                                          11008, "n")


@pytest.mark.parametrize("recorded", [False, True], ids=["table-false", "table-true"])
def test_the_swaps_twin_comes_from_a_tuned_entry_of_the_swapped_problem(recorded, tmp_path, monkeypatch):
    """A tuned entry for the swapped problem records ``"transposed": false`` (the sweep ran that problem as it
    is): the swap still runs the transposed twin, the entry's config with ``transposed`` set, not the
    entry's field as written (a hand-written true gives the same twin)."""
    import json

    from cute_kernels import tuned

    decode = _decode(32, 4096, 4096)
    swapped = _swapped(decode)
    entry = HgemmSm90Config(tile_m=128, tile_n=64, consumer_warpgroups=1, num_stages=5, transposed=recorded)
    assert entry != dataclasses.replace(hgemm_sm90.default_config(swapped), transposed=recorded)  # the table's, seen
    fields = dataclasses.asdict(entry)
    assert fields["transposed"] is recorded
    table = {"format": tuned.FORMAT, "op": hgemm_sm90.SPEC.op, "variant": hgemm_sm90.SPEC.variant,
             "entries": [{"arch": "sm_90", "bucket": hgemm_sm90.SPEC.shape_bucket(swapped), "config": fields,
                          "speedup": 1.0, "source": "test"}]}
    monkeypatch.setenv("CUTE_KERNELS_TUNED_DIR", str(tmp_path))
    tuned.user_path_for(hgemm_sm90.SPEC).write_text(json.dumps(table))
    monkeypatch.setattr(tuned, "table_arch", lambda index: "sm_90")
    monkeypatch.setattr(tuned, "_tables", {})
    monkeypatch.setattr(tuned, "_choices", {})
    assert tuned.choose(hgemm_sm90.SPEC, swapped, None) == entry  # the entry applies to the swapped problem

    name, (variant, config, problem) = _swap_launch(decode)
    assert (name, variant, config, problem) == ("function", "sm90_wgmma", dataclasses.replace(entry, transposed=True),
                                                decode)


@pytest.mark.parametrize("transposed", [False, True])
def test_a_decode_call_runs_a_given_config_as_it_is_and_the_swap_in_place(transposed, monkeypatch):
    """Through ``ck.hgemm`` on CPU tensors (each prepare a stand-in launch that records what it was prepared
    with and the tensors it is given, and computes the product): with no config, 24 rows run the Hopper
    kernel on the call's own problem (past hgemm.SWAP_SM90_MAX_ROWS nothing is swapped), handed x, w.t(),
    c and out as they lie, the result written into out itself (a bias read through its expansion, a full c,
    none); a given config runs the call's problem as given, ``transposed`` or not."""
    from cute_kernels.ops.gemm import hgemm as hgemm_module
    from cute_kernels.ops.gemm import op as op_module
    from cute_kernels.runtime import checks, plans

    prepared, launched = [], []

    def stand_in(a, b, c, out, alpha, beta):
        launched.append((a.data_ptr(), a.stride(), b.data_ptr(), b.stride(), None if c is None else c.data_ptr(),
                         None if c is None else c.stride(), out.data_ptr(), out.stride()))
        out.copy_((alpha * a.double() @ b.double() + (0 if c is None else beta * c.double())).to(out.dtype))

    def on_device(index, fn, *args):
        spec = next((s for s in hgemm_module._POLICY.specs if s.prepare is fn), None)
        if spec is None:
            return fn(*args)
        config, problem = args[:2]
        prepared.append((spec.variant, config, problem))
        return stand_in

    monkeypatch.setattr(checks, "cuda_tensor", lambda name, t: t)
    monkeypatch.setattr(op_module, "on_device", on_device)
    plans.clear_all()
    try:
        m, n, k = 24, 4096, 4096
        x, w = torch.randn(m, k).to(F16), torch.randn(n, k).to(F16)
        for c in (torch.randn(n).to(F16), torch.randn(m, n).to(F16), None):
            prepared.clear()
            launched.clear()
            out = torch.full((m, n), float("nan"), dtype=F16)
            beta = 0.0 if c is None else 0.5
            assert ck.hgemm(x, w.t(), c, alpha=1.5, beta=beta, out=out) is out
            [(variant, config, problem)] = prepared
            assert (variant, config.transposed, problem.m, problem.n, problem.b_major, problem.d_major) == (
                "sm90_wgmma", False, m, n, "k", "n")
            expanded = None if c is None else c.expand(m, n)
            assert launched == [(x.data_ptr(), x.stride(), w.data_ptr(), w.t().stride(),
                                 None if c is None else expanded.data_ptr(), None if c is None else expanded.stride(),
                                 out.data_ptr(), out.stride())]
            expect = 1.5 * x.double() @ w.double().t() + (0 if c is None else 0.5 * c.double())
            torch.testing.assert_close(out.double(), expect, rtol=2e-3, atol=2e-3)

        given = HgemmSm90Config(tile_m=64, tile_n=64, consumer_warpgroups=1, num_stages=6, transposed=transposed)
        prepared.clear()
        ck.hgemm(x, w.t(), config=given)
        [(variant, config, problem)] = prepared
        assert (variant, config, problem.m, problem.n, problem.b_major) == ("sm90_wgmma", given, m, n, "k")
    finally:
        plans.clear_all()
