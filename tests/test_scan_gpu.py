"""GPU tier: ck.scan numerics against float64 / exact references, batched rows, layouts, bad input."""

import pytest
import torch

import cute_kernels as ck
from cute_kernels import registry, testing
from cute_kernels import prefix_sum as scan_mod

pytestmark = pytest.mark.gpu

SPEC = registry.get("scan")
TILES = sorted({c.tile for c in SPEC.candidates()})
LENGTHS = [1, 2, 31, 32, 33, 1023, 1024, 1025, 4095, 4096, 4097, 250_000, (1 << 24) + 7]


def reference(x: torch.Tensor, exclusive: bool) -> torch.Tensor:
    wide = torch.float64 if x.dtype.is_floating_point else torch.int64
    ref = torch.cumsum(x.to(wide), dim=-1)
    return ref - x.to(wide) if exclusive else ref


def baseline(x: torch.Tensor, exclusive: bool) -> torch.Tensor:
    """torch's own answer in the input precision: the error our kernel is allowed twice of."""
    b = torch.cumsum(x, dim=-1)
    return torch.cat([torch.zeros_like(b[..., :1]), b[..., :-1]], dim=-1) if exclusive else b


def random_input(shape, dtype, generator):
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype, device="cuda", generator=generator)
    return torch.randint(-1000, 1000, shape, dtype=dtype, device="cuda", generator=generator)


def check(x, exclusive=False, **kwargs):
    out = testing.poisoned_like(torch.empty(x.shape, dtype=scan_mod.DTYPES[x.dtype][0], device=x.device))
    got = ck.scan(x, exclusive=exclusive, out=out, **kwargs)
    assert got is out
    ref = reference(x, exclusive)
    scale = testing.scan_scale(x) if x.dtype.is_floating_point else None
    verdict = testing.compare(out, ref, baseline(x, exclusive), scale=scale)
    assert verdict, verdict.detail
    return out


def test_seed_example():
    x = torch.tensor([5.0, -2.0, 3.0, 1.0, -4.0], device="cuda")
    assert ck.scan(x).tolist() == [5.0, 3.0, 6.0, 7.0, 3.0]
    assert ck.scan(x, exclusive=True).tolist() == [0.0, 5.0, 3.0, 6.0, 7.0]


@pytest.mark.parametrize("n", LENGTHS)
def test_float32_lengths(n, generator):
    check(random_input((n,), torch.float32, generator))


@pytest.mark.parametrize("n", [1, 33, 4097, 250_000])
@pytest.mark.parametrize("tile", TILES)
def test_every_tile_size(n, tile, generator):
    """Integer-valued floats sum exactly in float32 at these sizes: any indexing slip shows as a mismatch."""
    x = torch.randint(-8, 9, (n,), device="cuda", generator=generator).float()
    problem = scan_mod.ScanProblem(1, n, torch.float32)
    for config in (c for c in SPEC.supported_candidates(problem) if c.tile == tile):
        out = ck.scan(x, config=config)
        assert torch.equal(out, torch.cumsum(x.double(), 0).float()), config


STAGES = [scan_mod.ScanConfig(128, 32, staged=False), scan_mod.ScanConfig(256, 16, staged=True)]


@pytest.mark.parametrize("dtype", list(scan_mod.DTYPES))
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("n", [1, 7, 1025, 65_537, 1_000_003])
@pytest.mark.parametrize("config", STAGES, ids=["registers", "shared"])
def test_dtypes_and_modes(dtype, exclusive, n, config, generator):
    out = check(random_input((n,), dtype, generator), exclusive, config=config)
    assert out.dtype == torch.cumsum(torch.zeros(1, dtype=dtype), 0).dtype


@pytest.mark.parametrize("shape", [(3, 17), (1000, 1), (7, 4097), (2, 8192), (3, 4095), (65_536, 100),
                                   (4, 250_000), (2, 3, 1025), (5, 1, 33)])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("config", STAGES, ids=["registers", "shared"])
def test_batched_rows(shape, exclusive, config, generator):
    check(random_input(shape, torch.float32, generator), exclusive, config=config)
    check(random_input(shape, torch.int32, generator), exclusive, config=config)


