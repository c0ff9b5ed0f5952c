"""GPU tier: ck.linear_scan against the float64 recurrence (the registry's oracle: 2x the error of the same
doubling scan in the input precision), every kind of problem, layouts and bad input."""

import pytest
import torch

import cute_kernels as ck
from cute_kernels import registry
from cute_kernels.ops.scan import ScanConfig
from cute_kernels.ops.scan.linear import LinearScanProblem, affine_scan, candidates, why_unsupported
from cute_kernels.runtime import oracle

pytestmark = pytest.mark.gpu

SPEC = registry.get("linear_scan")
LENGTHS = [1, 2, 33, 1023, 4097, 65_537, 1_000_003]


def inputs(shape, dtype, generator, scalar_a=False, h0=False):
    x = torch.randn(shape, device="cuda", generator=generator).to(dtype)
    a = 0.9 if scalar_a else (0.5 + 0.5 * torch.rand(shape, device="cuda", generator=generator)).to(dtype)
    rows = x.numel() // shape[-1] if x.dim() else 1
    start = torch.randn(rows, device="cuda", generator=generator) if h0 else None
    return a, x, start


def check(a, x, h0=None, reverse=False, config=None):
    rows = x.numel() // x.shape[-1]
    problem = LinearScanProblem(rows, x.shape[-1], x.dtype, reverse, not isinstance(a, torch.Tensor), h0 is not None)
    out = oracle.poisoned_like(torch.empty_like(x))
    got = ck.linear_scan(a, x, reverse=reverse, h0=None if h0 is None else h0.reshape(x.shape[:-1]), out=out,
                         config=config)
    assert got is out
    flat = {"a": a if not isinstance(a, torch.Tensor) else a.reshape(rows, -1), "x": x.reshape(rows, -1)}
    if h0 is not None:
        flat["h0"] = h0
    verdict = SPEC.verify(problem, flat, out.reshape(rows, -1), SPEC.baseline(problem, flat))
    assert verdict, verdict.detail


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("scalar_a", [False, True])
def test_lengths(n, reverse, scalar_a, generator):
    a, x, _ = inputs((n,), torch.float32, generator, scalar_a)
    check(a, x, reverse=reverse)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 17), (64, 16384), (1000, 37), (7, 4097)])
@pytest.mark.parametrize("reverse", [False, True])
def test_rows_with_h0(dtype, shape, reverse, generator):
    a, x, h0 = inputs(shape, dtype, generator, h0=True)
    check(a, x, h0, reverse)


@pytest.mark.parametrize("config", [c for c in candidates() if c.ramp_ns in (0, 4400) and c.lookback != "rows"][::3])
def test_configs(config, generator):
    a, x, h0 = inputs((5, 30_001), torch.float32, generator, h0=True)
    check(a, x, h0, config=config)


def _rows_cases():
    """(config, tiles a row, dtype, rows, scalar a, h0, reversed) for every rows candidate that takes the case
    (16-bit rows load 8-element vectors: the 4-item tiles take float32 only)."""
    kinds = [(torch.float32, 64, False, False, False), (torch.float32, 7, True, True, True),
             (torch.bfloat16, 5, False, True, False), (torch.float16, 3, False, False, True)]
    return [(config, tiles, *kind) for config in candidates() if config.lookback == "rows" for tiles in (1, 2, 3)
            for kind in kinds
            if why_unsupported(config, LinearScanProblem(kind[1], config.tile * tiles, kind[0], kind[4], kind[2],
                                                         kind[3])) is None]


@pytest.mark.parametrize("config, tiles, dtype, rows, scalar_a, h0, reverse", _rows_cases())
def test_the_rows_schedule(config, tiles, dtype, rows, scalar_a, h0, reverse, generator):
    """One CTA per row walks its whole tiles in order with the next tile loading: one, an even and an odd
    count of tiles (the two register stages' turns), h0, reversed, a scalar decay and 16-bit inputs."""
    a, x, start = inputs((rows, config.tile * tiles), dtype, generator, scalar_a, h0)
    check(a, x, start, reverse, config=config)


