"""The shape zoo on the CPU: every entry's everyday shapes are ones it runs by default, the zoo holds the
kinds of shape issue 22 names, and the report's summary lines compute what they say."""

import math

import pytest
import torch

from cute_kernels import registry
from cute_kernels.ops.gemm import hgemm as hgemm_op
from cute_kernels.ops.gemm import sgemm as sgemm_op
from cute_kernels.ops.gemm.zoo import contiguous_problem, hgemm_zoo, sgemm_zoo
from cute_kernels.tools import report
from cute_kernels.tools.bench import Row


OPS = sorted({spec.op for spec in registry.list()})


def _zoo_of(variant_key):
    return [p for spec, p in registry.zoo() if spec.key == variant_key]


@pytest.mark.parametrize("op", OPS)
def test_every_op_has_a_zoo_its_entries_run_with_their_default_configs(op):
    pairs = registry.zoo(op)
    assert len(pairs) >= 10
    problems = [p for _, p in pairs]
    assert len(set(map(repr, problems))) == len(problems)
    for spec, problem in pairs:
        assert spec.op == op
        assert spec.why_unsupported(spec.default_config(problem), problem) is None, problem


def test_the_hgemm_zoo_is_split_between_the_variants_the_op_runs():
    """Each HGEMM zoo shape is timed once, on the variant the op runs it on with no config: every variant
    gets some (the GEMV the decode steps through a transposed weight)."""
    pairs = registry.zoo("hgemm")
    assert sorted(repr(p) for _, p in pairs) == sorted(map(repr, hgemm_zoo()))
    for spec, problem in pairs:
        assert hgemm_op.default_variant(problem) is spec
    assert {spec.variant for spec, _ in pairs} == {"sm80_mma", "sm90_wgmma", "gemv"}
    assert {(p.m, p.n) for spec, p in pairs if spec.variant == "gemv"} == {(1, 4096), (16, 4096), (16, 14336)}


def test_attention_zoo_shapes_go_to_the_variant_the_op_runs():
    """float32 on flash2_tf32x3 where its grid fills the GPU and on fused_fp32 elsewhere (both kinds are in
    the zoo); 16-bit on the Hopper kernel (the zoo's problems are sm_90's), which takes every 16-bit zoo shape
    (d 64 or 128)."""
    from cute_kernels.ops.attention.flash2_tf32x3 import tf32x3_is_default_for
    float32 = set()
    for spec, problem in registry.zoo("attention"):
        if problem.dtype == torch.float32:
            float32.add(spec.variant)
            assert spec.variant == ("flash2_tf32x3" if tf32x3_is_default_for(problem) else "fused_fp32"), problem
        else:
            assert spec.variant == "flash3_wgmma", problem
    assert float32 == {"flash2_tf32x3", "fused_fp32"}


def test_the_gemm_zoos_hold_the_shapes_users_run():
    shapes = {(p.m, p.n, p.k) for p in hgemm_zoo() if p.dtype == "float16"}
    for m in (1, 16, 64, 128):
        assert {(m, 4096, 4096), (m, 11008, 4096), (m, 14336, 4096), (m, 4096, 11008), (m, 1024, 4096)} <= shapes
    assert {(4096, 16, 4096), (3072, 3072, 3072), (256, 256, 256), (1024, 1024, 1024), (1000, 1000, 1000),
            (2047, 2049, 1023)} <= shapes
    assert any(p.a_align < 8 for p in _zoo_of(("hgemm", "sm80_mma")))  # unaligned rows
    assert {"float16", "bfloat16"} == {p.dtype for p in hgemm_zoo()}
    assert {(1, 4096, 4096), (16, 4096, 4096), (64, 4096, 4096), (16, 4096, 11008), (4096, 128, 4096),
            (1024, 1024, 1024)} <= {(p.m, p.n, p.k) for p in sgemm_zoo()}


def test_the_other_zoos_hold_the_shapes_users_run():
    flash = _zoo_of(("attention", "flash3_wgmma"))
    assert any(p.batch == 1 and p.heads <= 16 and 512 <= p.m <= 2048 for p in flash)
    assert any(p.batch == 16 and p.m == 256 for p in flash)
    assert any(p.causal and p.m >= 8192 for p in flash)
    assert {64, 128} <= {p.d for p in flash} and {torch.float16, torch.bfloat16} == {p.dtype for p in flash}
    assert {torch.float32} == {p.dtype for p in _zoo_of(("attention", "fused_fp32"))}
    scan = [p for _, p in registry.zoo("scan")]
    assert min(p.numel for p in scan) == 1 << 10 and any(p.rows > 1 for p in scan)
    conv = [p for _, p in registry.zoo("conv3d")]
    assert {1, 2, 3, 4, 5, 6, 7} <= {p.kd for p in conv} and any(p.batch > 1 for p in conv)
    assert any(len({p.kd, p.kh, p.kw}) > 1 for p in conv)


