"""The custom ops on the GPU: torch.library.opcheck, torch.compile(fullgraph=True) against eager, CUDA graph
capture and replay against eager, for every public op."""

import pytest
import torch

import cute_kernels as ck

pytestmark = pytest.mark.gpu


def cases():
    """(name, function of the inputs, inputs maker): small ragged problems of every op."""
    def randn(*shape, dtype=torch.float32):
        return torch.randn(shape, device="cuda", dtype=dtype)

    return [
        ("sgemm", lambda a, b, c: ck.sgemm(a, b, c, alpha=1.5, beta=-0.5), lambda: (randn(67, 33), randn(33, 45), randn(67, 45))),
        ("hgemm_f16", lambda a, b: ck.hgemm(a, b), lambda: (randn(130, 72, dtype=torch.float16), randn(72, 56, dtype=torch.float16))),
        ("hgemm_bf16", lambda a, b, c: ck.hgemm(a, b, c, alpha=0.5, beta=2.0),
         lambda: tuple(randn(*s, dtype=torch.bfloat16) for s in ((65, 40), (40, 24), (65, 24)))),
        ("attention_f16_causal", lambda q, k, v: ck.attention(q, k, v, causal=True),
         lambda: tuple(randn(2, 3, n, 64, dtype=torch.float16) for n in (77, 77, 77))),
        ("attention_f32", lambda q, k, v: ck.attention(q, k, v, scale=0.3), lambda: (randn(50, 40), randn(70, 40), randn(70, 40))),
        ("conv3d", lambda vol, ker: ck.conv3d(vol, ker), lambda: (randn(2, 9, 10, 13), randn(3, 2, 5))),
        # One tile (5000 < the default 8192 elements): the float scan is bitwise repeatable only then.
        ("scan_f32", lambda x: ck.scan(x), lambda: (randn(5, 1000),)),
        ("scan_i32_exclusive", lambda x: ck.scan(x, exclusive=True),
         lambda: (torch.randint(-100, 100, (4097,), device="cuda", dtype=torch.int32),)),
        # Rows of one tile each (bitwise repeatable, as the scan's), decays in (0.5, 0.9).
        ("linear_scan", lambda a, x, h0: ck.linear_scan(a, x, h0=h0, reverse=True),
         lambda: (0.5 + 0.4 * torch.rand(4, 300, device="cuda"), randn(4, 300), randn(4))),
        ("linear_scan_scalar_bf16", lambda x: ck.linear_scan(0.9, x), lambda: (randn(3, 500, dtype=torch.bfloat16),)),
    ]


CASES = cases()
IDS = [c[0] for c in CASES]


