"""CPU tier: scan's config space, its supports() predicate and the argument checks that need no GPU."""

import sys

import pytest
import torch

import cute_kernels as ck
from cute_kernels.ops.scan import lookback as scan_lookback
from cute_kernels.ops.scan.config import (LOOKBACKS, MAX_RAMP_NS, RAMP_GROUPS, ScanConfig, candidates, default_config,
                                         shape_bucket, why_unsupported)
from cute_kernels.ops.scan.problem import DTYPES, ScanProblem
from cute_kernels.runtime import checks, dry_run


def test_config_validation():
    with pytest.raises(ValueError, match="ScanConfig.threads"):
        ScanConfig(threads=100)
    with pytest.raises(ValueError, match="ScanConfig.threads"):
        ScanConfig(threads=2048)
    with pytest.raises(ValueError, match="ScanConfig.items_per_thread"):
        ScanConfig(items_per_thread=3)
    with pytest.raises(ValueError, match="ScanConfig.items_per_thread"):
        ScanConfig(items_per_thread=68)
    assert ScanConfig(384, 24).tile == 9216
    assert ScanConfig(256, 16).tile == 4096


def test_why_unsupported():
    problem = ScanProblem(1, 1000, torch.float32)
    assert why_unsupported(ScanConfig(128, 4), problem) is None
    assert "multiple of the vector width" in why_unsupported(ScanConfig(128, 2), problem)
    assert why_unsupported(ScanConfig(128, 2), ScanProblem(1, 1000, torch.float32, vector=1)) is None
    assert "does not take dtype" in why_unsupported(ScanConfig(), ScanProblem(1, 10, torch.int32, op="logsumexp"))
    assert "is not one of" in why_unsupported(ScanConfig(), ScanProblem(1, 10, torch.float32, op="mean"))
    assert "shared memory" in why_unsupported(ScanConfig(1024, 64, staged=True), ScanProblem(1, 10, torch.float64))
    assert "registers" in why_unsupported(ScanConfig(128, 64, staged=False), problem)
    assert "tiles" in why_unsupported(ScanConfig(64, 1), ScanProblem(1, 2**40, torch.float32, vector=1))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("numel", [1, 250_000, 1 << 28])
def test_default_config_is_supported_for_every_vector_width(dtype, numel):
    for vector in (1, 2, 4):
        if vector * dtype.itemsize > 16:
            continue
        problem = ScanProblem(1, numel, dtype, vector=vector)
        assert why_unsupported(default_config(problem), problem) is None


def test_default_config_fits_a_small_shared_memory():
    """On GPUs with 99 KB of shared memory per CTA a staged float64 tile (128 KB) does not fit: the default
    must fall back to a tile that does, not fail at launch."""
    for dtype in DTYPES:
        problem = ScanProblem(1, 1 << 26, dtype, shared_limit=99 * 1024 - 1024)
        config = default_config(problem)
        assert why_unsupported(config, problem) is None, (dtype, config)
    assert "shared memory" in why_unsupported(
        ScanConfig(512, 32, staged=True), ScanProblem(1, 1 << 26, torch.float64, shared_limit=98 * 1024))


def test_workspace_layout_matches_the_kernel():
    # float: 16-byte header + one 8-byte word per tile, all zeroed.
    assert scan_lookback.workspace_bytes(10, torch.float32) == (16 + 80, 16 + 80)
    # 8-byte values and a recurrence's maps: two tagged 8-byte words per tile, all zeroed.
    assert scan_lookback.workspace_bytes(10, torch.float64) == (16 + 160, 16 + 160)
    assert scan_lookback.workspace_bytes(10, scan_lookback.MAP_STATE_DTYPE) == (16 + 160, 16 + 160)
    # The layout follows the accumulator: int32 max/min carry int32 (packed like float), int sums int64.
    assert scan_lookback.workspace_bytes(10, torch.int32) == scan_lookback.workspace_bytes(10, torch.float32)
    assert scan_lookback.workspace_bytes(10, torch.int64) == scan_lookback.workspace_bytes(10, torch.float64)
    assert [scan_lookback.state_layout(d) for d in (torch.float32, torch.int64, torch.complex64)] == ["packed", "pair", "pair"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.complex64])
def test_state_capacity_is_the_most_tiles_a_workspace_holds(dtype):
    for nbytes in (1 << 16, 1 << 20, 16 + 8 * 1000, scan_lookback.workspace_bytes(777, dtype)[0]):
        capacity = scan_lookback.state_capacity(nbytes, dtype)
        assert (scan_lookback.workspace_bytes(capacity, dtype)[0] <= nbytes
                < scan_lookback.workspace_bytes(capacity + 1, dtype)[0])
    assert scan_lookback.state_capacity(scan_lookback.workspace_bytes(777, dtype)[0], dtype) == 777