@pytest.mark.parametrize("m, n, k, dtype, aligns", [
    (16, 4096, 4096, "float16", (8, 8, 8)), (2047, 2049, 1023, "float16", (1, 1, 1)),
    (64, 100, 1002, "bfloat16", (2, 4, 4)), (128, 4096, 4096, "float32", (4, 4, 4)), (7, 6, 5, "float32", (1, 2, 2)),
])
def test_zoo_problems_have_the_alignments_of_contiguous_operands(m, n, k, dtype, aligns):
    """As make_problem measures them on fresh (M, K) and (K, N) tensors."""
    from cute_kernels.ops.gemm.problem import make_problem

    p = contiguous_problem(m, n, k, dtype)
    assert (p.a_align, p.b_align, p.c_align) == aligns
    torch_dtype = getattr(torch, dtype)
    measured = make_problem(torch.empty(m, k, dtype=torch_dtype), torch.empty(k, n, dtype=torch_dtype),
                            out=torch.empty(m, n, dtype=torch_dtype))
    assert (measured.a_align, measured.b_align, measured.c_align) == aligns


def _row(op, problem, ours, base, wall, base_wall, verified=True):
    return Row(op, "v", problem, "c", ours, base, "vendor", wall, base_wall, 1.0, 1.0, verified, bound="fp16")


def test_the_zoo_summary_gives_geomean_and_worst_per_op_and_dtype():
    rows = [_row("hgemm", "m=1 dtype=float16", 10.0, 20.0, 10.0, 10.0),
            _row("hgemm", "m=2 dtype=float16", 10.0, 5.0, 20.0, 10.0),
            _row("hgemm", "m=3 dtype=bfloat16", 10.0, 9.0, 10.0, 9.0),
            _row("conv3d", "batch=1", 1.0, 16.0, 1.0, 2.0),
            _row("conv3d", "batch=2", 1.0, 1.0, 1.0, 1.0, verified=False)]
    lines = report.zoo_summary(rows)
    assert lines[0] == ("zoo geomean conv3d/float32: 16.00x (worst 16.00x over 1 shapes); wall/call 2.00x "
                        "(worst 2.00x); 1 of 2 FAILED their check")
    assert lines[1] == "zoo geomean hgemm/bfloat16: 0.90x (worst 0.90x over 1 shapes); wall/call 0.90x (worst 0.90x)"
    geomean = math.sqrt(2.0 * 0.5)
    assert lines[2] == (f"zoo geomean hgemm/float16: {geomean:.2f}x (worst 0.50x over 2 shapes); "
                        f"wall/call {math.sqrt(0.5):.2f}x (worst 0.50x)")


def test_the_zoo_summary_adds_a_line_per_other_library():
    """Attention's rows carry cuDNN's time beside the flash baseline's: a line of their own, over the shapes
    cuDNN ran (a NaN: it refused the shape), which issue 27's bar reads."""
    rows = [_row("attention", "m=1 dtype=float16", 10.0, 20.0, 10.0, 20.0),
            _row("attention", "m=2 dtype=float16", 10.0, 20.0, 10.0, 20.0),
            _row("attention", "m=3 dtype=float16", 10.0, 20.0, 10.0, 20.0)]
    rows[0].others_us = {"torch SDPA cuDNN": 8.0}
    rows[1].others_us = {"torch SDPA cuDNN": 12.5}
    rows[2].others_us = {"torch SDPA cuDNN": float("nan")}
    lines = report.zoo_summary(rows)
    assert lines[1] == ("zoo geomean attention/float16 against torch SDPA cuDNN: 1.00x (worst 0.80x over 2 shapes); "
                        "1 shape(s) it did not run")
    assert len(lines) == 2
    for r in rows[:2]:
        r.others_us = {"torch SDPA cuDNN": float("nan")}
    assert report.zoo_summary(rows)[1] == "zoo geomean attention/float16 against torch SDPA cuDNN: it ran none of the 3 shape(s)"


def test_rows_against_a_baseline_that_does_more_stay_out_of_the_geomean():
    """A windowed attention's dense masked baseline is not a like-for-like figure: the row stays in the table
    under its named baseline and out of the geomean and worst, and the line says how many were left out."""
    fair, dense = (_row("attention", "dtype=float16", 10.0, 12.0, 10.0, 12.0),
                   _row("attention", "dtype=float16 window=(64, 0)", 10.0, 300.0, 10.0, 300.0))
    dense.like_for_like = False
    assert report.zoo_summary([fair, dense]) == [
        "zoo geomean attention/float16: 1.20x (worst 1.20x over 1 shapes); wall/call 1.20x (worst 1.20x); "
        "1 shape(s) left out, their baseline doing more than the problem needs (named in the table)"]
    assert report.zoo_summary([dense])[0].startswith("zoo geomean attention/float16: no verified like-for-like shape")


def test_a_windowed_attention_names_its_dense_baseline():
    from cute_kernels.ops.attention import AttentionProblem

    spec = registry.get("attention", "flash2_mma")
    assert spec.baseline_caveat(AttentionProblem(1, 2, 64, 64, 64, torch.float16)) is None
    assert "dense boolean mask" in spec.baseline_caveat(AttentionProblem(1, 2, 64, 64, 64, torch.float16,
                                                                         window=(16, 0)))