def test_every_rows_candidate_is_tested():
    assert {c for c, *_ in _rows_cases()} == {c for c in candidates() if c.lookback == "rows"}


def test_launches_share_the_map_workspace_without_clearing_it(generator):
    """Recurrences keep their states in the pair layout's workspace (two tagged 8-byte words per tile), shared
    by every launch on the stream and never cleared: a large launch, small ones, then large ones again, under
    both schedules, each against the float64 recurrence."""
    from cute_kernels.ops.scan import lookback

    key = (0, torch.cuda.current_stream().cuda_stream, "pair")
    shapes = [(1, 3_000_017), (1, 1), (4, 4097), (1, 3_000_017), (3, 70_001), (1, 3_000_017)]
    buffers = []
    for step, shape in enumerate(shapes):
        a, x, h0 = inputs(shape, torch.float32, generator, h0=shape[0] > 1)
        check(a, x, h0, config=ScanConfig(384, 24, True, "early" if step % 2 else "inline"))
        buffers.append(lookback._workspaces[key].buffer)
    assert all(b is buffers[0] for b in buffers)


EARLY = [ScanConfig(128, 8, True, "early"), ScanConfig(384, 24, True, "early"), ScanConfig(256, 32, True, "early")]


@pytest.mark.parametrize("config", EARLY, ids=lambda c: f"{c.threads}x{c.items_per_thread}")
@pytest.mark.parametrize("dtype, shape, scalar_a, with_h0", [
    (torch.float32, (1, 1_000_003), False, False), (torch.float32, (1, 1_000_003), False, True),
    (torch.float32, (7, 40_961), True, True), (torch.bfloat16, (5, 30_000), False, True),
    (torch.float16, (3000, 37), False, True)])
@pytest.mark.parametrize("reverse", [False, True])
def test_the_early_aggregate(config, dtype, shape, scalar_a, with_h0, reverse, generator):
    """The early schedule composes each lane's consecutive maps from the staged tile: flat and batched rows,
    rows starting inside lanes' blocks, h0 (a single row's too: its first tile's aggregate must hold a_0 h0,
    or every later tile misses A_t h0), reversed, a scalar decay and 16-bit inputs."""
    a, x, h0 = inputs(shape, dtype, generator, scalar_a, h0=with_h0)
    check(a, x, h0, reverse, config=config)


def test_a_one_is_cumsum_and_a_zero_is_x(generator):
    x = torch.randn(3, 5000, device="cuda", generator=generator)
    assert oracle.compare(ck.linear_scan(1.0, x), torch.cumsum(x.double(), -1), torch.cumsum(x, -1))
    assert torch.equal(ck.linear_scan(0.0, x), x)
    assert torch.equal(ck.linear_scan(torch.zeros_like(x), x), x)


def test_gae_reversed_with_a_broadcast_decay(generator):
    """Generalised advantage estimation: A_t = delta_t + gamma*lambda*A_{t+1}, a decay per row."""
    delta = torch.randn(8, 1000, device="cuda", generator=generator)
    decay = torch.full((8, 1), 0.95 * 0.99, device="cuda")
    got = ck.linear_scan(decay, delta, reverse=True)
    expected = torch.empty(8, 1000, dtype=torch.float64, device="cuda")
    acc = torch.zeros(8, dtype=torch.float64, device="cuda")
    for t in reversed(range(1000)):
        acc = delta[:, t].double() + 0.95 * 0.99 * acc
        expected[:, t] = acc
    assert oracle.compare(got, expected)


COLUMNS = registry.get("linear_scan", "columns")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape, dim", [((500, 6), 0), ((3, 1000, 40), 1), ((2, 4097, 3, 8), 1), ((7000, 256), 0),
                                        ((5, 33, 130), 1), ((20000, 4), 0)])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("scalar_a, with_h0", [(False, False), (True, False), (False, True)])
