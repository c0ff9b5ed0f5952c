"""bench's input rotation (CPU): the input set advances with every call, whichever function makes it; the
report's attention backward table."""

import pytest
import torch

import cute_kernels  # noqa: F401  (registers every entry)
from cute_kernels import registry

from cute_kernels.tools import bench


def test_input_rotation_advances_with_every_call():
    seen = []
    rotate = bench.input_rotation(3)
    ours = rotate(lambda i: seen.append(("ours", i)))
    baseline = rotate(lambda i: seen.append(("baseline", i)))
    for rep in range(3):  # as interleaved_times calls them: both functions with the same rep
        ours(rep)
        baseline(rep)
    assert [i for _, i in seen] == [0, 1, 2, 0, 1, 2]
    # no call reads the set the call just before it read
    assert all(a[1] != b[1] for a, b in zip(seen, seen[1:]))


def test_one_input_set_is_reused():
    seen = []
    rotate = bench.input_rotation(1)
    call = rotate(seen.append)
    for rep in range(4):
        call(rep)
    assert seen == [0, 0, 0, 0]


def test_walls_are_medians_of_runs_taken_in_turn(monkeypatch):
    """Each function's wall per call is the median of its runs, and the runs alternate between the functions:
    one slow run (a host hiccup) moves neither figure."""
    order = []
    figures = {"ours": iter([50.0, 125.0, 52.0]), "theirs": iter([99.0, 98.0, 101.0])}

    def fake_wall(fn, *, calls, device=None):
        order.append(fn())
        return next(figures[order[-1]])

    monkeypatch.setattr(bench, "wall_us_per_call", fake_wall)
    assert bench.interleaved_walls((lambda: "ours", lambda: "theirs"), calls=10) == [52.0, 99.0]
    assert order == ["ours", "theirs"] * 3


def test_attention_backward_table():
    """The report's attention backward rows: speed-up, TFLOP/s counting 2.5x the forward (halved when causal),
    % of Hopper's dense peak, cuDNN where it ran, further columns by name, an unverified row saying why."""
    from cute_kernels.tools import attention_backward as ab

    assert ab.backward_flops(4, 16, 4096, 128, False) == 2.5 * 4 * 4 * 16 * 4096 ** 2 * 128
    assert ab.backward_flops(4, 16, 4096, 128, True) == ab.backward_flops(4, 16, 4096, 128, False) / 2
    rows = [ab.Row(torch.float16, (4, 16, 16, 4096, 128, False), 2987.0, 4749.0, 2460.0, {"mma": 6779.0}, True, ""),
            ab.Row(torch.float32, (2, 16, 16, 2048, 64, True), 1567.0, 1584.0, None, {}, False, "dq: 3 wrong"),
            ab.Row(torch.float32, (2, 16, 16, 2048, 64, False), 1145.0, 2606.0, None, {}, True, "", on_planes=True)]
    table = ab.markdown(rows).splitlines()
    assert table[0].startswith("| dtype | B H H_kv S d causal | ours (us) | torch (us) | speed-up |")
    assert "mma (us)" in table[0]
    assert table[2] == "| float16 | 4 16 16 4096 128 0 | 2987 | 4749 | 1.59x | 460.1 | 47% | 2460 | 0.82x | 6779 | yes |"
    assert table[3].endswith("| - | - | - | NO (dq: 3 wrong) |")
    # float32 on bf16 planes: 75.0 TFLOP/s against a sixth of the 16-bit peak, not the CUDA cores' 67
    assert table[4] == "| float32 | 2 16 16 2048 64 0 | 1145 | 2606 | 2.28x | 75.0 | 46% (planes) | - | - | - | yes |"
    assert set(ab.PROBLEMS) == {torch.float32, torch.float16, torch.bfloat16}


def _problems_of(spec):
    return list(spec.standard_problems()) + [p for s, p in registry.zoo(spec.op) if s is spec]


def _expected(spec, problem, inputs) -> tuple:
    """The shape and dtype of the op's result on ``inputs``."""
    if spec.op in ("sgemm", "hgemm"):
        return torch.matmul(inputs["a"], inputs["b"]).shape, inputs["a"].dtype
    if spec.op == "attention":
        return inputs["q"].shape, inputs["q"].dtype
    if spec.op == "conv3d":
        return problem.out_shape, torch.float32
    if spec.op == "scan":
        return inputs["x"].shape, problem.out_dtype
    return inputs["x"].shape, inputs["x"].dtype  # linear_scan