def test_the_zoo_chart_is_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [_row("hgemm", "m=1 dtype=float16", 10.0, 20.0, 10.0, 10.0),
            _row("scan", "rows=1 length=1024", 5.0, 4.0, 5.0, 5.0)]
    rows[1].bound = "bandwidth"
    path = report.zoo_chart(rows, str(tmp_path / "zoo.png"), title="test")
    assert (tmp_path / "zoo.png").stat().st_size > 1000 and path.endswith("zoo.png")


@pytest.mark.parametrize("op", sorted({spec.op for spec in registry.list()}))
def test_every_op_has_held_out_shapes_apart_from_its_zoo_and_runnable_by_default(op):
    """The held-out shapes are new ones (none in the zoo), and each is one its entry runs by default (the
    problem its kernel runs, where the op runs another: ``registry.zoo_call``)."""
    held = registry.zoo(op, held_out=True)
    assert held
    zoo = {repr(p) for _, p in registry.zoo(op)}
    for spec, problem in held:
        assert repr(problem) not in zoo
        _, spec, problem = registry.zoo_call(op, problem) or (None, spec, problem)
        assert spec.supports(spec.default_config(problem), problem), (spec.key, problem)


def test_no_shipped_tuned_table_holds_a_held_out_shape():
    import json

    from cute_kernels import tuned

    for spec, problem in registry.zoo(held_out=True):
        path = tuned.path_for(spec)
        if spec.shape_bucket is not None and path.exists():
            buckets = {entry["bucket"] for entry in json.loads(path.read_text())["entries"]}
            assert spec.shape_bucket(problem) not in buckets, (spec.key, problem)


def test_held_out_summary_lines_say_so():
    lines = report.zoo_summary([_row("scan", "rows=1 length=7", 2.0, 3.0, 2.0, 2.0)], label="held-out")
    assert lines == ["held-out geomean scan/float32: 1.50x (worst 1.50x over 1 shapes); wall/call 1.00x (worst 1.00x)"]


def test_the_gemm_zoos_time_the_public_op_filed_under_the_entry_its_kernel_runs():
    """``bench --zoo`` times ck.hgemm / ck.sgemm themselves (``registry.zoo_call``): a misaligned shape the
    op stages is filed under the Hopper HGEMM entry or the SGEMM's with its aligned twin, an SGEMM shape of
    skinny N under the GEMV entry with its transpose, every other shape under the entry it routes to; ops
    that registered no call time their entry."""
    from cute_kernels.ops.gemm import gemv, sgemm_sm90

    staged = transposed = 0
    for op in ("hgemm", "sgemm"):
        for spec, problem in registry.zoo(op) + registry.zoo(op, held_out=True):
            _, entry, ran = registry.zoo_call(op, problem)
            module = hgemm_op if op == "hgemm" else sgemm_op
            if module._stage_unaligned(problem):
                staged += 1
                widest = 8 if op == "hgemm" else 4
                aligned_variant = ("tf32x3_wgmma" if sgemm_sm90.takes(ran) else
                                   "tf32x3_mma" if sgemm_op.takes_tf32x3(ran) else "simt_cpasync")
                assert entry.variant == ("sm90_wgmma" if op == "hgemm" else aligned_variant), problem
                assert (ran.a_align, ran.b_align, ran.c_align) == (widest,) * 3, problem
                assert (ran.m, ran.dtype, ran.beta_zero) == (problem.m, problem.dtype, problem.beta_zero)
                assert entry.why_unsupported(entry.default_config(ran), ran) is None
            elif op == "sgemm" and gemv.takes_transposed(problem):
                transposed += 1
                assert entry is spec and entry.variant == "gemv" and ran == gemv.transposed_problem(problem)
                assert entry.why_unsupported(entry.default_config(ran), ran) is None
            else:
                assert entry is spec and ran is problem
    assert staged >= 3  # hgemm 2047x2049x1023 (fp16, bf16), sgemm 2048x2048x2047
    assert transposed >= 1  # the held-out 8192x4x4096
    for op in ("attention", "conv3d", "scan"):
        assert registry.zoo_call(op, registry.zoo(op)[0][1]) is None


def test_the_gemm_zoo_call_passes_the_inputs_and_out_to_the_op():
    from cute_kernels.ops.gemm.spec import op_call

    seen = []
    call = op_call(lambda *args, **kwargs: seen.append((args, kwargs)) or "result")
    a, b, c, out = object(), object(), object(), object()
    assert call({"a": a, "b": b, "c": c, "alpha": 1.5, "beta": 0.5}, out) == "result"
    assert call({"a": a, "b": b, "alpha": 1.5, "beta": 0.0}, out) == "result"
    assert seen == [((a, b, c), {"alpha": 1.5, "beta": 0.5, "out": out}),
                    ((a, b, None), {"alpha": 1.5, "beta": 0.0, "out": out})]