def test_a_strided_dim_runs_in_place(dtype, shape, dim, reverse, scalar_a, with_h0, generator):
    """A strided dim on the columns entry, x's columns read as they lie: against float64 through the entry's
    oracle, out poisoned; long columns cut into chunks (the ordered reduce and chunk prefix), inner that no
    16-byte vector divides (narrower vectors), h0 of the other dims, a scalar decay, both directions. A repeat
    gives the same bits (every combination in a fixed order)."""
    import math

    x = torch.randn(shape, device="cuda", generator=generator).to(dtype)
    a = 0.9 if scalar_a else (0.5 + 0.5 * torch.rand(shape, device="cuda", generator=generator)).to(dtype)
    rest = shape[:dim] + shape[dim + 1:]
    h0 = torch.randn(rest, device="cuda", generator=generator) if with_h0 else None
    out = oracle.poisoned_like(torch.empty_like(x))
    assert ck.linear_scan(a, x, dim=dim, reverse=reverse, h0=h0, out=out) is out
    outer, length, inner = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])
    problem = LinearScanProblem(outer, length, dtype, reverse, scalar_a, with_h0, inner=inner)
    flat = {"a": a if scalar_a else a.reshape(outer, length, inner), "x": x.reshape(outer, length, inner)}
    if with_h0:
        flat["h0"] = h0.reshape(outer, inner)
    verdict = COLUMNS.verify(problem, flat, out.reshape(outer, length, inner), COLUMNS.baseline(problem, flat))
    assert verdict, verdict.detail
    assert torch.equal(ck.linear_scan(a, x, dim=dim, reverse=reverse, h0=h0), out)


def test_misaligned_inputs(generator):
    base = torch.randn(4097 + 1, device="cuda", generator=generator)
    a_base = 0.5 + 0.5 * torch.rand(4097 + 1, device="cuda", generator=generator)
    check(a_base[1:], base[1:])
    check(a_base[1:], base[1:], reverse=True)


def test_misaligned_rows_take_the_rows_schedule_in_single_elements(generator):
    base = torch.randn(64 * 4096 + 1, device="cuda", generator=generator)
    a_base = 0.5 + 0.5 * torch.rand(64 * 4096 + 1, device="cuda", generator=generator)
    h0 = torch.randn(64, device="cuda", generator=generator)
    a, x = a_base[1:].view(64, 4096), base[1:].view(64, 4096)
    problem = LinearScanProblem(64, 4096, h0=True, vector=1)
    assert problem.vector_width == 1 and SPEC.default_config(problem).lookback == "rows"
    check(a, x, h0)
    check(a, x, h0, reverse=True)


def test_bad_input_writes_nothing():
    x = torch.randn(10, 20, device="cuda")
    out = torch.full_like(x, float("nan"))
    with pytest.raises(ValueError, match=r"^a: shape \(3,\) does not broadcast"):
        ck.linear_scan(torch.ones(3, device="cuda"), x, out=out)
    with pytest.raises(ValueError, match=r"^h0: expected a shape that broadcasts to \(10,\)"):
        ck.linear_scan(0.5, x, h0=torch.zeros(20, device="cuda"), out=out)
    with pytest.raises(TypeError, match=r"^x: expected dtype in"):
        ck.linear_scan(0.5, x.double())
    with pytest.raises(TypeError, match=r"^a: expected a tensor or a Python number"):
        ck.linear_scan("0.5", x)
    base = torch.randn(201, device="cuda")
    with pytest.raises(ValueError, match=r"^out: "):  # overlapping x, not x itself (which runs in place)
        ck.linear_scan(0.5, base[:200].view(10, 20), out=base[1:].view(10, 20))
    assert torch.isnan(out).all()


def test_empty_and_zero_dim():
    assert ck.linear_scan(0.5, torch.empty(0, 5, device="cuda")).shape == (0, 5)
    x = torch.tensor(3.0, device="cuda")
    assert ck.linear_scan(0.5, x, h0=torch.tensor(2.0, device="cuda")).item() == pytest.approx(4.0)


# ---- Gradients -------------------------------------------------------------------------------------------