def test_a_launch_writes_the_workspace_it_runs_on_into_its_slots(monkeypatch):
    """A look-back launch writes the workspace pointers into its packed slots only when the stream's workspace
    is another than the last one it wrote (the launch objects live in plans and are reused): after a stream
    switch, growth by another launch, a launch that raised (its workspace dropped), graph captures (a fresh
    workspace each) and an epoch wrap, every launch reads the workspace its stream has now; and a launch
    keeps no workspace alive. CPU tensors; the launch and the device lookups are replaced."""
    import gc
    import weakref

    from cute_kernels.runtime import nvrtc

    stream, capturing, fail, seen = [7], [False], [None], []
    made = []

    def zeroed(nbytes, dtype, device):
        made.append(scan_lookback._Workspace(torch.zeros(nbytes // 8, dtype=torch.int64),
                                             scan_lookback.state_capacity(nbytes, dtype)))
        return made[-1]

    monkeypatch.setattr(scan_lookback, "_workspaces", {})
    monkeypatch.setattr(scan_lookback, "_plan",
                        lambda config, problem, device: ("kernel", config.tile, 0, config.threads, 528))
    monkeypatch.setattr(scan_lookback, "current_stream_handle", lambda device: stream[0])
    monkeypatch.setattr(scan_lookback, "stream_capturing", lambda: capturing[0])
    monkeypatch.setattr(scan_lookback, "_zeroed_workspace", zeroed)

    class Packed:  # nvrtc.PackedLaunch without the driver: records the workspace and states pointers
        def __init__(self, kernel, grid, block, args, shared_mem=0, lock=None):
            self.args, self.lock = args, lock

        def launch(self, _stream):
            if fail[0]:
                raise fail[0]("refused")
            seen.append((self.args[4].value, self.args[5].value))

    monkeypatch.setattr(nvrtc, "PackedLaunch", Packed)
    config = ScanConfig(128, 16, False)
    x = torch.zeros(10_000)
    launch = scan_lookback.prepare(config, ScanProblem(1, 10_000, torch.float32), {"x": x}, x)
    bigger = scan_lookback.prepare(config, ScanProblem(1, 10_000_000, torch.float32), {"x": x}, x)

    def runs_on_its_streams_workspace():
        launch(x, x)
        ws = made[-1] if capturing[0] else scan_lookback._workspaces[(None, stream[0], launch.state_layout)]
        assert seen[-1] == (ws.buffer.data_ptr(), ws.buffer.data_ptr() + scan_lookback.WORKSPACE_HEADER_BYTES)

    runs_on_its_streams_workspace()
    runs_on_its_streams_workspace()
    stream[0] = 8
    runs_on_its_streams_workspace()
    stream[0] = 7
    runs_on_its_streams_workspace()
    bigger(x, x)  # grows stream 7's workspace: a new one
    runs_on_its_streams_workspace()
    fail[0] = RuntimeError
    with pytest.raises(RuntimeError):
        launch(x, x)  # drops stream 7's workspace
    fail[0] = None
    runs_on_its_streams_workspace()
    capturing[0] = True
    runs_on_its_streams_workspace()
    runs_on_its_streams_workspace()
    captured = weakref.ref(made[-1])
    capturing[0] = False
    made.clear()
    gc.collect()
    assert captured() is None  # a capture's workspace is the graph's: the launch that ran on it holds none
    runs_on_its_streams_workspace()
    monkeypatch.setattr(scan_lookback, "EPOCH_LIMIT", scan_lookback._workspaces[(None, 7, "packed")].epoch + 2)
    runs_on_its_streams_workspace()
    runs_on_its_streams_workspace()


def test_workspace_epochs_advance_only_with_launches_that_ran(monkeypatch):
    """The epoch a workspace records is the last launch's: a dry run (precompile) leaves it, and a launch that
    raised drops the workspace, since whether its kernel was enqueued (and so which tile counter is zero)
    is unknown. CPU tensors; the launch and the device lookups are replaced."""
    from cute_kernels.runtime import nvrtc

    monkeypatch.setattr(scan_lookback, "_workspaces", {})
    monkeypatch.setattr(scan_lookback, "_plan",
                        lambda config, problem, device: ("kernel", config.tile, 0, config.threads, 528))
    monkeypatch.setattr(scan_lookback, "current_stream_handle", lambda device: 7)
    monkeypatch.setattr(scan_lookback, "stream_capturing", lambda: False)
    monkeypatch.setattr(scan_lookback, "_zeroed_workspace", lambda nbytes, dtype, device: scan_lookback._Workspace(
        torch.zeros(nbytes // 8, dtype=torch.int64), scan_lookback.state_capacity(nbytes, dtype)))
    epochs_launched = []

    class Packed:  # nvrtc.PackedLaunch without the driver (a dry run returns before launching, as there)
        def __init__(self, kernel, grid, block, args, shared_mem=0, lock=None):
            self.args, self.lock = args, lock

        def launch(self, stream):
            if dry_run.is_dry_run():
                return
            if fail:
                raise fail("refused")
            epochs_launched.append(self.args[6].value)
            assert (self.args[7].value, self.args[8].value) == (528, 0)  # the first wave, and no ramp

    monkeypatch.setattr(nvrtc, "PackedLaunch", Packed)
    config = ScanConfig(128, 16, False)
    problem = ScanProblem(1, 10_000, torch.float32)
    x = torch.zeros(10_000)
    key = (None, 7, "packed")

    def call():
        scan_lookback.launch(config, problem, {"x": x}, torch.empty_like(x))
        return scan_lookback._workspaces.get(key)

    fail = None
    first = call()
    assert first.epoch == 1 and call() is first and first.epoch == 2
    token = dry_run.DRY_RUN.set(True)
    try:
        assert call() is first and first.epoch == 2
    finally:
        dry_run.DRY_RUN.reset(token)
    for error in (nvrtc.KernelError, KeyboardInterrupt):
        fail = error
        with pytest.raises(error):
            call()
        assert key not in scan_lookback._workspaces
        fail = None
        fresh = call()
        assert fresh is not first and fresh.epoch == 1
        first = fresh
    assert epochs_launched == [1, 2, 1, 1]


def test_name_expression_holds_every_knob():
    a = ScanProblem(1, 10, torch.int32, exclusive=True)
    assert (scan_lookback.name_expression(ScanConfig(128, 8, staged=False), a)
            == "scan::scan_kernel<int, long long, scan::Sum<long long>, 128, 8, 4, false, true, false, false>")
    b = ScanProblem(3, 10, torch.float64, vector=1)
    assert (scan_lookback.name_expression(ScanConfig(512, 32, staged=True), b)
            == "scan::scan_kernel<double, double, scan::Sum<double>, 512, 32, 1, true, false, true, false>")
    c = ScanProblem(1, 12, torch.int32, op="max", reverse=True)
    assert (scan_lookback.name_expression(ScanConfig(128, 8, staged=False, lookback="early"), c)
            == "scan::scan_kernel_early_aggregate<int, int, scan::Max<int>, 128, 8, 4, false, false, false, true>")
    d = ScanProblem(1, 8, torch.bfloat16, op="logsumexp")
    assert (scan_lookback.name_expression(ScanConfig(128, 8, staged=False), d)
            == "scan::scan_kernel<__nv_bfloat16, __nv_bfloat16, scan::LogSumExp<float>, 128, 8, 8, false, false, false, false>")
    assert (scan_lookback.name_expression(ScanConfig(512, 32, staged=True, lookback="dedicated"), b)
            == "scan::scan_kernel_lookback_warp<double, double, scan::Sum<double>, 512, 32, 1, true, false, true, false>")
    assert (scan_lookback.name_expression(ScanConfig(384, 32, staged=False, lookback="early"), a)
            == "scan::scan_kernel_early_aggregate<int, long long, scan::Sum<long long>, 384, 32, 4, false, true, false, false>")


def test_lookback_knob_validation():
    with pytest.raises(ValueError, match="ScanConfig.lookback"):
        ScanConfig(lookback="sideways")
    assert ScanConfig().lookback == "inline"  # the old schedule stays the default
    assert ScanConfig(512, 48).block_threads == 512
    assert ScanConfig(512, 48, lookback="dedicated").block_threads == 544
    assert ScanConfig(512, 48, lookback="dedicated").tile == 512 * 48  # the look-back warp holds no data
    early = ScanConfig(384, 48, lookback="early")  # no extra warp, and the same stage as inline
    assert early.block_threads == 384 and early.shared_bytes(torch.float32) == 384 * 48 * 4


def test_lookback_knob_supports():
    problem = ScanProblem(1, 1 << 20, torch.float32)
    assert why_unsupported(ScanConfig(992, 4, lookback="dedicated"), problem) is None
    assert "1024 threads per CTA" in why_unsupported(ScanConfig(1024, 4, lookback="dedicated"), problem)
    assert why_unsupported(ScanConfig(1024, 4, lookback="inline"), problem) is None
    # The staged tile's shared memory does not change with the schedule.
    for staged in (False, True):
        a, b = ScanConfig(512, 48, staged), ScanConfig(512, 48, staged, "dedicated")
        assert a.shared_bytes(torch.float32) == b.shared_bytes(torch.float32)


def test_lookback_knob_candidates():
    configs = candidates()
    assert {c.lookback for c in configs} == set(LOOKBACKS)
    shapes = {(c.threads, c.items_per_thread, c.staged) for c in configs}
    # Every tile shape is offered with every schedule, so a sweep times them side by side.
    for shape in shapes:
        for lookback in LOOKBACKS:
            assert ScanConfig(*shape, lookback) in configs
    problem = ScanProblem(1, 1 << 28, torch.float32)
    supported = ck.registry.configs("scan", "lookback", problem)
    assert any(c.lookback == "dedicated" for c in supported) and any(c.lookback == "inline" for c in supported)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("numel", [1, 250_000, 1 << 24, 1 << 28])
def test_default_config_keeps_the_inline_lookback(dtype, numel):
    """Inline everywhere but short flat 8-byte scans, whose 256 x 8 register tile publishes its aggregate
    early (measured: float64 2^16 1.21x torch.cumsum against the 256 x 16 staged inline tile's 1.06x)."""
    config = default_config(ScanProblem(1, numel, dtype))
    if dtype.itemsize == 8 and numel < 1 << 22:
        assert (config.threads, config.items_per_thread, config.staged, config.lookback) == (256, 8, False, "early")
    elif dtype.itemsize == 8:
        assert (config.threads, config.items_per_thread, config.staged, config.lookback) == (256, 16, True, "inline")
    else:
        assert config.lookback == "inline"
    if numel > 1:  # batched rows keep the inline schedule at every width
        assert default_config(ScanProblem(4, max(1, numel // 4), dtype)).lookback == "inline"


def test_lookback_knob_reads_from_a_tuned_table():
    from cute_kernels import tuned

    fields = {"threads": 512, "items_per_thread": 48, "staged": True, "lookback": "dedicated"}
    assert tuned.config_from_fields(ScanConfig, fields) == ScanConfig(512, 48, True, "dedicated")
    # Entries written before the knob existed read as the inline schedule.
    old = {"threads": 512, "items_per_thread": 48, "staged": True}
    assert tuned.config_from_fields(ScanConfig, old).lookback == "inline"
    with pytest.raises(ValueError, match="ScanConfig.lookback"):
        tuned.config_from_fields(ScanConfig, dict(fields, lookback="sideways"))


def test_cpu_tensor_is_refused():
    with pytest.raises(ValueError, match="x: expected a CUDA tensor"):
        ck.scan(torch.arange(5.0))


def test_non_tensor_is_refused():
    with pytest.raises(TypeError, match="x: expected a torch.Tensor, got list"):
        ck.scan([1.0, 2.0])


def test_overlap_detection():
    base = torch.zeros(100)
    assert checks.overlaps(base[:50], base[49:])
    assert not checks.overlaps(base[:50], base[50:])
    assert checks.overlaps(base.view(10, 10)[:, 0], base[5:6])
    assert not checks.overlaps(base[:0], base)


def test_output_checks_name_the_argument():
    x = torch.zeros(4, 5)
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 5\), got \(5, 4\)"):
        checks.output("out", torch.zeros(5, 4), shape=x.shape, dtype=x.dtype, device=x.device, inputs={"x": x})
    with pytest.raises(TypeError, match="out: expected dtype torch.float32, got torch.float64"):
        checks.output("out", x.double(), shape=x.shape, dtype=x.dtype, device=x.device, inputs={"x": x})
    with pytest.raises(ValueError, match="out: expected a contiguous tensor"):
        checks.output("out", torch.zeros(5, 4).t(), shape=x.shape, dtype=x.dtype, device=x.device, inputs={})
    with pytest.raises(ValueError, match="out: overlaps the memory of x"):
        checks.output("out", x, shape=x.shape, dtype=x.dtype, device=x.device, inputs={"x": x})
    checks.output("out", x, shape=x.shape, dtype=x.dtype, device=x.device, inputs={"x": x}, allow_exact_alias=("x",))


def test_alignment():
    base = torch.zeros(64, dtype=torch.float32)
    assert checks.alignment_bytes(base) == 16
    assert checks.alignment_bytes(base[1:]) == 4
    assert checks.alignment_bytes(base[2:]) == 8


def test_first_wave_ramp(monkeypatch):
    """ScanConfig.ramp_ns: validated, a runtime argument (one compiled kernel for every ramp), and applied
    only to launches of at least two waves, in scan.cu's 8 groups."""
    for bad in (-1, MAX_RAMP_NS + 1):
        with pytest.raises(ValueError, match="ramp_ns"):
            ScanConfig(ramp_ns=bad)
    plain, ramped = ScanConfig(256, 32, False, "early"), ScanConfig(256, 32, False, "early", ramp_ns=4800)
    problem = ScanProblem(1, 1 << 24, torch.float32)
    assert scan_lookback.name_expression(plain, problem) == scan_lookback.name_expression(ramped, problem)
    assert scan_lookback.ramp_step_ns(ramped, tiles=2048, first_wave=528) == 600
    assert scan_lookback.ramp_step_ns(ramped, tiles=1056, first_wave=528) == 600
    assert scan_lookback.ramp_step_ns(ramped, tiles=1055, first_wave=528) == 0
    assert scan_lookback.ramp_step_ns(plain, tiles=2048, first_wave=528) == 0
    # planned_ramp_step_ns: the problem's tile count against the plan's first wave (8192-element tiles)
    monkeypatch.setattr(scan_lookback, "_plan",
                        lambda config, problem, device: ("kernel", config.tile, 0, config.threads, 528))
    assert scan_lookback.planned_ramp_step_ns(ramped, problem, 0) == 600
    assert scan_lookback.planned_ramp_step_ns(ramped, ScanProblem(1, 1055 * 8192, torch.float32), 0) == 0
    from cute_kernels.runtime import nvrtc
    assert f"kRampGroups = {RAMP_GROUPS};" in nvrtc.read_source_tree(scan_lookback.SOURCE)[scan_lookback.SOURCE]


# ---- The oracle on references with infinities and NaN; strided geometry; prod/max/min backward -------------


@pytest.mark.parametrize("op", ["max", "min", "logsumexp"])
def test_the_oracle_is_not_vacuous_when_the_reference_holds_infinities(op):
    """An exclusive max/min/logsumexp starts from an infinite identity: the default scale must come from
    the finite part of the reference, or every finite element's error reads as 0."""
    from cute_kernels.ops.scan.reference import torch_scan
    from cute_kernels.runtime import oracle

    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    ref, theirs = torch_scan(x.double(), 0, op, exclusive=True), torch_scan(x, 0, op, exclusive=True)
    assert oracle.compare(theirs, ref, theirs)
    wrong = theirs.clone()
    wrong[1:] = 123.0
    assert not oracle.compare(wrong, ref, theirs)
    wrong = theirs.clone()
    wrong[0] = 0.0  # a finite value where the reference is infinite
    assert not oracle.compare(wrong, ref, theirs)


def test_the_oracle_judges_nan_in_the_reference_without_crashing():
    from cute_kernels.ops.scan.reference import torch_scan
    from cute_kernels.runtime import oracle

    x = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    x[500] = float("nan")
    ref, theirs = torch_scan(x.double(), 0, "logsumexp"), torch_scan(x, 0, "logsumexp")
    assert oracle.compare(theirs, ref, theirs)
    wrong = theirs.clone()
    wrong[600] = 1.0  # a number where torch has NaN
    verdict = oracle.compare(wrong, ref, theirs)
    assert not verdict and "worst at (600,)" in verdict.detail


def test_a_strided_scan_of_many_narrow_columns_fits_the_grid():
    """2^24 chains of one narrow column block: one chunk each, not MAX_CHUNKS."""
    from cute_kernels.ops.scan.config import ColumnScanConfig, column_geometry, why_unsupported_columns
    from cute_kernels.runtime.device import MAX_GRID_X

    problem = ScanProblem(1 << 24, 2, torch.float32, inner=2)
    assert why_unsupported_columns(ColumnScanConfig(), problem) is None
    lanes, blocks, chunks, rows_per_chunk = column_geometry(ColumnScanConfig(), problem, 132)
    assert problem.rows * blocks * chunks <= MAX_GRID_X and chunks * rows_per_chunk >= problem.length
    big = ScanProblem(1 << 20, 1 << 16, torch.float32, inner=4096)  # 2^25 chains: chunks capped by the grid
    lanes, blocks, chunks, rows_per_chunk = column_geometry(ColumnScanConfig(), big, 132)
    assert big.rows * blocks * chunks <= MAX_GRID_X and chunks * rows_per_chunk >= big.length


def test_the_columns_default_fits_its_cta_to_a_narrow_inner_dim():
    """Over a narrow inner dim the default CTA has only as many row groups as MAX_ROW_GROUPS of the fewest
    lanes that cover it (8 float32 columns: 2 lanes, 64 threads; 4: one lane, 32 threads), 8 rows a step;
    a wide inner dim keeps the default, and a config that names its lanes is left as it is."""
    from cute_kernels.ops.scan.config import (MAX_ROW_GROUPS, ColumnScanConfig, column_lanes, default_column_config,
                                              fit_column_config, why_unsupported_columns)

    for inner, dtype, threads in ((8, torch.float32, 64), (4, torch.float32, 32), (2, torch.float32, 32),
                                  (16, torch.float32, 128), (16, torch.bfloat16, 64), (1024, torch.float32, 256)):
        problem = ScanProblem(64, 4096, dtype, inner=inner)
        config = default_column_config(problem)
        assert config.threads == threads, (inner, dtype, config)
        assert config.rows == (8 if threads < 256 else ColumnScanConfig().rows)
        assert why_unsupported_columns(config, problem) is None
        lanes = column_lanes(config, problem)
        assert config.threads // lanes <= MAX_ROW_GROUPS
        assert lanes * problem.vector_width < 2 * inner or lanes == 1  # no lane past a whole spare one
    named = ColumnScanConfig(threads=256, lanes=8)
    assert fit_column_config(named, ScanProblem(64, 4096, torch.float32, inner=8)) is named


@pytest.mark.parametrize("op", ["prod", "max", "min", "logsumexp"])
def test_the_backward_of_prod_max_min_is_torchs_and_differentiable_again(op):
    """The custom op's backward for these operators differentiates torch's function on the saved input
    itself, so create_graph gives a gradient connected to x and to the incoming gradient. logsumexp's too
    when it is differentiated again (its first-order backward, two scans of ours, would lose the path
    through the saved output there)."""
    from cute_kernels.ops.scan.reference import segmented_scan, torch_scan
    from cute_kernels.torch_ops import _scan_backward

    gen = torch.Generator().manual_seed(2)
    x = (1 + torch.randn(5, 6, dtype=torch.float64, generator=gen) / 4).requires_grad_()
    grad = torch.randn(5, 6, dtype=torch.float64, generator=gen).requires_grad_()
    starts = torch.rand(5, 6, generator=gen) < 0.3
    for exclusive, reverse, segments in ((False, False, None), (True, True, None), (False, True, starts),
                                         (True, False, starts)):
        ctx = type("Ctx", (), {})()
        ctx.scan = dict(dim=1, exclusive=exclusive, reverse=reverse, op=op)
        forward = (torch_scan(x, 1, op, exclusive=exclusive, reverse=reverse) if segments is None
                   else segmented_scan(x, segments, 1, op, exclusive=exclusive, reverse=reverse))
        saved = (x, forward.detach(), segments) if op == "logsumexp" else (x, segments)
        ctx.x_dtype, ctx.cast, ctx.saved_tensors = x.dtype, None, saved
        with torch.enable_grad():  # what autograd does for a backward with create_graph=True
            dx = _scan_backward(ctx, grad)[0]
        expected = torch.autograd.grad(forward, x, grad, create_graph=True)[0]
        torch.testing.assert_close(dx, expected, rtol=0, atol=0)
        assert dx.requires_grad
        second = torch.autograd.grad(dx.sum(), grad, retain_graph=True)[0]
        torch.testing.assert_close(second, torch.autograd.grad(expected.sum(), grad)[0], rtol=0, atol=0)
        if op != "logsumexp":  # whose first-order backward is two scans of ours: CUDA only
            with torch.no_grad():
                assert not _scan_backward(ctx, grad.detach())[0].requires_grad


def test_segments_take_the_inline_or_early_schedule_on_the_last_dim():
    from cute_kernels.ops.scan.columns import COLUMNS_SPEC

    p = ScanProblem(4, 1000, segmented=True)
    assert why_unsupported(ScanConfig(256, 16, False, "inline"), p) is None
    assert why_unsupported(ScanConfig(256, 16, False, "early"), p) is None
    assert "inline or early schedule" in why_unsupported(ScanConfig(256, 16, False, "dedicated"), p)
    assert default_config(p).lookback == "inline"
    assert default_config(ScanProblem(1, 1 << 24, segmented=True)) == ScanConfig(128, 32, True, "early", 4400)
    assert "lookback variant" in COLUMNS_SPEC.why_unsupported(COLUMNS_SPEC.default_config(ScanProblem(2, 100, inner=8, segmented=True)),
                                                              ScanProblem(2, 100, inner=8, segmented=True))
    assert shape_bucket(p).endswith(":segmented")


@pytest.mark.parametrize("shape", [(3, 40), (1, 4103)])  # one chunk; three levels of chunks (64 * 64 + 7)
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "logsumexp"])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_the_segmented_reference_is_a_loop_over_segments(op, exclusive, reverse, shape):
    import math

    from cute_kernels.ops.scan.reference import segmented_scan, segmented_sum_by_offsets

    gen = torch.Generator().manual_seed(1)
    rows, length = shape
    x = torch.randn(rows, length, dtype=torch.float64, generator=gen)
    if op == "prod":  # products of thousands of randn terms leave float64's range
        x = 1 + x / 64
    starts = torch.rand(rows, length, generator=gen) < (0.15 if length < 64 else 0.002)  # segments across chunks
    combine = {"sum": lambda a, b: a + b, "prod": lambda a, b: a * b, "max": max, "min": min,
               "logsumexp": lambda a, b: max(a, b) + math.log1p(math.exp(-abs(a - b))) if a > -math.inf else b}[op]
    identity = {"sum": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf, "logsumexp": -math.inf}[op]
    expected = torch.empty_like(x)
    for r in range(rows):
        bounds = [0] + [i for i in range(1, length) if starts[r, i]] + [length]
        for lo, hi in zip(bounds, bounds[1:]):
            acc = identity
            for i in (reversed(range(lo, hi)) if reverse else range(lo, hi)):
                before, acc = acc, combine(acc, x[r, i].item())
                expected[r, i] = before if exclusive else acc
    torch.testing.assert_close(segmented_scan(x, starts, 1, op, exclusive=exclusive, reverse=reverse), expected)
    if op == "sum":
        torch.testing.assert_close(segmented_sum_by_offsets(x, starts, 1, exclusive=exclusive, reverse=reverse), expected)
    wide = segmented_scan(x.numpy().astype("longdouble"), starts.numpy(), 1, op, exclusive=exclusive, reverse=reverse) \
        if op in ("sum", "prod") else None
    if wide is not None:
        torch.testing.assert_close(torch.from_numpy(wide.astype("float64")), expected)


def test_segment_starts_written_in_place_before_the_backward_is_refused():
    """The flags are saved for the backward as x is: overwriting them first is torch's in-place error, not
    a gradient for other segments (meta tensors: the check comes before any kernel)."""
    x = torch.randn(4, 9, device="meta", requires_grad=True)
    starts = torch.zeros(4, 9, dtype=torch.bool, device="meta")
    y = ck.scan(x, op="max", segment_starts=starts)
    starts.fill_(True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_a_plan_allocates_results_of_every_shape():
    """ScanPlan's fresh result, a 0-d one included, in the result's dtype: empty_like(x) where x's dtype and
    strides serve, else an allocation of the shape."""
    from cute_kernels.ops.scan.op import ScanPlan

    cases = ((torch.tensor(3.5), torch.float32), (torch.tensor(3, dtype=torch.int32), torch.int64),
             (torch.ones(4, 5, dtype=torch.int32), torch.int64), (torch.ones(5, 4).t(), torch.float32))
    for x, result_dtype in cases:
        got = ScanPlan(x, x.dtype, result_dtype, None)(x, None)  # no launch: the allocation alone
        assert got.shape == x.shape and got.dtype == result_dtype and got.is_contiguous()
    assert ScanPlan(torch.ones(4, 5), torch.float32, torch.float32, None).like_x
    assert not ScanPlan(torch.ones(4, 5, dtype=torch.int32), torch.int32, torch.int64, None).like_x


def test_the_offsets_yardstick_applies_to_segmented_sums_alone_and_starts_each_segment_at_zero():
    from cute_kernels.ops.scan.entry import make_inputs
    from cute_kernels.ops.scan.reference import offsets_baseline, scan_reference, segmented_sum_by_offsets

    gen = torch.Generator().manual_seed(4)
    assert offsets_baseline(ScanProblem(2, 100), make_inputs(ScanProblem(2, 100), "cpu", gen)) is None
    maxed = ScanProblem(2, 100, op="max", segmented=True)
    assert offsets_baseline(maxed, make_inputs(maxed, "cpu", gen)) is None
    for problem in (ScanProblem(2, 3000, torch.float32, segmented=True), ScanProblem(1, 5000, torch.int32, segmented=True),
                    ScanProblem(3, 700, torch.bfloat16, exclusive=True, reverse=True, segmented=True)):
        inputs = make_inputs(problem, "cpu", gen)
        got = offsets_baseline(problem, inputs)
        assert got.dtype == problem.out_dtype
        torch.testing.assert_close(got.double(), scan_reference(problem, inputs).double(), rtol=1e-2, atol=1e-2)
    x = 100 * torch.rand(1, 1 << 16, generator=gen)
    starts = torch.rand(1, 1 << 16, generator=gen) < 0.01
    starts[0, 0] = True
    assert (segmented_sum_by_offsets(x, starts, 1, exclusive=True)[starts] == 0).all()


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_a_segmented_extreme_sends_its_gradient_where_torchs_cummax_does(op, exclusive, reverse):
    """Ties (small integers) and NaNs: each segment's gradient is torch.cummax's / torch.cummin's on that
    segment (one element per output, a later one over an equal one, a NaN over any number), whatever the
    chunking; the values are the doubling's."""
    from cute_kernels.ops.scan.reference import segmented_scan

    gen = torch.Generator().manual_seed(5)
    x = torch.randint(0, 4, (2, 300), generator=gen).double()
    x[0, ::37] = float("nan")
    starts = torch.rand(2, 300, generator=gen) < 0.03
    grad = torch.randn(2, 300, generator=gen, dtype=torch.float64)
    leaf = x.clone().requires_grad_()
    got = segmented_scan(leaf, starts, 1, op, exclusive=exclusive, reverse=reverse)
    torch.testing.assert_close(got.detach(), segmented_scan(x, starts, 1, op, exclusive=exclusive, reverse=reverse),
                               equal_nan=True, rtol=0, atol=0)
    (dx,) = torch.autograd.grad(got, leaf, grad)
    expected = torch.zeros_like(x)
    torch_scan = torch.cummax if op == "max" else torch.cummin
    for r in range(2):
        bounds = [0] + [i for i in range(1, 300) if starts[r, i]] + [300]
        for lo, hi in zip(bounds, bounds[1:]):
            segment = x[r, lo:hi].clone().requires_grad_()
            y = torch_scan(segment.flip(0) if reverse else segment, 0).values
            if exclusive:
                y = torch.cat([torch.zeros(1, dtype=y.dtype), y[:-1]])
            y = y.flip(0) if reverse else y
            expected[r, lo:hi] = torch.autograd.grad(y, segment, grad[r, lo:hi], allow_unused=True)[0]
    torch.testing.assert_close(dx, expected, rtol=0, atol=0)


def test_out_of_another_dtype_is_the_dtype_of_a_sum_or_product(monkeypatch):
    """torch.cumsum and cumprod compute in out's dtype when dtype= is not given (an int32 out of an int32 x
    wraps in int32; a float64 out of a float32 x sums in float64); the other operators, as torch's, take
    only their own dtype; an out of a dtype no scan computes in is named."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from cute_kernels.ops.scan.problem import check_scan_args

    with FakeTensorMode():
        def cuda(dtype):
            return torch.empty(4, 9, dtype=dtype, device="cuda")

        assert check_scan_args(cuda(torch.int32), cuda(torch.int32)) == (torch.int32, torch.int32)
        assert check_scan_args(cuda(torch.float32), cuda(torch.float64), "prod") == (torch.float64, torch.float64)
        assert check_scan_args(cuda(torch.int8), cuda(torch.int8)) == (torch.int32, torch.int8)  # wraps in int8
        assert check_scan_args(cuda(torch.float32), cuda(torch.int64)) == (torch.int64, torch.int64)
        assert check_scan_args(cuda(torch.int8), cuda(torch.int64)) == (torch.int32, torch.int64)  # the default
        with pytest.raises(TypeError, match=r"^out: a sum scan computes in out's dtype"):
            check_scan_args(cuda(torch.float32), cuda(torch.bool))
        with pytest.raises(TypeError, match=r"^out: expected dtype torch.float32"):
            check_scan_args(cuda(torch.float32), cuda(torch.float64), "max")
    # The traced path (the custom op, its fake implementation, then the copy into out) takes the same; meta
    # tensors stand for CUDA ones there (a CPU-only torch cannot copy between fake CUDA tensors).
    torch_ops = sys.modules["cute_kernels.torch_ops"]
    monkeypatch.setattr(torch_ops, "_is_compiling", lambda: True)
    for x_dtype, out_dtype_ in ((torch.int32, torch.int32), (torch.float32, torch.float64), (torch.int8, torch.int8)):
        out = torch.empty(4, 9, dtype=out_dtype_, device="meta")
        assert ck.scan(torch.empty(4, 9, dtype=x_dtype, device="meta"), out=out) is out
