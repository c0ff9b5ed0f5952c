"""GPU tier: ck.scan numerics against float64 / exact references, batched rows, layouts, bad input."""

import dataclasses

import pytest
import torch

import cute_kernels as ck
from cute_kernels import registry
from cute_kernels.ops.scan import lookback as scan_lookback
from cute_kernels.ops.scan.config import LOOKBACKS, ScanConfig, default_config
from cute_kernels.ops.scan.problem import DTYPES, OPS, ScanProblem, out_dtype
from cute_kernels.ops.scan.reference import scan_scale
from cute_kernels.runtime import oracle

pytestmark = pytest.mark.gpu

SPEC = registry.get("scan")
TILES = sorted({c.tile for c in SPEC.candidates()})
LENGTHS = [1, 2, 31, 32, 33, 1023, 1024, 1025, 4095, 4096, 4097, 250_000, (1 << 24) + 7]
# Both stages under every look-back schedule (ScanConfig.lookback): every test below that takes STAGES checks
# every value of the knob.
STAGES = [ScanConfig(128, 32, staged, lookback) for lookback in LOOKBACKS for staged in (False, True)]
STAGE_IDS = [f"{'shared' if c.staged else 'registers'}-{c.lookback}" for c in STAGES]
# The tiles the probe times at 2^28 (scripts/probes/scan_probe.py), under every schedule.
LARGE = [ScanConfig(512, 48, True, lookback) for lookback in LOOKBACKS]
LARGE_IDS = [f"512x48-{c.lookback}" for c in LARGE]


def problem_of(x: torch.Tensor, exclusive: bool) -> ScanProblem:
    length = x.shape[-1] if x.dim() else 1
    return ScanProblem(x.numel() // length, length, x.dtype, exclusive)


def reference(x: torch.Tensor, exclusive: bool) -> torch.Tensor:
    return SPEC.reference(problem_of(x, exclusive), {"x": x})


def baseline(x: torch.Tensor, exclusive: bool) -> torch.Tensor:
    return SPEC.baseline(problem_of(x, exclusive), {"x": x})


def random_input(shape, dtype, generator):
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype, device="cuda", generator=generator)
    return torch.randint(-1000, 1000, shape, dtype=dtype, device="cuda", generator=generator)


def poisoned_out(x: torch.Tensor) -> torch.Tensor:
    return oracle.poisoned_like(torch.empty(x.shape, dtype=out_dtype(x.dtype, "sum"), device=x.device))


def check(x, exclusive=False, out=None, **kwargs):
    """The registry's own oracle (SPEC.verify: float64 reference, 2x torch's error) on a poisoned output."""
    out = poisoned_out(x) if out is None else out
    got = ck.scan(x, exclusive=exclusive, out=out, **kwargs)
    assert got is out
    problem = problem_of(x, exclusive)
    verdict = SPEC.verify(problem, {"x": x}, out, SPEC.baseline(problem, {"x": x}))
    assert verdict, verdict.detail
    return out


def test_seed_example():
    x = torch.tensor([5.0, -2.0, 3.0, 1.0, -4.0], device="cuda")
    assert ck.scan(x).tolist() == [5.0, 3.0, 6.0, 7.0, 3.0]
    assert ck.scan(x, exclusive=True).tolist() == [0.0, 5.0, 3.0, 6.0, 7.0]


@pytest.mark.parametrize("n", LENGTHS)
def test_float32_lengths(n, generator):
    check(random_input((n,), torch.float32, generator))


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("config", LARGE, ids=LARGE_IDS)
def test_float32_lengths_large_tile(n, config, generator):
    check(random_input((n,), torch.float32, generator), config=config)
    check(random_input((n,), torch.float32, generator), exclusive=True, config=config)


@pytest.mark.parametrize("config", STAGES + LARGE, ids=STAGE_IDS + LARGE_IDS)
@pytest.mark.parametrize("exclusive", [False, True])
def test_rows_around_the_tile_size(config, exclusive, generator):
    """Segment heads at every place a tile's aggregate can see them: none in the tile (rows longer than a
    tile), exactly at its start or its last element, several per tile, every element. The dedicated
    look-back sums a tile's aggregate from its last head by index arithmetic, so these must be exact."""
    tile = config.tile
    for length in (1, 3, tile - 1, tile, tile + 1, 2 * tile - 1, 3 * tile + 5):
        rows = max(2, min(64, (4 * tile) // length + 1))
        x = torch.randint(-8, 9, (rows, length), device="cuda", generator=generator).float()
        expected = torch.cumsum(x.double(), -1)
        if exclusive:
            expected = expected - x.double()
        out = ck.scan(x, exclusive=exclusive, config=config, out=poisoned_out(x))
        assert torch.equal(out, expected.float()), (config, length)


@pytest.mark.parametrize("n", [1, 33, 4097, 250_000])
@pytest.mark.parametrize("tile", TILES)
def test_every_tile_size(n, tile, generator):
    """Integer-valued floats sum exactly in float32 at these sizes: any indexing slip shows as a mismatch."""
    x = torch.randint(-8, 9, (n,), device="cuda", generator=generator).float()
    problem = ScanProblem(1, n, torch.float32)
    expected = torch.cumsum(x.double(), 0).float()
    for config in (c for c in SPEC.supported_candidates(problem) if c.tile == tile):
        out = ck.scan(x, config=config, out=poisoned_out(x))
        assert torch.equal(out, expected), config


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("n", [1, 7, 1025, 65_537, 1_000_003])
@pytest.mark.parametrize("config", STAGES, ids=STAGE_IDS)
def test_dtypes_and_modes(dtype, exclusive, n, config, generator):
    out = check(random_input((n,), dtype, generator), exclusive, config=config)
    assert out.dtype == torch.cumsum(torch.zeros(1, dtype=dtype), 0).dtype


@pytest.mark.parametrize("shape", [(3, 17), (1000, 1), (7, 4097), (2, 8192), (3, 4095), (65_536, 100),
                                   (4, 250_000), (2, 3, 1025), (5, 1, 33)])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("config", STAGES, ids=STAGE_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32])
def test_batched_rows(shape, exclusive, config, dtype, generator):
    check(random_input(shape, dtype, generator), exclusive, config=config)


# The first wave's ramp (ScanConfig.ramp_ns) under every schedule and stage, on launches of at least two
# waves (the test asserts the ramp is on): the first wave's CTAs then claim their tiles in 8 groups.
RAMPED = [dataclasses.replace(c, items_per_thread=4, ramp_ns=4000) for c in STAGES]


@pytest.mark.parametrize("shape", [((1 << 22) + 3,), (3, 1_400_001), (2048, 2048)])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("config", RAMPED, ids=STAGE_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32])
def test_first_wave_ramp(shape, exclusive, config, dtype, generator):
    x = random_input(shape, dtype, generator)
    assert scan_lookback.planned_ramp_step_ns(config, problem_of(x, exclusive), x.device.index) > 0
    check(x, exclusive, config=config)