def _poison_allocator() -> None:
    """Fill the memory torch's caching allocator hands out next with 0xFF bytes (NaN in every float dtype),
    so an output element a kernel leaves unwritten reads NaN, not whatever an earlier call left there: the
    tests below compare two of our own paths, and stale memory holding the right answer would hide a
    missed write in both."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    # Small-pool segments (requests under 1 MB) and large-pool blocks, released to the cache at once.
    blocks = [torch.full((512 << 10,), 255, dtype=torch.uint8, device="cuda") for _ in range(16)]
    blocks += [torch.full((64 << 20,), 255, dtype=torch.uint8, device="cuda") for _ in range(2)]
    torch.cuda.synchronize()
    del blocks


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_compile_fullgraph_matches_eager(case):
    torch.manual_seed(0)
    _, fn, make = case
    inputs = make()
    _poison_allocator()
    expected = fn(*inputs)

    def model(*xs):
        return fn(*xs) * 2 + 1  # torch ops around the custom op: the graph must not break between them

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    compiled(*inputs)  # the first call compiles; the checked one below runs on poisoned memory
    _poison_allocator()
    got = compiled(*inputs)
    torch.testing.assert_close(got, expected * 2 + 1, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["sgemm", "hgemm", "attention", "conv3d", "scan", "linear_scan"])
def test_opcheck(name):
    torch.manual_seed(0)
    f16 = torch.float16
    args = {
        "sgemm": lambda: (torch.randn(9, 7, device="cuda"), torch.randn(7, 5, device="cuda"), None, 1.0, 0.0),
        "hgemm": lambda: (torch.randn(16, 8, device="cuda", dtype=f16), torch.randn(8, 24, device="cuda", dtype=f16),
                          torch.randn(16, 24, device="cuda", dtype=f16), 1.0, 1.0),
        "attention": lambda: (*(torch.randn(1, 2, 19, 64, device="cuda", dtype=f16) for _ in range(3)), None, False),
        "conv3d": lambda: (torch.randn(6, 7, 8, device="cuda"), torch.randn(2, 3, 3, device="cuda")),
        "scan": lambda: (torch.randn(3, 100, device="cuda"), False),
        "linear_scan": lambda: (0.5 + 0.4 * torch.rand(3, 100, device="cuda"), torch.randn(3, 100, device="cuda")),
    }[name]()
    torch.library.opcheck(getattr(torch.ops.cute_kernels, name).default, args)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cuda_graph_replay_matches_eager(case):
    torch.manual_seed(0)
    _, fn, make = case
    inputs = make()
    expected = fn(*inputs)  # the warm-up: compiles and loads everything the capture will use
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn(*inputs)
    for x in inputs:  # new values in the same buffers: the replay must read them
        x.copy_(torch.flip(x, dims=(-1,)))
    _poison_allocator()
    expected = fn(*inputs)
    if captured.dtype.is_floating_point:  # the replay must write every element of the graph's output
        captured.fill_(float("nan"))
    else:
        captured.fill_(torch.iinfo(captured.dtype).min + 7)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, expected, rtol=0, atol=0)


def _hopper_case():
    from cute_kernels.ops.gemm.hgemm_sm90_config import HgemmSm90Config

    config = HgemmSm90Config(tile_m=64, tile_n=128, consumer_warpgroups=1, num_stages=6)
    return ("hgemm_sm90", lambda a, b: ck.hgemm(a, b, config=config),
            lambda: tuple(torch.randn(s, device="cuda", dtype=torch.float16) for s in ((200, 136), (136, 264))))


@pytest.mark.parametrize("case", CASES + [_hopper_case()], ids=IDS + ["hgemm_sm90"])
def test_runs_on_the_callers_stream(case):
    """Every launch goes to torch's current stream: on a side stream that sleeps ~25 ms and only then writes
    the inputs, a kernel launched on any other stream would run first and read zeros."""
    name, fn, make = case
    if name == "hgemm_sm90" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Hopper HGEMM needs an sm_90 GPU")
    torch.manual_seed(0)
    inputs = make()
    expected = fn(*inputs)
    staged = [torch.zeros_like(x) for x in inputs]
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        for target, source in zip(staged, inputs):
            target.copy_(source)
        got = fn(*staged)
    side.synchronize()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_the_raw_stream_handle_is_torchs_current_stream():
    """NVRTC launches take torch's current stream as a raw handle (runtime.device.current_stream_handle,
    torch's own binding where it has one); it must be the stream a torch.cuda.Stream reports, on the default
    stream, inside a side stream's context and for a device that is not the current one."""
    from cute_kernels.runtime.device import current_stream_handle

    assert current_stream_handle(0) == torch.cuda.current_stream(0).cuda_stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert current_stream_handle(0) == side.cuda_stream
    assert current_stream_handle(0) == torch.cuda.current_stream(0).cuda_stream
    if torch.cuda.device_count() > 1:
        assert current_stream_handle(1) == torch.cuda.current_stream(1).cuda_stream


def _out_call(op: str):
    """(call(out), out) of ``op`` on CUDA tensors, out poisoned."""
    def t(*shape, dtype=torch.float32):
        return torch.randn(shape, device="cuda", dtype=dtype)

    def nan(*shape, dtype=torch.float32):
        return torch.full(shape, float("nan"), device="cuda", dtype=dtype)

    a, b, h = t(64, 64), t(64, 64), t(64, 64, dtype=torch.float16)
    q = t(1, 2, 40, 64, dtype=torch.float16)
    vol, ker, x = t(10, 10, 10), t(3, 3, 3), t(1000)
    return {
        "sgemm": (lambda out: ck.sgemm(a, b, out=out), nan(64, 64)),
        "hgemm": (lambda out: ck.hgemm(h, h, out=out), nan(64, 64, dtype=torch.float16)),
        "attention": (lambda out: ck.attention(q, q, q, out=out), nan(1, 2, 40, 64, dtype=torch.float16)),
        "conv3d": (lambda out: ck.conv3d(vol, ker, out=out), nan(8, 8, 8)),
        "scan": (lambda out: ck.scan(x, out=out), nan(1000)),
    }[op]