def _grads(a, x, h0, dim, reverse, grad, dtype, create_graph=False, only_a=False):
    """The gradients of the recurrence by autograd through the doubling scan (torch ops) in ``dtype``, for
    the tensors among a, x, h0 (or a alone): the float64 reference, or torch's answer in the input's
    precision; with the leaves they were taken for."""
    leaves = [t.detach().to(dtype).requires_grad_() if isinstance(t, torch.Tensor) else t for t in (a, x, h0)]
    a_w, x_w, h0_w = leaves
    rest = tuple(s for i, s in enumerate(x.shape) if i != dim % x.dim())
    a_full = a_w.expand(x.shape) if isinstance(a_w, torch.Tensor) else torch.full_like(x_w, a_w)
    y = affine_scan(a_full.movedim(dim, -1), x_w.movedim(dim, -1), None if h0_w is None else h0_w.expand(rest),
                    reverse).movedim(-1, dim)
    wanted = [t for t in leaves if isinstance(t, torch.Tensor)]
    return torch.autograd.grad(y, wanted[:1] if only_a else wanted, grad.to(dtype), create_graph=create_graph), wanted


GRADIENT_CASES = [
    ((64, 1000), torch.float32, (64, 1000), (64,), -1, False),
    ((64, 1000), torch.float32, (64, 1000), (64,), -1, True),
    ((300, 6), torch.float32, (6,), (6,), 0, False),  # one decay per column along dim 0, h0 per column
    ((300, 6), torch.float32, (300, 6), (1,), 0, True),  # h0 broadcast to every column
    ((8, 5000), torch.bfloat16, None, (8,), -1, True),  # a number: GAE's gamma * lambda
    ((3, 4, 700), torch.float16, (3, 4, 700), None, 1, False),
    ((16, 1), torch.float32, (16, 1), (16,), -1, False),  # one step
    ((64, 2048), torch.float32, (64, 2048), (64,), -1, True),  # the rows schedule, forward and backward
]


@pytest.mark.parametrize("shape, dtype, a_shape, h0_shape, dim, reverse", GRADIENT_CASES)
def test_gradients_match_the_float64_recurrence(shape, dtype, a_shape, h0_shape, dim, reverse, generator):
    x = torch.randn(shape, device="cuda", generator=generator).to(dtype).requires_grad_()
    a = 0.95 * 0.99 if a_shape is None else (
        0.5 + 0.5 * torch.rand(a_shape, device="cuda", generator=generator)).to(dtype).requires_grad_()
    h0 = None if h0_shape is None else torch.randn(h0_shape, device="cuda", generator=generator).requires_grad_()
    grad = torch.randn(shape, device="cuda", generator=generator).to(dtype)
    wanted = [t for t in (a, x, h0) if isinstance(t, torch.Tensor)]
    ours = torch.autograd.grad(ck.linear_scan(a, x, dim=dim, reverse=reverse, h0=h0), wanted, grad)
    ref, _ = _grads(a, x, h0, dim, reverse, grad, torch.float64)
    theirs, _ = _grads(a, x, h0, dim, reverse, grad, dtype)
    for name, mine, exact, same, leaf in zip("axh", ours, ref, theirs, wanted):
        assert mine.dtype == leaf.dtype and mine.shape == leaf.shape, name
        verdict = oracle.compare(mine.float(), exact, same.float())
        assert verdict, (name, verdict.detail)


def test_double_backward_matches_the_float64_recurrence(generator):
    """create_graph: the backward is itself linear scans and torch ops on the saved output, so a gradient of
    the gradient (as a Hessian-vector product needs) reaches a, x and h0."""
    x = torch.randn(6, 400, device="cuda", generator=generator).requires_grad_()
    a = (0.5 + 0.5 * torch.rand(6, 400, device="cuda", generator=generator)).requires_grad_()
    h0 = torch.randn(6, device="cuda", generator=generator).requires_grad_()
    grad = torch.randn(6, 400, device="cuda", generator=generator)
    (ga,) = torch.autograd.grad(ck.linear_scan(a, x, h0=h0), a, grad, create_graph=True)
    ours = torch.autograd.grad(ga.square().sum(), (a, x, h0))
    results = []
    for dtype in (torch.float64, torch.float32):
        (ga_ref,), leaves = _grads(a, x, h0, -1, False, grad, dtype, create_graph=True, only_a=True)
        results.append(torch.autograd.grad(ga_ref.square().sum(), leaves))
    for name, mine, exact, same in zip("axh", ours, *results):
        verdict = oracle.compare(mine, exact, same)
        assert verdict, (name, verdict.detail)