@pytest.mark.parametrize("offset", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.float64])
@pytest.mark.parametrize("config", STAGES, ids=STAGE_IDS)
@pytest.mark.parametrize("rows", [1, 7])
def test_misaligned_input_and_output(offset, dtype, config, rows, generator):
    """Views that start off a 16-byte boundary take narrower vectors (and 4/8-byte cp.async)."""
    length = 100_003 // rows
    x = random_input((rows * length + offset,), dtype, generator)[offset:].view(rows, length)
    check(x, config=config)
    out = torch.empty(rows * length + offset, dtype=out_dtype(dtype, "sum"), device="cuda")[offset:].view(rows, length)
    out.copy_(oracle.poisoned_like(out))
    check(x, out=out, config=config)


def test_non_contiguous_input(generator):
    x = random_input((300, 200), torch.float32, generator).t()
    check(x)


@pytest.mark.parametrize("config", STAGES, ids=STAGE_IDS)
@pytest.mark.parametrize("exclusive", [False, True])
def test_in_place(config, exclusive, generator):
    x = random_input((5, 10_001), torch.float32, generator)
    original = x.clone()
    y = ck.scan(x, out=x, exclusive=exclusive, config=config)
    assert y is x
    problem = problem_of(original, exclusive)
    verdict = SPEC.verify(problem, {"x": original}, x, SPEC.baseline(problem, {"x": original}))
    assert verdict, verdict.detail