@pytest.mark.parametrize("spec", registry.list(), ids=lambda s: f"{s.op}-{s.variant}")
def test_every_entry_has_a_public_call_giving_the_ops_result(spec):
    """The report's wall per call times the public op (allocating, as model code calls it) against the
    baseline's call: every op has that call, and on each entry's problems it gives the op's result shape and
    dtype (fake tensors: the custom op's fake implementation answers)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from cute_kernels import torch_ops

    with FakeTensorMode():
        for problem in _problems_of(spec):
            inputs = spec.make_inputs(problem, "cuda")
            result = torch_ops.public_call(spec.op, problem, inputs)()
            result = result[0] if isinstance(result, tuple) else result
            shape, dtype = _expected(spec, problem, inputs)
            assert (tuple(result.shape), result.dtype) == (tuple(shape), dtype), problem


def test_every_zoo_problem_routes_to_its_entry():
    """The wall per call times the public op exactly where the op routes the row's problem to the row's
    entry: every zoo row is such a row."""
    for spec, problem in registry.zoo():
        assert registry.route(spec.op, problem) is spec


def test_walls_enter_each_functions_settings_once_a_run(monkeypatch):
    """A baseline's settings (a backend, TF32 off) are made once around each of its timed runs, as model code
    makes them once, not on every call; the other function runs without them."""
    import contextlib

    events = []

    @contextlib.contextmanager
    def settings():
        events.append("enter")
        yield
        events.append("exit")

    monkeypatch.setattr(bench, "wall_us_per_call", lambda fn, *, calls, device=None: events.append(fn()) or 1.0)
    bench.interleaved_walls((lambda: "ours", lambda: "theirs"), calls=10, tries=2,
                            settings=(contextlib.nullcontext, settings))
    assert events == ["ours", "enter", "theirs", "exit"] * 2


@pytest.mark.parametrize("op, variant, problem", [
    ("sgemm", "simt_cpasync", "GemmProblem(m=8, n=12, k=16, beta_zero=False)"),
    ("attention", "flash2_mma", "AttentionProblem(1, 2, 16, 24, 8, torch.float32, causal=True)"),
    ("attention", "flash2_mma", "AttentionProblem(1, 2, 16, 24, 8, torch.float32, window=(3, 1), num_sinks=2)"),
    ("conv3d", "direct", "Conv3dProblem(2, 5, 6, 7, 3, 3, 3, batched=True)"),
    ("conv3d", "direct", "Conv3dProblem(1, 5, 6, 7, 2, 2, 2, pads=(1, 0, 1, 0, 0, 1))"),
    ("conv3d", "direct", "Conv3dProblem(2, 1, 9, 11, 1, 3, 5, batched=True, pads=(0, 0, 1, 1, 2, 2))"),  # conv2d
    ("conv3d", "direct", "Conv3dProblem(1, 1, 9, 11, 1, 2, 4, pads=(0, 0, 1, 0, 2, 1))"),  # conv2d, padded copy
    ("conv3d", "direct", "Conv3dProblem(3, 1, 1, 40, 1, 1, 7, batched=True, pads=(0, 0, 0, 0, 3, 3))"),  # conv1d
    ("conv3d", "direct", "Conv3dProblem(1, 1, 8, 40, 1, 1, 7, pads=(0, 0, 1, 1, 0, 0))"),  # padded H: conv2d
])
def test_eager_baselines_compute_the_baseline(op, variant, problem):
    """The wall figure's baseline call, under its settings, is the baseline's computation (the same numbers,
    in the shape the library gives them)."""
    from cute_kernels.ops.attention import AttentionProblem  # noqa: F401 (named in the parameters)
    from cute_kernels.ops.conv3d.problem import Conv3dProblem  # noqa: F401
    from cute_kernels.ops.gemm.problem import GemmProblem  # noqa: F401

    spec = registry.get(op, variant)
    problem = eval(problem)
    inputs = spec.make_inputs(problem, "cpu", torch.Generator().manual_seed(0))
    call, settings = spec.eager_baseline(problem, inputs)
    flags = lambda: (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,  # noqa: E731
                     torch.backends.cudnn.benchmark,
                     torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())
    before = flags()
    with settings():
        # TF32 off where the baseline is FP32 math; SDPA on the backends the GPU-time baseline names
        assert not torch.backends.cuda.matmul.allow_tf32 or op == "conv3d"
        assert op != "conv3d" or (not torch.backends.cudnn.allow_tf32 and torch.backends.cudnn.benchmark)
        if op == "attention":
            assert not torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
        got = call()
    assert flags() == before  # the caller's settings back
    with pytest.raises(RuntimeError, match="inside"), settings():
        raise RuntimeError("inside")
    assert flags() == before  # and after an error too
    want = spec.baseline(problem, inputs)
    torch.testing.assert_close(got.reshape(want.shape), want, rtol=0, atol=0)
    if op == "conv3d":  # by rank or not, the baseline is the convolution the reference computes
        reference = spec.reference(problem, inputs)
        torch.testing.assert_close(want.double(), reference, rtol=1e-5, atol=1e-5)
        assert want.shape == reference.shape


def test_wall_runs_are_sized_by_the_slowest_call():
    assert bench.wall_calls(10.0, 15.0) == 200
    assert bench.wall_calls(61.0, 47000.0) == 20  # a fast kernel against a slow baseline
    assert bench.wall_calls(500.0, 40.0) == 20