def test_an_exponential_moving_average_trains():
    """A learnable decay per channel fitted by gradient descent to a target recurrence's decay."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4, 2000, device="cuda", generator=gen)
    target = ck.linear_scan(torch.full((4, 1), 0.9, device="cuda"), x)
    logit = torch.zeros(4, 1, device="cuda", requires_grad=True)
    optimizer = torch.optim.Adam([logit], lr=0.1)
    for _ in range(200):
        optimizer.zero_grad()
        loss = (ck.linear_scan(torch.sigmoid(logit), x) - target).square().mean()
        loss.backward()
        optimizer.step()
    assert torch.allclose(torch.sigmoid(logit).detach(), torch.full((4, 1), 0.9, device="cuda"), atol=2e-3)


def test_a_repeated_call_takes_each_calls_decay_and_tensors(generator):
    """The second call of a structure runs the first one's plan: with its own number, tensors and h0."""
    for decay in (0.5, 0.9, 1):
        x = torch.randn(7, 3000, device="cuda", generator=generator)
        h0 = torch.randn(7, device="cuda", generator=generator)
        expected = affine_scan(torch.full_like(x, decay, dtype=torch.float64), x.double(), h0.double())
        assert oracle.compare(ck.linear_scan(decay, x, h0=h0), expected, affine_scan(torch.full_like(x, decay), x, h0))


@pytest.mark.parametrize("shape", [(5, 20_001), (64, 4096)], ids=["look-back", "rows"])
def test_in_place_over_x(shape, generator):
    x = torch.randn(shape, device="cuda", generator=generator)
    a = 0.5 + 0.5 * torch.rand(shape, device="cuda", generator=generator)
    exact = affine_scan(a.double(), x.double())
    baseline = affine_scan(a, x)
    assert ck.linear_scan(a, x, out=x) is x  # one tile's loads precede its stores; the look-back reads only states
    assert oracle.compare(x, exact, baseline)


def test_the_large_default_tile_is_staged_and_verified(generator):
    from cute_kernels.ops.scan.linear import default_config

    problem = LinearScanProblem(1, 1 << 22)
    assert default_config(problem).staged
    a, x, _ = inputs((1 << 22,), torch.float32, generator)
    check(a, x)
    check(a, x, reverse=True)


def test_a_first_call_on_a_thread_with_no_current_context():
    """A thread that never made a CUDA runtime call has no current context, as autograd's backward thread
    may not: a structure prepared there (occupancy, launch) binds torch's primary context itself."""
    import threading

    x = torch.randn(3, 777, device="cuda")
    decay = torch.full((3, 1), 0.25, device="cuda")
    ck.linear_scan(torch.full((777, 3), 0.25, device="cuda"), x.t().contiguous())  # loads the kernel here
    results = []

    def run():  # the thread's first CUDA work: a new structure of that kernel, prepared before any allocation
        results.append(ck.linear_scan(decay, x, dim=0))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert len(results) == 1
    expected = affine_scan(torch.full((777, 3), 0.25, dtype=torch.float64, device="cuda"), x.t().double()).t()
    assert oracle.compare(results[0], expected)