@pytest.mark.parametrize("shape", [(64, 65_539), (5000, 1001), (3, (1 << 22) + 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32])
@pytest.mark.parametrize("lookback", LOOKBACKS)
def test_batched_rows_with_the_default_large_tile(shape, dtype, lookback, generator):
    """Above 2^22 elements the default is the shared-memory-staged tile: rows crossing its tiles."""
    x = random_input(shape, dtype, generator)
    length = shape[-1]
    problem = ScanProblem(x.numel() // length, length, dtype)
    config = dataclasses.replace(default_config(problem), lookback=lookback)
    check(x, config=config)
    check(random_input(shape, dtype, generator), exclusive=True, config=config)


def test_int64_wraps_like_torch():
    x = torch.full((100_000,), 2**62 + 12345, dtype=torch.int64, device="cuda")
    assert torch.equal(ck.scan(x, out=poisoned_out(x)), torch.cumsum(x, 0))


@pytest.mark.parametrize("lookback", LOOKBACKS)
def test_nan_and_inf_propagate_like_torch(lookback):
    x = torch.ones(3, 50_000, device="cuda")
    x[0, 20_000] = float("nan")
    x[1, 30_000] = float("inf")
    x[2, 40_000] = float("-inf")
    out = ck.scan(x, out=poisoned_out(x), config=ScanConfig(256, 16, True, lookback))
    expected = torch.cumsum(x, -1)
    assert torch.equal(out[:, :20_000], expected[:, :20_000])
    assert out[0, 20_000:].isnan().all() and not out[1:].isnan().any()
    assert torch.equal(out[1:], expected[1:])


def test_zero_dim_and_empty():
    assert ck.scan(torch.tensor(3.5, device="cuda")).item() == 3.5
    assert ck.scan(torch.tensor(3.5, device="cuda"), exclusive=True).item() == 0.0
    for shape in [(0,), (3, 0), (0, 5)]:
        x = torch.empty(shape, device="cuda")
        y = ck.scan(x)
        assert y.shape == x.shape and y.dtype == torch.float32
        out = torch.empty(shape, device="cuda")
        assert ck.scan(x, out=out) is out


def test_side_stream_and_capture(generator):
    x = random_input((1 << 20,), torch.float32, generator)
    expected = ck.scan(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = ck.scan(x)
    torch.cuda.current_stream().wait_stream(stream)
    assert oracle.compare(out, reference(x, False), expected, scale=scan_scale(x))
    graph = torch.cuda.CUDAGraph()
    out = torch.empty_like(x)
    with torch.cuda.graph(graph):
        ck.scan(x, out=out)
    for _ in range(3):  # replays, with new data in the captured input each time, interleaved with eager calls
        x.copy_(random_input(x.shape, x.dtype, generator))
        out.fill_(float("nan"))
        graph.replay()
        eager = ck.scan(x)
        torch.cuda.synchronize()
        verdict = oracle.compare(out, reference(x, False), torch.cumsum(x, 0), scale=scan_scale(x))
        assert verdict, verdict.detail
        assert torch.equal(eager, out) or oracle.compare(eager, reference(x, False), torch.cumsum(x, 0),
                                                         scale=scan_scale(x))


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device(generator):
    x = torch.randn(100_000, device="cuda:1")
    out = ck.scan(x)
    assert out.device == x.device
    assert oracle.compare(out, reference(x, False), torch.cumsum(x, 0), scale=scan_scale(x))


def test_repeated_runs_are_exact_for_integers(generator):
    """A race in the look-back shows as a result that changes between runs; integers make it exact, and a
    fresh poisoned output each run makes a skipped tile visible."""
    x = random_input((1 << 24,), torch.int32, generator)
    expected = torch.cumsum(x, 0)
    for config in STAGES:
        for _ in range(10):
            assert torch.equal(ck.scan(x, out=poisoned_out(x), config=config), expected)


def _small_integer_valued(n, dtype, generator):
    """Values in {-1, 0, 1}: every prefix of a float32 scan up to 2^24 elements is exact, so any dtype's
    result can be compared exactly."""
    return torch.randint(-1, 2, (n,), device="cuda", generator=generator).to(dtype)


@pytest.mark.parametrize("config", STAGES, ids=STAGE_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32], ids=["packed-states", "pair-states"])
def test_launches_share_a_workspace_without_clearing_it(config, dtype, generator):
    """Launches on one stream reuse one workspace and nothing clears it between them: a large scan, then
    small ones, then the large one again must not read the states the earlier launches left behind (they
    carry another epoch) and must claim tiles from zero (the launch before readied the counter)."""
    sizes = [(1 << 22) + 9, 1, 4097, 33, (1 << 22) + 9, 3 * config.tile + 1, (1 << 20) - 1, (1 << 22) + 9]
    inputs = {n: _small_integer_valued(n, dtype, generator) for n in set(sizes)}
    expected = {n: torch.cumsum(x, 0) for n, x in inputs.items()}
    key = (0, torch.cuda.current_stream().cuda_stream, "packed" if dtype == torch.float32 else "pair")
    buffers = []
    for step, n in enumerate(sizes):
        assert torch.equal(ck.scan(inputs[n], out=poisoned_out(inputs[n]), config=config), expected[n]), (step, n)
        buffers.append(scan_lookback._workspaces[key].buffer)
    # The first size is the largest: every later launch reused its workspace (or the test proves nothing).
    assert all(b is buffers[0] for b in buffers)


def test_epoch_wrap_zeroes_a_fresh_workspace(monkeypatch, generator):
    """When the epochs run out, the next launch gets a zeroed workspace and starts again at epoch 1."""
    monkeypatch.setattr(scan_lookback, "EPOCH_LIMIT", 4)
    key = (0, torch.cuda.current_stream().cuda_stream, "packed")
    monkeypatch.setitem(scan_lookback._workspaces, key, scan_lookback._zeroed_workspace(1 << 16, torch.float32, 0))
    xs = [_small_integer_valued(n, torch.float32, generator) for n in ((1 << 20) + 3, 50_001)]  # both multi-tile
    buffers, epochs = [], []
    for step in range(9):
        x = xs[step % 2]
        assert torch.equal(ck.scan(x, out=poisoned_out(x)), torch.cumsum(x, 0)), step
        buffers.append(scan_lookback._workspaces[key].buffer)
        epochs.append(scan_lookback._workspaces[key].epoch)
    assert epochs == [1, 2, 3, 1, 2, 3, 1, 2, 3]
    assert buffers[2] is buffers[0] and buffers[3] is not buffers[2] and buffers[6] is not buffers[5]


def test_a_larger_launch_never_reads_a_smaller_ones_values_as_statuses(monkeypatch):
    """8-byte states on one workspace across launches of different tile counts: values a launch left behind
    that equal a status word of the next epoch must not read as published (the pair layout keeps each tag
    in the upper half of its word, the value's bits in the lower halves, at a fixed offset per tile)."""
    key = (0, torch.cuda.current_stream().cuda_stream, "pair")
    monkeypatch.setitem(scan_lookback._workspaces, key, scan_lookback._zeroed_workspace(1 << 16, torch.int64, 0))
    config = ScanConfig(128, 32, staged=False, lookback="inline")
    # Launch 1 (epoch 1): every tile sums to the status word "epoch 2, inclusive prefix".
    disguised = (2 << 2) | 2
    small = torch.zeros(16 * config.tile, dtype=torch.int64, device="cuda")
    small[:: config.tile] = disguised
    assert torch.equal(ck.scan(small, config=config), torch.cumsum(small, 0))
    # Launch 2 (epoch 2), many more tiles: its states must be its own.
    large = torch.randint(-1000, 1000, (400 * config.tile,), dtype=torch.int64, device="cuda")
    for _ in range(3):
        assert torch.equal(ck.scan(large, out=poisoned_out(large), config=config), torch.cumsum(large, 0))
        monkeypatch.setitem(scan_lookback._workspaces, key, scan_lookback._zeroed_workspace(1 << 16, torch.int64, 0))
        ck.scan(small, config=config)


def test_threads_sharing_a_stream():
    """Two threads on torch's default stream: each call's epoch and launch must stay together (the
    workspace is shared per stream)."""
    import threading

    gen = torch.Generator(device="cuda").manual_seed(7)
    inputs = [random_input(((1 << 20) + 3,), torch.int32, gen), random_input(((1 << 14) + 5,), torch.int32, gen)]
    expected = [torch.cumsum(x, 0) for x in inputs]
    wrong = []

    def work(i):
        for _ in range(300):
            out = ck.scan(inputs[i], out=poisoned_out(inputs[i]))
            torch.cuda.current_stream().synchronize()
            if not torch.equal(out, expected[i]):
                wrong.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, f"{len(wrong)} wrong results"


@pytest.mark.memory_heavy
@pytest.mark.parametrize("lookback", LOOKBACKS)
def test_past_int32_indexing(lookback):
    n = (1 << 31) + 1031
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs a GPU with 40 GB or more (input, output and checks take ~30 GB)")
    x = torch.ones(n, dtype=torch.int32, device="cuda")
    x[::3] = -1
    problem = ScanProblem(1, n, torch.int32)
    out = ck.scan(x, config=dataclasses.replace(default_config(problem), lookback=lookback))
    # Chunked exact reference: cumsum per chunk plus the carry from the chunks before.
    carry = 0
    chunk = 1 << 28
    for start in range(0, n, chunk):
        ref = torch.cumsum(x[start:start + chunk], 0) + carry
        assert torch.equal(out[start:start + chunk], ref), f"mismatch in chunk at {start}"
        carry = int(ref[-1])
    del x, out


class TestBadInput:
    def test_unsupported_dtype(self):
        with pytest.raises(TypeError, match=r"x: expected dtype in \(torch.float32.*got torch.complex64"):
            ck.scan(torch.zeros(4, dtype=torch.complex64, device="cuda"))
        with pytest.raises(TypeError, match=r"x: expected dtype in \(torch.float32.*got torch.bool"):
            ck.scan(torch.zeros(4, dtype=torch.bool, device="cuda"), op="logsumexp")
        with pytest.raises(TypeError, match=r"x: expected dtype in \(torch.float32.*got torch.int32"):
            ck.scan(torch.zeros(4, dtype=torch.int32, device="cuda"), op="logsumexp")
        with pytest.raises(ValueError, match=r"op: expected one of \('sum'.*got 'mean'"):
            ck.scan(torch.zeros(4, device="cuda"), op="mean")
        with pytest.raises(ValueError, match=r"dim: expected a dim in \[-2, 1\] of a 2-d tensor, got 2"):
            ck.scan(torch.zeros(4, 4, device="cuda"), dim=2)
        with pytest.raises(TypeError, match=r"dim: expected an int, got float"):
            ck.scan(torch.zeros(4, 4, device="cuda"), dim=1.0)
        with pytest.raises(TypeError, match=r"dtype: op 'logsumexp' does not take torch.int64"):
            ck.scan(torch.zeros(4, device="cuda"), op="logsumexp", dtype=torch.int64)
        with pytest.raises(TypeError, match=r"reverse: expected a bool"):
            ck.scan(torch.zeros(4, device="cuda"), reverse=1)

    def test_out_errors_write_nothing(self):
        x = torch.randn(10, 20, device="cuda")
        cases = [
            (torch.full((20, 10), 7.0, device="cuda"), ValueError, "out: expected shape"),
            (torch.full((10, 20), 7.0, device="cuda", dtype=torch.bool), TypeError, "out: a sum scan computes in"),
            (torch.full((10, 20), 7.0, device="cuda", dtype=torch.float64), TypeError, "out: expected dtype", "max"),
            (torch.full((20, 10), 7.0, device="cuda").t(), ValueError, "out: expected a contiguous"),
            (torch.full((10, 20), 7.0), ValueError, "out: expected a tensor on cuda"),
        ]
        for out, exc, msg, *op in cases:
            before = out.clone()
            with pytest.raises(exc, match=msg):
                ck.scan(x, out=out, op=op[0] if op else "sum")
            assert torch.equal(out, before)

    def test_partial_overlap_is_refused(self):
        base = torch.randn(101, device="cuda")
        before = base.clone()
        with pytest.raises(ValueError, match="out: overlaps the memory of x"):
            ck.scan(base[:100], out=base[1:])
        assert torch.equal(base, before)

    def test_an_integer_max_keeps_its_dtype(self):
        """A max or min result keeps x's dtype, as torch.cummax's: an out of another dtype is refused (a sum
        computes in out's dtype instead: test_out_of_another_dtype_is_the_dtype_of_a_sum_or_product)."""
        x = torch.arange(10, dtype=torch.int32, device="cuda")
        with pytest.raises(TypeError, match="out: expected dtype torch.int32, got torch.int64"):
            ck.scan(x, op="max", out=torch.empty(10, dtype=torch.int64, device="cuda"))

    def test_bad_config(self):
        x = torch.randn(100, device="cuda")
        with pytest.raises(ValueError, match="config: .* not a multiple of the vector width"):
            ck.scan(x, config=ScanConfig(128, 2))



# ---- Operators, directions, dims, casts (issue 25) ------------------------------------------------------


def _problem(x, dim, op, exclusive, reverse, dtype=None) -> ScanProblem:
    dim = dim % max(x.dim(), 1)
    shape = tuple(x.shape) or (1,)
    rows, inner = 1, 1
    for s in shape[:dim]:
        rows *= s
    for s in shape[dim + 1:]:
        inner *= s
    return ScanProblem(rows, shape[dim], dtype or x.dtype, exclusive, op=op, reverse=reverse, inner=inner)


def check_general(x, *, dim=-1, op="sum", exclusive=False, reverse=False, dtype=None, config=None):
    """ck.scan against the float64 (or exact) reference and 2x torch's error, on a poisoned output of the
    op's dtype; x is viewed as (rows, length, inner) for the registry's oracle."""
    read = x if dtype is None else x.to(dtype)
    problem = _problem(read, dim, op, exclusive, reverse)
    out = oracle.poisoned_like(torch.empty(x.shape, dtype=problem.out_dtype, device=x.device))
    got = ck.scan(x, dim=dim, op=op, exclusive=exclusive, reverse=reverse, dtype=dtype, out=out, config=config)
    assert got is out
    shaped = read.reshape(problem.rows, problem.length, problem.inner) if problem.inner > 1 else (
        read.reshape(problem.rows, problem.length) if problem.rows > 1 else read.reshape(problem.length))
    spec = registry.get("scan", "columns" if problem.inner > 1 else "lookback")
    inputs = {"x": shaped}
    verdict = spec.verify(problem, inputs, out.reshape(shaped.shape), spec.baseline(problem, inputs))
    assert verdict, verdict.detail


def op_input(shape, dtype, op, generator):
    if op == "prod":
        if dtype.is_floating_point:
            return (1 + torch.randn(shape, device="cuda", generator=generator) / 64).to(dtype)
        return torch.randint(-3, 4, shape, dtype=dtype, device="cuda", generator=generator)
    if dtype.is_floating_point:
        return torch.randn(shape, device="cuda", generator=generator).to(dtype)
    return torch.randint(-1000, 1000, shape, dtype=dtype, device="cuda", generator=generator)


OP_DTYPES = [(op, dtype) for op in OPS for dtype in OPS[op][2]]


@pytest.mark.parametrize("op, dtype", OP_DTYPES, ids=[f"{o}-{str(d)[6:]}" for o, d in OP_DTYPES])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("n", [1, 33, 4097, 250_001])
def test_every_operator_and_dtype_along_the_last_dim(op, dtype, exclusive, reverse, n, generator):
    check_general(op_input((n,), dtype, op, generator), op=op, exclusive=exclusive, reverse=reverse)


@pytest.mark.parametrize("config", STAGES, ids=STAGE_IDS)
@pytest.mark.parametrize("op", ["sum", "max", "logsumexp"])
@pytest.mark.parametrize("shape", [(7, 4097), (3, 1_000_003), (1000, 37)])
def test_reverse_and_operators_under_every_schedule(config, op, shape, generator):
    for reverse in (False, True):
        check_general(op_input(shape, torch.float32, op, generator), op=op, reverse=reverse, config=config)


@pytest.mark.parametrize("shape, dim", [((65_536, 256), 0), ((4096, 4096), 0), ((3, 1000, 7), 1), ((5, 33, 2), 0),
                                        ((2, 3, 4, 5), 1), ((1000, 3), 0), ((17, 1, 9), 0), ((4, 100_000, 8), 1)])
@pytest.mark.parametrize("op", list(OPS))
def test_strided_dims(shape, dim, op, generator):
    for exclusive, reverse in ((False, False), (True, True)):
        check_general(op_input(shape, torch.float32, op, generator), dim=dim, op=op, exclusive=exclusive, reverse=reverse)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64])