@pytest.mark.parametrize("op", ["sgemm", "hgemm", "attention", "conv3d", "scan"])
def test_a_kernel_write_into_out_bumps_its_version_counter(op):
    call, out = _out_call(op)
    before = out._version
    call(out)
    torch.cuda.synchronize()
    assert out._version > before and not torch.isnan(out).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_custom_op_differentiates_like_the_eager_op(dtype):
    q = torch.randn(32, 64, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(32, 64, device="cuda", dtype=dtype)
    grad = torch.randn(32, 64, device="cuda", dtype=dtype)
    grads = [torch.autograd.grad(call(), q, grad)[0]
             for call in (lambda: ck.attention(q, k, k), lambda: torch.ops.cute_kernels.attention(q, k, k))]
    # The custom op without lse recomputes it in its backward (ck.attention keeps the forward's): the same
    # kernels' math, equal up to the forward variants' rounding.
    torch.testing.assert_close(grads[0], grads[1])

def _ops_calls():
    """(name, torch.ops call with the schema's defaults left out, its ck call, inputs maker)."""
    def randn(*shape, dtype=torch.float32):
        return torch.randn(shape, device="cuda", dtype=dtype)

    ops = torch.ops.cute_kernels
    return [
        ("sgemm", ops.sgemm, ck.sgemm, lambda: (randn(67, 33), randn(33, 45))),
        ("hgemm", ops.hgemm, ck.hgemm,
         lambda: (randn(40, 72, dtype=torch.float16), randn(72, 56, dtype=torch.float16))),
        ("attention", ops.attention, ck.attention,
         lambda: tuple(randn(1, 2, 50, 64, dtype=torch.bfloat16) for _ in range(3))),
        ("conv3d", ops.conv3d, ck.conv3d, lambda: (randn(9, 10, 13), randn(3, 2, 5))),
        ("scan", ops.scan, ck.scan, lambda: (randn(5, 1000),)),
        ("linear_scan", ops.linear_scan, ck.linear_scan,
         lambda: (0.5 + 0.4 * torch.rand(4, 300, device="cuda"), randn(4, 300))),
    ]


@pytest.mark.parametrize("case", _ops_calls(), ids=lambda c: c[0])
def test_torch_ops_calls_run_the_eager_op_in_every_grad_mode(case):
    """torch.ops.cute_kernels.* on CUDA tensors take the ops' own kernels (not custom_op's wrappers) on plain
    eager calls: the same result as ck.* with grad on, under no_grad and inference_mode; and a call whose
    inputs need a gradient (schema defaults left out, which the dispatcher drops) is recorded and
    differentiates as the ck call does."""
    _, op, public, make = case
    inputs = make()
    expected = public(*inputs)
    with torch.no_grad():
        no_grad = op(*inputs)
    with torch.inference_mode():
        inference = op(*inputs)
    for result in (op(*inputs), no_grad, inference):
        assert result.grad_fn is None
        torch.testing.assert_close(result, expected, rtol=0, atol=0)
    leaves = [t.detach().requires_grad_() for t in inputs]
    ours = op(*leaves)
    assert ours.grad_fn is not None
    grad = torch.randn_like(ours)
    got = torch.autograd.grad(ours, leaves, grad)
    leaves_ck = [t.detach().requires_grad_() for t in inputs]
    want = torch.autograd.grad(public(*leaves_ck), leaves_ck, grad)
    for g, w in zip(got, want):
        # Equal up to rounding: attention's op without lse recomputes it in the backward (ck's keeps it).
        torch.testing.assert_close(g, w)