@pytest.mark.memory_heavy
@pytest.mark.parametrize("reverse", [False, True])
def test_past_int32_indexing(reverse):
    """A decay of 0.5 forgets all but the last ~40 inputs: sampled results past 2^31 against that window
    summed in float64 (x_t = (t mod 7) - 3, so a misplaced element shows)."""
    n = (1 << 31) + 1031
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs a GPU with 40 GB or more")
    x = (torch.arange(n, device="cuda", dtype=torch.int64) % 7 - 3).to(torch.float16)
    h = ck.linear_scan(0.5, x, reverse=reverse)
    for t in (0, 1 << 20, (1 << 31) - 1, 1 << 31, (1 << 31) + 17, n - 41, n - 1):
        k = torch.arange(0, 60, device="cuda")
        src = t + k if reverse else t - k
        valid = (src >= 0) & (src < n)
        terms = torch.where(valid, (src % 7 - 3).double(), torch.zeros((), dtype=torch.float64, device="cuda"))
        expected = (terms * 0.5 ** k.double()).sum()
        assert abs(h[t].double().item() - expected.item()) <= 2e-3 * (1 + abs(expected.item())), t
    del x, h


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape, dim", [((4, 3000), -1), ((3000, 4), 0), ((64, 4096), -1)])
def test_a_float32_decay_tensor_keeps_its_precision_beside_16_bit_x(dtype, shape, dim, generator):
    """A decay of 0.999 (bfloat16: 1.0) or 0.9999 (float16: 1.0) as a float32 tensor: the scan runs on float32
    copies, so the result is the float32 recurrence's, rounded once to x's dtype (the rows schedule's shape
    too)."""
    value = 0.999 if dtype == torch.bfloat16 else 0.9999
    x = torch.rand(shape, device="cuda", generator=generator).to(dtype)
    a = torch.full(shape, value, device="cuda")
    got = ck.linear_scan(a, x, dim=dim)
    exact = affine_scan(a.double().movedim(dim, -1), x.double().movedim(dim, -1)).movedim(-1, dim)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), exact, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("reverse", [False, True])
def test_gradcheck_through_decay_input_and_start(reverse, generator):
    """torch.autograd.gradcheck (float32, finite differences of 1e-2) through a, x and h0, and through x with a
    scalar decay: the backward's reversed recurrence and its sums over a's and h0's broadcast dims."""
    a = (0.5 + 0.4 * torch.rand(3, 20, generator=generator, device="cuda")).requires_grad_()
    x = torch.randn(3, 20, generator=generator, device="cuda").requires_grad_()
    h0 = torch.randn(3, generator=generator, device="cuda").requires_grad_()
    assert torch.autograd.gradcheck(lambda a, x, h0: ck.linear_scan(a, x, h0=h0, reverse=reverse), (a, x, h0),
                                    eps=1e-2, atol=2e-2, rtol=1e-2)
    row = (0.5 + 0.4 * torch.rand(1, 20, generator=generator, device="cuda")).requires_grad_()  # broadcast over rows
    assert torch.autograd.gradcheck(lambda a, x: ck.linear_scan(a, x, reverse=reverse), (row, x),
                                    eps=1e-2, atol=2e-2, rtol=1e-2)
    assert torch.autograd.gradcheck(lambda x: ck.linear_scan(0.8, x, dim=0, reverse=reverse), (x,),
                                    eps=1e-2, atol=2e-2, rtol=1e-2)


def test_a_cpu_scalar_decay_is_its_number_and_differentiable_through_the_public_op():
    """A 0-d CPU tensor decay beside CUDA x: eagerly the number it holds; through ck.linear_scan with a
    gradient recorded, a tensor on x's device whose gradient reaches the CPU scalar (the sum of the
    full decay's), and the same under torch.compile."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(3, 500, device="cuda", generator=gen)
    torch.testing.assert_close(ck.linear_scan(torch.tensor(0.9), x), ck.linear_scan(0.9, x))
    a = torch.tensor(0.9, requires_grad=True)
    xg = x.clone().requires_grad_()
    ck.linear_scan(a, xg).sum().backward()
    full = torch.full_like(x, 0.9, requires_grad=True)
    xf = x.clone().requires_grad_()
    ck.linear_scan(full, xf).sum().backward()
    torch.testing.assert_close(a.grad, full.grad.sum().cpu(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(xg.grad, xf.grad)
    compiled = torch.compile(lambda a, x: ck.linear_scan(a, x), fullgraph=True)
    torch.testing.assert_close(compiled(torch.tensor(0.9), x), ck.linear_scan(0.9, x))