@pytest.mark.parametrize("op", ["sum", "max", "prod"])
def test_strided_dims_of_every_dtype(dtype, op, generator):
    x = op_input((300, 6, 130), dtype, op, generator)
    for dim in (0, 1):
        check_general(x, dim=dim, op=op, reverse=dim == 1)


@pytest.mark.parametrize("config", [ck.ColumnScanConfig(threads, rows, lanes, tiles)
                                    for threads, rows, lanes, tiles in ((128, 4, 0, 4), (512, 16, 32, 16), (256, 1, 8, 64),
                                                                        (64, 2, 32, 1))])
def test_column_configs(config, generator):
    for shape in ((10_000, 96), (257, 1000), (3, 5000, 5)):
        check_general(op_input(shape, torch.float32, "sum", generator), dim=-2, config=config)


def test_a_misaligned_strided_scan_falls_back_to_narrow_vectors(generator):
    base = torch.randn(1000 * 64 + 1, device="cuda", generator=generator)
    x = base[1:].view(1000, 64)
    check_general(x, dim=0)
    out = torch.empty(1000 * 64 + 1, device="cuda")[1:].view(1000, 64)
    ck.scan(x, dim=0, out=out)
    assert oracle.compare(out, torch.cumsum(x.double(), 0), torch.cumsum(x, 0), scale=scan_scale(x, 0))