@pytest.mark.parametrize("offset", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.float64])
@pytest.mark.parametrize("config", STAGES, ids=["registers", "shared"])
def test_misaligned_input_and_output(offset, dtype, config, generator):
    base = random_input((100_003 + offset,), dtype, generator)
    x = base[offset:]
    check(x, config=config)
    out_dtype = scan_mod.DTYPES[dtype][0]
    out_base = torch.empty(100_003 + offset, dtype=out_dtype, device="cuda")
    out = out_base[offset:]
    ck.scan(x, out=out)
    assert testing.compare(out, reference(x, False), torch.cumsum(x, 0),
                           scale=testing.scan_scale(x) if dtype.is_floating_point else None)


def test_non_contiguous_input(generator):
    x = random_input((300, 200), torch.float32, generator).t()
    check(x)


def test_in_place(generator):
    x = random_input((5, 10_001), torch.float32, generator)
    original = x.clone()
    y = ck.scan(x, out=x)
    assert y is x
    verdict = testing.compare(x, reference(original, False), baseline(original, False),
                              scale=testing.scan_scale(original))
    assert verdict, verdict.detail


def test_zero_dim_and_empty():
    assert ck.scan(torch.tensor(3.5, device="cuda")).item() == 3.5
    for shape in [(0,), (3, 0), (0, 5)]:
        x = torch.empty(shape, device="cuda")
        y = ck.scan(x)
        assert y.shape == x.shape and y.dtype == torch.float32


def test_side_stream_and_capture(generator):
    x = random_input((1 << 20,), torch.float32, generator)
    expected = ck.scan(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = ck.scan(x)
    torch.cuda.current_stream().wait_stream(stream)
    assert testing.compare(out, reference(x, False), expected, scale=testing.scan_scale(x))
    graph = torch.cuda.CUDAGraph()
    out = torch.empty_like(x)
    with torch.cuda.graph(graph):
        ck.scan(x, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert testing.compare(out, reference(x, False), expected, scale=testing.scan_scale(x))


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device(generator):
    x = torch.randn(100_000, device="cuda:1")
    out = ck.scan(x)
    assert out.device == x.device
    assert testing.compare(out, reference(x, False), torch.cumsum(x, 0), scale=testing.scan_scale(x))


def test_repeated_runs_are_exact_for_integers(generator):
    """A race in the look-back shows as a result that changes between runs; integers make it exact."""
    x = random_input((1 << 24,), torch.int32, generator)
    expected = torch.cumsum(x, 0)
    for _ in range(20):
        assert torch.equal(ck.scan(x), expected)


def test_past_int32_indexing():
    n = (1 << 31) + 1031
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs ~30 GB of GPU memory")
    x = torch.ones(n, dtype=torch.int32, device="cuda")
    x[::3] = -1
    out = ck.scan(x)
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
        with pytest.raises(TypeError, match=r"x: expected dtype in \(torch.float32.*got torch.float16"):
            ck.scan(torch.zeros(4, dtype=torch.float16, device="cuda"))

    def test_out_errors_write_nothing(self):
        x = torch.randn(10, 20, device="cuda")
        cases = [
            (torch.full((20, 10), 7.0, device="cuda"), ValueError, "out: expected shape"),
            (torch.full((10, 20), 7.0, device="cuda", dtype=torch.float64), TypeError, "out: expected dtype"),
            (torch.full((20, 10), 7.0, device="cuda").t(), ValueError, "out: expected a contiguous"),
            (torch.full((10, 20), 7.0), ValueError, "out: expected a tensor on cuda"),
        ]
        for out, exc, msg in cases:
            before = out.clone()
            with pytest.raises(exc, match=msg):
                ck.scan(x, out=out)
            assert torch.equal(out, before)

    def test_partial_overlap_is_refused(self):
        base = torch.randn(101, device="cuda")
        before = base.clone()
        with pytest.raises(ValueError, match="out: overlaps the memory of x"):
            ck.scan(base[:100], out=base[1:])
        assert torch.equal(base, before)

    def test_int_output_must_be_int64(self):
        x = torch.arange(10, dtype=torch.int32, device="cuda")
        with pytest.raises(TypeError, match="out: expected dtype torch.int64, got torch.int32"):
            ck.scan(x, out=torch.empty_like(x))

    def test_bad_config(self):
        x = torch.randn(100, device="cuda")
        with pytest.raises(ValueError, match="config: .* not a multiple of the vector width"):
            ck.scan(x, config=scan_mod.ScanConfig(128, 2))