def test_dtype_casts_first_like_torch(generator):
    x = torch.randint(-5, 5, (1000, 33), dtype=torch.int32, device="cuda", generator=generator)
    got = ck.scan(x, dim=0, dtype=torch.float64)
    assert got.dtype == torch.float64
    assert torch.equal(got, torch.cumsum(x, 0, dtype=torch.float64))
    h = torch.randn(5000, device="cuda", generator=generator).half()
    assert ck.scan(h, dtype=torch.float32).dtype == torch.float32
    check_general(h, dtype=torch.float32)
    # An integer dtype= is the result's dtype too: int32 sums and products wrap in int32 as torch's do (the
    # kernel's int64 result narrowed), along the last dim, a strided one, in place and into out=.
    big = torch.randint(2 ** 30, 2 ** 31 - 1, (7, 3000), dtype=torch.int64, device="cuda", generator=generator)
    for op, torch_op in (("sum", torch.cumsum), ("prod", torch.cumprod)):
        for dim in (1, 0):
            got = ck.scan(big, dim=dim, op=op, dtype=torch.int32)
            assert got.dtype == torch.int32 and torch.equal(got, torch_op(big, dim, dtype=torch.int32)), (op, dim)
    small = big.to(torch.int32)
    out = torch.full_like(small, 7)
    assert ck.scan(small, dtype=torch.int32, out=out) is out and torch.equal(out, torch.cumsum(small, 1, dtype=torch.int32))
    expected = torch.cumsum(small, 1, dtype=torch.int32)
    assert ck.scan(small, dtype=torch.int32, out=small) is small and torch.equal(small, expected)


def test_nan_and_inf_in_max_min_and_logsumexp_follow_torch():
    x = torch.tensor([1.0, float("nan"), 3.0, -float("inf"), float("inf"), 2.0] * 700, device="cuda")
    for op in ("max", "min"):
        ours, theirs = ck.scan(x, op=op), getattr(torch, "cum" + op)(x, 0).values
        assert torch.equal(ours.isnan(), theirs.isnan()) and torch.equal(ours.nan_to_num(), theirs.nan_to_num())
    y = torch.tensor([-float("inf"), -float("inf"), 1.0, float("inf"), 0.0] * 1000, device="cuda")
    assert torch.equal(ck.scan(y, op="logsumexp"), torch.logcumsumexp(y, 0))


def test_exclusive_identities():
    x = torch.arange(1, 9, device="cuda", dtype=torch.float32)
    assert ck.scan(x, op="max", exclusive=True)[0] == -float("inf")
    assert ck.scan(x, op="min", exclusive=True)[0] == float("inf")
    assert ck.scan(x, op="prod", exclusive=True)[0] == 1
    assert ck.scan(x, op="logsumexp", exclusive=True, reverse=True)[-1] == -float("inf")
    i = torch.arange(8, device="cuda", dtype=torch.int32)
    assert ck.scan(i, op="max", exclusive=True)[0] == torch.iinfo(torch.int32).min


def test_strided_scans_repeat_bit_for_bit(generator):
    x = torch.randn(4096, 512, device="cuda", generator=generator)
    first = ck.scan(x, dim=0)
    for _ in range(5):
        assert torch.equal(ck.scan(x, dim=0), first)


def test_in_place_reverse_and_strided(generator):
    x = torch.randn(3000, 40, device="cuda", generator=generator)
    expected = torch.cumsum(x.double().flip(1), 1).flip(1)
    y = x.clone()
    assert ck.scan(y, reverse=True, out=y) is y
    assert oracle.compare(y, expected, torch.cumsum(x.flip(1), 1).flip(1), scale=scan_scale(x, 1, reverse=True))
    y = x.clone()
    assert ck.scan(y, dim=0, out=y) is y
    assert oracle.compare(y, torch.cumsum(x.double(), 0), torch.cumsum(x, 0), scale=scan_scale(x, 0))


# ---- Gradients -------------------------------------------------------------------------------------------


# Exclusive max, min and logsumexp start from an infinite identity, whose finite differences are NaN: their
# exclusive gradients are checked against torch's in test_gradients_match_torch instead.
GRADCHECK_CASES = [(op, exclusive, reverse) for op in OPS for exclusive in (False, True) for reverse in (False, True)
                   if not exclusive or op in ("sum", "prod")]


@pytest.mark.parametrize("op, exclusive, reverse", GRADCHECK_CASES)
@pytest.mark.parametrize("dim", [0, 1])
def test_gradcheck(op, dim, exclusive, reverse, generator):
    x = torch.randn(6, 5, dtype=torch.float64, device="cuda", generator=generator)
    if op == "prod":
        x = 1 + x / 4
    x.requires_grad_()
    torch.autograd.gradcheck(lambda t: ck.scan(t, dim=dim, op=op, exclusive=exclusive, reverse=reverse), (x,))


@pytest.mark.parametrize("op", list(OPS))
def test_gradients_match_torch(op, generator):
    from cute_kernels.ops.scan.reference import torch_scan

    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(64, 300, device="cuda", generator=generator)
        if op == "prod":
            x = 1 + x / 64
        x = x.to(dtype).requires_grad_()
        grad = torch.randn(64, 300, device="cuda", generator=generator).to(dtype)
        for exclusive in (False, True):
            (ours,) = torch.autograd.grad(ck.scan(x, dim=0, op=op, reverse=True, exclusive=exclusive), x, grad)
            wide = x.detach().double().requires_grad_()
            (ref,) = torch.autograd.grad(torch_scan(wide, 0, op, reverse=True, exclusive=exclusive), wide, grad.double())
                # torch's own gradient in the input's dtype: what a user of torch's function gets
            same = x.detach().clone().requires_grad_()
            (theirs,) = torch.autograd.grad(torch_scan(same, 0, op, reverse=True, exclusive=exclusive), same, grad)
            assert ours.dtype == dtype
            verdict = oracle.compare(ours.float(), ref, theirs.float())
            assert verdict, (dtype, exclusive, verdict.detail)


def test_a_linear_layer_style_cumsum_trains():
    x = torch.randn(32, 100, device="cuda", requires_grad=True)
    loss = ck.scan(x, dim=1).square().sum()
    loss.backward()
    x2 = x.detach().clone().requires_grad_()
    torch.cumsum(x2, 1).square().sum().backward()
    assert torch.allclose(x.grad, x2.grad, rtol=1e-4, atol=1e-3)


# ---- Segments --------------------------------------------------------------------------------------------


def segment_input(shape, dtype, op, generator):
    x = random_input(shape, dtype if dtype.is_floating_point else dtype, generator)
    if op == "prod":
        x = (1 + torch.randn(shape, device="cuda", generator=generator) / 64).to(dtype) if dtype.is_floating_point \
            else torch.randint(-3, 4, shape, dtype=dtype, device="cuda", generator=generator)
    return x


def check_segmented(x, starts, dim=-1, exclusive=False, reverse=False, op="sum", config=None):
    """The registry's oracle on the scan moved to the last dim (rows x length, as the entry sees it)."""
    out = oracle.poisoned_like(torch.empty(x.shape, dtype=out_dtype(x.dtype, op), device=x.device))
    got = ck.scan(x, dim=dim, exclusive=exclusive, reverse=reverse, op=op, segment_starts=starts, out=out,
                  config=config)
    assert got is out
    x_last, starts_last, out_last = (t.movedim(dim, -1).contiguous() for t in (x, starts, out))
    length = x_last.shape[-1]
    rows = x_last.numel() // length
    problem = ScanProblem(rows, length, x.dtype, exclusive, op=op, reverse=reverse, segmented=True)
    inputs = {"x": x_last.reshape(rows, length), "segment_starts": starts_last.reshape(rows, length)}
    verdict = SPEC.verify(problem, inputs, out_last.reshape(rows, length), SPEC.baseline(problem, inputs))
    assert verdict, verdict.detail


SEGMENT_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int32]


@pytest.mark.parametrize("op, dtype", [(op, dtype) for op in OPS for dtype in SEGMENT_DTYPES if dtype in OPS[op][2]],
                         ids=str)
@pytest.mark.parametrize("exclusive, reverse", [(False, False), (True, False), (False, True), (True, True)])
def test_segmented_ops_and_directions(op, dtype, exclusive, reverse, generator):
    x = segment_input((3, 70_001), dtype, op, generator)
    starts = torch.rand(x.shape, device="cuda", generator=generator) < 0.002
    check_segmented(x, starts, exclusive=exclusive, reverse=reverse, op=op)


@pytest.mark.parametrize("density", [0.0, 0.01, 0.5, 1.0])
@pytest.mark.parametrize("n", [1, 33, 4097, 1_000_003])
def test_segment_densities_and_lengths(density, n, generator):
    x = random_input((n,), torch.float32, generator)
    starts = torch.rand(n, device="cuda", generator=generator) < density
    for reverse in (False, True):
        for config in (None, ScanConfig(256, 16, True, "early")):
            check_segmented(x, starts, reverse=reverse, config=config)
            check_segmented(x, starts, reverse=reverse, exclusive=True, config=config)


SEGMENTED_CONFIGS = [c for c in STAGES if c.lookback != "dedicated"] + [
    ScanConfig(384, 24, True), ScanConfig(512, 32, False), ScanConfig(384, 24, True, "early"), ScanConfig(512, 32, False, "early")]


@pytest.mark.parametrize("config", SEGMENTED_CONFIGS,
                         ids=lambda c: f"{c.threads}x{c.items_per_thread}-{'shared' if c.staged else 'registers'}-{c.lookback}")
def test_segmented_configs(config, generator):
    x = random_input((5, 100_003), torch.float32, generator)
    starts = torch.rand(x.shape, device="cuda", generator=generator) < 0.001
    check_segmented(x, starts, config=config)
    check_segmented(x, starts, reverse=True, config=config)


def test_segments_along_a_strided_dim_and_misaligned_tensors(generator):
    x = random_input((2, 5001, 7), torch.float32, generator)
    starts = torch.rand(x.shape, device="cuda", generator=generator) < 0.01
    check_segmented(x, starts, dim=1)
    check_segmented(x, starts, dim=1, reverse=True, op="max")
    base = random_input((40_001,), torch.float32, generator)
    flags = torch.rand(40_001, device="cuda", generator=generator) < 0.01
    check_segmented(base[1:], flags[1:])
    check_segmented(base[3:], flags[:-3], reverse=True)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("shift", [-1, 0, 1])
def test_segment_starts_on_tile_boundaries(shift, reverse, generator):
    """Starts exactly on the boundaries between the tiles the call runs (and one element either side): the
    look-back's carried flag and the tile's own first flag meet there. The default config and two others."""
    x = random_input((2, 50_000), torch.int32, generator)
    problem = ScanProblem(2, 50_000, torch.int32, segmented=True, reverse=reverse)
    for config in (default_config(problem), ScanConfig(128, 16, False, "inline"), ScanConfig(256, 8, False, "early")):
        tile = config.threads * config.items_per_thread
        starts = torch.zeros(x.shape, dtype=torch.bool, device="cuda")
        starts[:, tile + shift::tile] = True
        starts[1, ::3 * tile] = True  # row 1: also every third boundary itself
        check_segmented(x, starts, reverse=reverse, config=config)
        check_segmented(x.float(), starts, reverse=reverse, op="max", config=config)


def test_every_start_flagged_is_x_and_none_is_the_plain_scan(generator):
    x = random_input((4, 3000), torch.int32, generator)
    assert torch.equal(ck.scan(x, segment_starts=torch.ones_like(x, dtype=torch.bool)), x.long())
    assert torch.equal(ck.scan(x, segment_starts=torch.zeros_like(x, dtype=torch.bool), reverse=True),
                       ck.scan(x, reverse=True))


@pytest.mark.parametrize("op", ["sum", "logsumexp", "max", "prod"])
def test_segmented_gradients_match_the_float64_reference(op, generator):
    from cute_kernels.ops.scan.reference import segmented_scan

    x = segment_input((4, 3000), torch.float32, op, generator).requires_grad_()
    starts = torch.rand(x.shape, device="cuda", generator=generator) < 0.01
    grad = torch.randn(x.shape, device="cuda", generator=generator)
    for exclusive, reverse in ((False, False), (True, True)):
        (ours,) = torch.autograd.grad(ck.scan(x, op=op, exclusive=exclusive, reverse=reverse, segment_starts=starts),
                                      x, grad)
        results = []
        for dtype in (torch.float64, torch.float32):
            leaf = x.detach().to(dtype).requires_grad_()
            y = segmented_scan(leaf, starts, 1, op, exclusive=exclusive, reverse=reverse)
            results.append(torch.autograd.grad(y, leaf, grad.to(dtype))[0])
        verdict = oracle.compare(ours, *results)
        assert verdict, (exclusive, reverse, verdict.detail)


def test_segment_starts_bad_input_writes_nothing():
    x = torch.randn(10, 20, device="cuda")
    out = torch.full_like(x, float("nan"))
    with pytest.raises(TypeError, match=r"^segment_starts: expected a bool tensor, got torch.uint8"):
        ck.scan(x, segment_starts=torch.zeros(10, 20, dtype=torch.uint8, device="cuda"), out=out)
    with pytest.raises(ValueError, match=r"^segment_starts: expected x's shape \(10, 20\), got \(20,\)"):
        ck.scan(x, segment_starts=torch.zeros(20, dtype=torch.bool, device="cuda"), out=out)
    with pytest.raises(ValueError, match=r"^segment_starts: expected a CUDA tensor"):
        ck.scan(x, segment_starts=torch.zeros(10, 20, dtype=torch.bool), out=out)
    with pytest.raises(ValueError, match=r"^config: .* segment starts take the inline or early schedule"):
        ck.scan(x, segment_starts=torch.zeros(10, 20, dtype=torch.bool, device="cuda"),
                config=ScanConfig(256, 16, False, "dedicated"), out=out)
    assert torch.isnan(out).all()


def test_segmented_scan_of_a_strided_dim_in_place(generator):
    x = random_input((50, 7), torch.float32, generator)
    starts = torch.rand(x.shape, device="cuda", generator=generator) < 0.1
    expected = ck.scan(x, dim=0, segment_starts=starts)
    assert ck.scan(x, dim=0, segment_starts=starts, out=x) is x  # the scan reads a moved copy
    assert oracle.compare(x, expected.double())


@pytest.mark.memory_heavy
@pytest.mark.parametrize("reverse", [False, True])
def test_segmented_past_int32_indexing(reverse):
    """int32 ones with a segment every 1000 elements, past 2^31: each result is its position in the segment
    (counted from the segment's start, or from its end when reversed) plus one, exactly."""
    n = (1 << 31) + 1031
    if torch.cuda.get_device_properties(0).total_memory < 60 * 2**30:
        pytest.skip("needs a GPU with 60 GB or more (input, flags, output and checks)")
    x = torch.ones(n, dtype=torch.int32, device="cuda")
    starts = torch.zeros(n, dtype=torch.bool, device="cuda")
    starts[::1000] = True
    out = ck.scan(x, segment_starts=starts, reverse=reverse)
    del x, starts
    chunk = 1 << 28
    for begin in range(0, n, chunk):
        position = torch.arange(begin, min(n, begin + chunk), device="cuda", dtype=torch.int64)
        if reverse:  # elements to the segment's end: the next multiple of 1000, or n
            expected = torch.minimum((position // 1000 + 1) * 1000, torch.tensor(n, device="cuda")) - position
        else:
            expected = position % 1000 + 1
        assert torch.equal(out[begin:begin + chunk], expected), f"mismatch in chunk at {begin}"
    del out


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16])
def test_dtype_a_narrow_integer_wraps_as_torch_cumsum(dtype):
    """dtype= int8, uint8, int16, as torch.cumsum and cumprod take it: x cast to it first (floats past its
    range included, converted as torch converts them), the sums and products wrapping in it; along a
    strided dim, reversed, into out=, and from an int8 x that is already that dtype."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randint(-300, 300, (4, 3000), device="cuda", generator=gen).float() + 0.5
    x[0, :7] = torch.tensor([1e4, -1e4, 127.9, -128.5, 255.5, 256.0, 70000.0])
    for op, torch_fn in (("sum", torch.cumsum), ("prod", torch.cumprod)):
        for dim in (0, 1):
            expected = torch_fn(x, dim, dtype=dtype)
            got = ck.scan(x, dim=dim, op=op, dtype=dtype)
            assert got.dtype == dtype and torch.equal(got, expected), (op, dim)
        reverse = torch_fn(x.flip(1), 1, dtype=dtype).flip(1)
        assert torch.equal(ck.scan(x, op=op, dtype=dtype, reverse=True), reverse)
    narrow = x.to(dtype)
    out = torch.empty_like(narrow)
    assert ck.scan(narrow, dtype=dtype, out=out) is out and torch.equal(out, torch.cumsum(narrow, 1, dtype=dtype))
    # In place, as torch.cumsum(x, 1, dtype=dtype, out=x) is: the scan reads its int32 copy of x.
    expected = torch.cumsum(narrow, 1, dtype=dtype)
    assert ck.scan(narrow, dtype=dtype, out=narrow) is narrow and torch.equal(narrow, expected)
    # dtype= casts first, for max too: an int32 x's max in dtype is that of its values in dtype.
    wide = torch.randint(-70000, 70000, (4, 3000), dtype=torch.int32, device="cuda", generator=gen)
    assert torch.equal(ck.scan(wide, op="max", dtype=dtype), torch.cummax(wide.to(dtype), 1).values)
    running_max = torch.cummax(x.to(dtype), 0).values
    column = x.to(dtype)
    assert ck.scan(column, dim=0, op="max", out=column) is column and torch.equal(column, running_max)


def test_out_of_another_dtype_is_the_dtype_of_a_sum_or_product():
    """As torch.cumsum(x, dim, out=o) and cumprod: the scan computes in out's dtype (int32 wrapping in int32,
    float32 summed in float64, int8 in int8, float32 truncated to int64 first)."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    big = torch.randint(2 ** 28, 2 ** 30, (3, 5000), dtype=torch.int32, device="cuda", generator=gen)
    floats = torch.randn(3, 5000, device="cuda", generator=gen) * 100
    small = torch.randint(-100, 100, (3, 5000), dtype=torch.int8, device="cuda", generator=gen)
    for x, dtype, op, torch_fn in ((big, torch.int32, "sum", torch.cumsum), (floats, torch.float64, "sum", torch.cumsum),
                                   (small, torch.int8, "sum", torch.cumsum), (floats, torch.int64, "sum", torch.cumsum),
                                   (small, torch.int16, "prod", torch.cumprod)):
        ours, theirs = (torch.empty(3, 5000, dtype=dtype, device="cuda") for _ in range(2))
        torch_fn(x, 1, out=theirs)
        assert ck.scan(x, op=op, out=ours) is ours
        if dtype.is_floating_point:
            torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-9)
        else:
            assert torch.equal(ours, theirs), (x.dtype, dtype, op)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int16])
@pytest.mark.parametrize("op", ["max", "min"])
def test_an_exclusive_max_or_min_of_narrow_integers_starts_at_their_limits(dtype, op):
    """Exclusive max/min into a narrow integer result (x of that dtype, or dtype= it) start from that
    dtype's limits (bool: False for max, True for min), not the int32 kernel's limits wrapped by the copy;
    segment starts too."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    if dtype == torch.bool:
        x = torch.rand(2, 700, device="cuda", generator=gen) < 0.5
        low, high = False, True
    else:
        x = torch.randint(0, 50, (2, 700), device="cuda", generator=gen).to(dtype)
        low, high = torch.iinfo(dtype).min, torch.iinfo(dtype).max
    first = torch.full((2, 1), low if op == "max" else high, device="cuda", dtype=dtype)
    running = (torch.cummax if op == "max" else torch.cummin)(x, 1).values
    expected = torch.cat([first, running[:, :-1]], 1)
    assert torch.equal(ck.scan(x, op=op, exclusive=True), expected)
    if dtype != torch.bool:
        assert torch.equal(ck.scan(x.float(), op=op, exclusive=True, dtype=dtype), expected)
    starts = torch.zeros(2, 700, dtype=torch.bool, device="cuda")
    starts[:, 350] = True
    segmented = ck.scan(x, op=op, exclusive=True, segment_starts=starts)
    assert torch.equal(segmented[:, 350], first[:, 0]) and torch.equal(segmented[:, :350], expected[:, :350])


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int16])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_narrow_integers_scan_as_torch_types_them(dtype, op):
    """A bool mask's cumsum (compaction's offsets) and the other integers narrower than int32: read as int32
    copies; sums and products int64, max and min in the input's dtype, as torch's functions give them;
    segmented and reversed too."""
    from cute_kernels.ops.scan.reference import segmented_scan

    gen = torch.Generator(device="cuda").manual_seed(7)
    n = 5000
    if dtype == torch.bool:
        x = torch.rand(3, n, device="cuda", generator=gen) < 0.5
    else:
        low = 0 if dtype == torch.uint8 else -3
        x = torch.randint(low, 4 if op != "prod" else 2, (3, n), device="cuda", generator=gen).to(dtype)
    torch_fn = {"sum": torch.cumsum, "prod": torch.cumprod, "max": lambda t, d: torch.cummax(t, d).values,
                "min": lambda t, d: torch.cummin(t, d).values}[op]
    expected = torch_fn(x, 1)
    got = ck.scan(x, op=op)
    assert got.dtype == expected.dtype and torch.equal(got, expected)
    assert torch.equal(ck.scan(x, op=op, reverse=True), torch_fn(x.flip(1), 1).flip(1))
    starts = torch.rand(3, n, device="cuda", generator=gen) < 0.01
    segmented = ck.scan(x, op=op, segment_starts=starts)
    wide = x.long() if op in ("sum", "prod") else x.int()
    assert torch.equal(segmented, segmented_scan(wide, starts, 1, op).to(expected.dtype))
    out = torch.empty_like(expected)
    assert ck.scan(x, op=op, out=out) is out and torch.equal(out, expected)
