"""GPU tier: ck.attention numerics against a float64 reference (error at most 2x torch SDPA's in the same
precision plus a small floor; FP32 also within 1e-4), masking, layouts, splits, bad input, streams, graphs."""

import pytest
import torch


import cute_kernels as ck
from cute_kernels import registry
from cute_kernels.ops.attention import attention
from cute_kernels.ops.attention import flash2_mma as flash
from cute_kernels.ops.attention import fused_fp32 as fp32
from cute_kernels.ops.attention import problem as prob
from cute_kernels.ops.attention import spec as aspec
from cute_kernels.runtime import oracle
from test_torch_ops_gpu import _poison_allocator

pytestmark = pytest.mark.gpu

SIZES = [1, 3, 17, 64, 255, 256, 1000, 4097]
HEAD_DIMS = [1, 3, 16, 64, 100, 128, 256]
DTYPES = [d for d, v in prob.DTYPE_VARIANTS.items() if v in registry.variants("attention")]


def torch_same_precision(q, k, v, scale, causal):
    """torch's SDPA in the inputs' precision (any backend that takes the shape), TF32 off."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    with oracle.fp32_matmuls(), sdpa_kernel(backends):
        gqa = {"enable_gqa": True} if q.dim() > 2 and k.shape[-3] != q.shape[-3] else {}
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, **gqa)


def check(q, k, v, scale=None, causal=False, **kwargs):
    out = oracle.poisoned_like(torch.empty(q.shape, dtype=q.dtype, device=q.device))
    got = attention(q, k, v, scale=scale, causal=causal, out=out, **kwargs)
    assert got is out
    ref, mag = aspec.reference_and_scale(q, k, v, scale, causal)
    # 16-bit outputs: a floor of 2 eps (a correct kernel is off by the half ulp of the final rounding); the
    # default 8 eps is 1/16 of the scale in bf16 and would hide errors of a few percent.
    floor = 2 * torch.finfo(q.dtype).eps if q.dtype != torch.float32 else None
    verdict = oracle.compare(out, ref, torch_same_precision(q, k, v, scale, causal), scale=mag, floor=floor)
    assert verdict, verdict.detail
    if q.dtype == torch.float32:
        # An absolute bound as well: 1e-4 of the output's size, or, where the scores are large, what FP32
        # rounding of a score of that size does to exp(s - max): a relative error of about eps * |s| in P.
        s_bound = (scale or q.shape[-1] ** -0.5) * float(q.double().norm(dim=-1).max() * k.double().norm(dim=-1).max())
        v_max = float(v.abs().max()) if v.numel() else 0.0
        bound = max(1e-4 * max(1.0, float(ref.abs().max())), 8 * torch.finfo(torch.float32).eps * s_bound * v_max)
        assert float((out.double() - ref).abs().max()) <= bound
    return out


def randn(shape, dtype, generator, scale=1.0):
    return (torch.randn(shape, device="cuda", generator=generator) * scale).to(dtype)


def test_seed_example():
    q = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0]], device="cuda")
    k = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0]], device="cuda")
    v = torch.tensor([[1.0, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]], device="cuda")
    out = attention(q, k, v)
    expected = torch.tensor([[4.29, 5.29, 6.29, 7.29], [5.0, 6.0, 7.0, 8.0]], device="cuda")
    assert torch.equal(out.round(decimals=2), expected), out


@pytest.mark.parametrize("m", SIZES)
@pytest.mark.parametrize("n", SIZES)
def test_fp32_sizes(m, n, generator):
    check(*(randn((r, 64), torch.float32, generator) for r in (m, n, n)))


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("mn", [(1, 1), (17, 255), (256, 4097), (1000, 64)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_head_dims(d, mn, dtype, generator):
    m, n = mn
    check(*(randn((r, d), dtype, generator) for r in (m, n, n)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mn", [(17, 1000), (1000, 17), (256, 256), (255, 4097), (4097, 3), (1, 64)])
@pytest.mark.parametrize("d", [64, 100, 128])
def test_causal(dtype, mn, d, generator):
    m, n = mn
    check(*(randn((2, 3, r, d), dtype, generator) for r in (m, n, n)), causal=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_heads_and_strided_layout(dtype, generator):
    """(B, S, H, d) storage viewed as (B, H, S, d): row stride H*d, head stride d."""
    b, h, m, n, d = 2, 5, 300, 700, 64
    q = randn((b, m, h, d), dtype, generator).transpose(1, 2)
    k = randn((b, n, h, d), dtype, generator).transpose(1, 2)
    v = randn((b, n, h, d), dtype, generator).transpose(1, 2)
    check(q, k, v)
    check(q, k, v, causal=True)
    check(q, k[..., :, :], v, scale=0.3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [1, 2, 4, 8, 16])  # 16 of 16 heads: multi-query
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_heads(dtype, group, causal, generator):
    """Query head h reads key/value head h // group, with k and v never expanded (the reference expands)."""
    q = randn((2, 16, 257, 64), dtype, generator)
    k, v = (randn((2, 16 // group, 700, 64), dtype, generator) for _ in range(2))
    check(q, k, v, causal=causal)
    check(q, k, v, causal=causal, enable_gqa=True)  # SDPA's flag: accepted, changes nothing


@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_query_layouts_and_key_splits(dtype, generator):
    """3-D (H, S, d) inputs, (B, S, H, d) storage viewed as (B, H, S, d) with fewer kv heads, and few query
    tiles over many keys (fused_fp32 splits the keys: its partials are per query head)."""
    check(randn((8, 129, 128), dtype, generator), randn((2, 300, 128), dtype, generator),
          randn((2, 300, 128), dtype, generator), causal=True)
    q = randn((2, 300, 8, 64), dtype, generator).transpose(1, 2)
    k, v = (randn((2, 500, 2, 64), dtype, generator).transpose(1, 2) for _ in range(2))
    check(q, k, v)
    check(randn((1, 4, 64, 64), dtype, generator), randn((1, 1, 4096, 64), dtype, generator),
          randn((1, 1, 4096, 64), dtype, generator))


@pytest.mark.parametrize("mainloop", flash.FLASH_MAINLOOPS)
def test_every_mainloop_grouped_query(mainloop, generator):
    for dtype in (torch.float16, torch.bfloat16):
        q = randn((1, 12, 333, 128), dtype, generator)
        k, v = (randn((1, 3, 1000, 128), dtype, generator) for _ in range(2))
        for causal in (False, True):
            check(q, k, v, causal=causal, config=mainloop_config(q, k, causal, mainloop))


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_magnitude_scores(dtype, generator):
    """Scores of size ~1e3-1e4: exp without the max subtracted would overflow."""
    q = randn((4, 2, 129, 64), dtype, generator, scale=30.0)
    k = randn((4, 2, 513, 64), dtype, generator, scale=30.0)
    v = randn((4, 2, 513, 64), dtype, generator)
    out = check(q, k, v)
    assert torch.isfinite(out).all()
    check(q, k, v, causal=True)


@pytest.mark.parametrize("config", registry.configs("attention", "fused_fp32"), ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_every_fp32_config(config, causal, generator):
    q, k, v = (randn((2, 2, r, 100), torch.float32, generator) for r in (333, 1000, 1000))
    check(q, k, v, causal=causal, config=config)


# flash2_tf32x3 pinned by its configs (the default takes it only where its grid fills the GPU): whole and
# partial key tiles, N below one tile, M != N both ways, padded head dims (3 and 100 element-wise, 72 on
# 16-byte copies), causal.
TF32X3_SHAPES = [(333, 1000, 128), (256, 4097, 64), (1000, 17, 128), (1, 64, 64), (129, 256, 32), (300, 700, 72),
                 (255, 130, 100), (64, 65, 3)]


@pytest.mark.parametrize("config", registry.configs("attention", "flash2_tf32x3"), ids=str)
@pytest.mark.parametrize("mnd", TF32X3_SHAPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_every_tf32x3_config(config, mnd, causal, generator):
    m, n, d = mnd
    q, k, v = (randn((1, 2, r, d), torch.float32, generator) for r in (m, n, n))
    check(q, k, v, causal=causal, config=config)


def test_tf32x3_scales_layouts_grouped_heads_windows_and_lse(generator):
    """Scales negative, zero and large; (B, S, H, d) storage with grouped heads; windows and sinks; the
    log-sum-exp: each through flash2_tf32x3 by name."""
    q = randn((2, 300, 8, 64), torch.float32, generator).transpose(1, 2)
    k, v = (randn((2, 500, 2, 64), torch.float32, generator).transpose(1, 2) for _ in range(2))
    for scale in (-0.3, 0.0, 2.0):
        check(q, k, v, scale=scale, variant="flash2_tf32x3")
    check(q, k, v, causal=True, variant="flash2_tf32x3")
    big = randn((1, 4, 700, 128), torch.float32, generator, scale=4.0)
    check(big, big, randn((1, 4, 700, 128), torch.float32, generator), variant="flash2_tf32x3")  # scores ~ 180
    check_window(q, k, v, causal=True, window=(100, 0), num_sinks=3, variant="flash2_tf32x3")
    check_window(q, k, v, window=(10, 10), variant="flash2_tf32x3")
    check_lse(q, k, v, True, (100, 0), 3, variant="flash2_tf32x3")
    check_lse(q, k, v, scale=-0.2, variant="flash2_tf32x3")


# Every (config, head dim) pair that supports() accepts on the ragged shape; the pairs it refuses (register
# budget) are not test cases at all, rather than skips.
FLASH_CASES = [(config, d) for d in (64, 128) for config in registry.configs("attention", "flash2_mma")
               if flash.flash_why_unsupported(config, prob.AttentionProblem(2, 2, 333, 1000, d, torch.float16, False))
               is None]


@pytest.mark.parametrize("config,d", FLASH_CASES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_every_flash_config(config, d, causal, generator):
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = (randn((2, 2, r, d), dtype, generator) for r in (333, 1000, 1000))
        check(q, k, v, causal=causal, config=config)


def mainloop_config(q, k, causal, mainloop):
    """The default config's tile with ``mainloop``, or, where supports() refuses that tile for the loop, the
    largest tile it accepts: what a user asking for that loop on this problem would run."""
    import dataclasses

    d = q.shape[-1]
    problem = prob.AttentionProblem(q.shape[0] if q.dim() == 4 else 1, q.shape[1] if q.dim() == 4 else 1, q.shape[-2],
                                    k.shape[-2], d, q.dtype, causal, vector=prob._vector_width(q.dtype, d, (q, k)))
    config = dataclasses.replace(flash.flash_default_config(problem), mainloop=mainloop)
    if flash.flash_why_unsupported(config, problem) is None:
        return config
    fitting = [c for c in flash.flash_candidates()
               if c.mainloop == mainloop and flash.flash_why_unsupported(c, problem) is None]
    return max(fitting, key=lambda c: (c.block_m * c.block_n, c.block_m, -c.warps))


# Every key loop (classic too, for parity) on what the lean loops change: whole and partial key tiles (N a
# multiple of 64 or 128 and not, N below one tile), copies with padded columns (d=72 on 16-byte copies, d=3
# and d=100 element-wise), M != N both ways, causal, strided rows, and the scale: negative (Q negated in
# shared memory), zero (uniform weights; masked tiles must stay NaN-free) and large.
LOOP_SHAPES = [(333, 1000, 128), (4096, 4096, 128), (256, 4097, 128), (1000, 17, 128), (1, 64, 64), (129, 256, 64),
               (300, 700, 72), (255, 130, 100), (64, 65, 3)]


@pytest.mark.parametrize("mainloop", flash.FLASH_MAINLOOPS)
@pytest.mark.parametrize("mnd", LOOP_SHAPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_every_mainloop_shapes(mainloop, mnd, causal, generator):
    m, n, d = mnd
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = (randn((1, 2, r, d), dtype, generator) for r in (m, n, n))
        check(q, k, v, causal=causal, config=mainloop_config(q, k, causal, mainloop))


@pytest.mark.parametrize("mainloop", flash.FLASH_MAINLOOPS)
@pytest.mark.parametrize("scale", [-0.09, -1.5, 0.0, 0.5])
@pytest.mark.parametrize("d", [64, 128])
def test_every_mainloop_scales(mainloop, scale, d, generator):
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = (randn((2, 2, r, d), dtype, generator) for r in (300, 1000, 1000))
        for causal in (False, True):
            check(q, k, v, scale=scale, causal=causal, config=mainloop_config(q, k, causal, mainloop))


@pytest.mark.parametrize("mainloop", flash.FLASH_MAINLOOPS)
@pytest.mark.parametrize("d", [64, 128])
def test_every_mainloop_growing_maxima(mainloop, d, generator):
    """Scores that rise along the keys, so row maxima grow tile after tile by more than the lean loop's 2^8
    threshold (and, with a small ramp, by less): every rescale path runs in later tiles, not only the first.
    Large random scores on top: maxima that jump and stall."""
    for dtype in (torch.float16, torch.bfloat16):
        for ramp in (0.02, 2.0):
            q = torch.ones((1, 2, 500, d), device="cuda").to(dtype)
            k = (torch.arange(3000, device="cuda", dtype=torch.float32)[:, None] * ramp / d).expand(3000, d)
            k = (k + 0.1 * torch.randn((1, 2, 3000, d), device="cuda", generator=generator)).to(dtype)
            v = randn((1, 2, 3000, d), dtype, generator)
            for causal in (False, True):
                check(q, k, v, scale=1.0, causal=causal, config=mainloop_config(q, k, causal, mainloop))
        q, k, v = (randn((2, 2, r, d), dtype, generator, scale=30.0 if r != 1000 else 1.0) for r in (257, 1000, 1000))
        check(q, k, v, config=mainloop_config(q, k, False, mainloop))


@pytest.mark.parametrize("mainloop", flash.FLASH_MAINLOOPS)
def test_every_mainloop_strided_layout(mainloop, generator):
    """(B, S, H, d) storage viewed as (B, H, S, d): row stride H*d, as the copy pointers must step."""
    b, h, m, n, d = 2, 5, 300, 700, 128
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = (randn((b, r, h, d), dtype, generator).transpose(1, 2) for r in (m, n, n))
        for causal in (False, True):
            check(q, k, v, causal=causal, config=mainloop_config(q, k, causal, mainloop))


@pytest.mark.parametrize("mn", [(512, 256), (4096, 4096), (1000, 4097), (4097, 1000)])
@pytest.mark.parametrize("causal", [False, True])
def test_fp32_standard_sizes_with_key_splits_are_deterministic(mn, causal, generator):
    """The LeetGPU size and S=4096 both split the keys (B=H=1): the in-kernel merge, run after run. Causal
    splits are sized from the causal work, so the short query tiles get splits with no keys at all, which
    must publish weight 0 and still arrive."""
    m, n = mn
    q, k, v = (randn((r, 128), torch.float32, generator) for r in (m, n, n))
    first = check(q, k, v, causal=causal)
    for _ in range(5):
        assert torch.equal(attention(q, k, v, causal=causal), first)


def test_misaligned_rows_take_the_scalar_path(generator):
    base = randn((1, 2 * 200 * 64 + 1), torch.float32, generator)
    q = base[0, 1:1 + 200 * 64].view(200, 64)  # 4-byte aligned only
    k = randn((300, 64), torch.float32, generator)
    check(q, k, k.clone())


def test_empty_and_zero_batch():
    q = torch.empty(0, 16, device="cuda")
    k = torch.randn(5, 16, device="cuda")
    assert attention(q, k, k).shape == (0, 16)
    assert attention(torch.empty(0, 2, 4, 16, device="cuda"), torch.empty(0, 2, 5, 16, device="cuda"),
                        torch.empty(0, 2, 5, 16, device="cuda")).shape == (0, 2, 4, 16)


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_keys_and_no_heads_as_sdpa(dtype, generator):
    """N = 0: every row sees no key, so it is 0 (lse -inf) as SDPA gives, its gradient 0; H = 0: an empty
    result. Neither launches a kernel, and a config that cannot run the call is still refused."""
    q = randn((2, 4, 7, 64), dtype, generator).requires_grad_()
    k = torch.empty(2, 2, 0, 64, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.empty(2, 2, 0, 64, device="cuda", dtype=dtype, requires_grad=True)
    out, lse = ck.attention(q, k, v, return_lse=True)
    expected = torch.nn.functional.scaled_dot_product_attention(q.detach().float().cpu(), k.detach().float().cpu(),
                                                                v.detach().float().cpu(), enable_gqa=True)
    assert torch.equal(out.detach().float().cpu(), expected) and torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse, torch.full((2, 4, 7), float("-inf"), device="cuda"))
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q)) and k.grad.shape == k.shape
    given = torch.full_like(q, float("nan")).detach()
    assert ck.attention(q.detach(), k.detach(), v.detach(), out=given) is given and torch.equal(given, torch.zeros_like(given))
    none = torch.empty(2, 0, 7, 64, device="cuda", dtype=dtype)
    assert ck.attention(none, none, none).shape == (2, 0, 7, 64)
    wrong = ck.Fp32Config() if dtype != torch.float32 else ck.FlashConfig()
    with pytest.raises(TypeError, match="config: expected a"):
        ck.attention(q.detach(), k.detach(), v.detach(), config=wrong)
    with pytest.raises(TypeError, match="config: expected a"):
        ck.attention(none, none, none, config=wrong)


@pytest.mark.parametrize("dtype", DTYPES)
def test_side_stream_and_capture(dtype, generator):
    q, k, v = (randn((1, 2, r, 64), dtype, generator) for r in (512, 256, 256))
    expected = attention(q, k, v)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = attention(q, k, v)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(out, expected)
    out = torch.empty_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        attention(q, k, v, out=out)  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attention(q, k, v, out=out)
    for _ in range(2):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)


class TestBadInput:
    def _qkv(self, dtype=torch.float32):
        return (torch.randn(2, 3, 8, 16, device="cuda", dtype=dtype), torch.randn(2, 3, 9, 16, device="cuda", dtype=dtype),
                torch.randn(2, 3, 9, 16, device="cuda", dtype=dtype))

    @pytest.mark.parametrize("case", ["d", "v_d", "dtype", "device", "batch", "gqa", "kv_heads", "rows",
                                      "stride", "dims",
                                      "big_d", "dtype_all", "scale", "causal", "window_left", "window_right",
                                      "sinks", "sinks_windowed"])
    def test_errors_write_nothing(self, case):
        q, k, v = self._qkv()
        exc, msg = ValueError, None
        if case == "d":
            k, msg = k[..., :8], "k: expected head dim 16"
        elif case == "v_d":
            v, msg = v[..., :8], "v: expected head dim 16"
        elif case == "dtype":
            k, exc, msg = k.double(), TypeError, "k: expected dtype"
        elif case == "device":
            v, msg = v.cpu(), "v: expected a CUDA tensor"
        elif case == "batch":
            k, msg = k[:1], "k: expected batch 2"
        elif case == "gqa":
            k, v, msg = k[:, :2], v[:, :2], "k: expected a number of heads that divides q's 3"
        elif case == "kv_heads":
            v, msg = v[:, :1], "v: expected batch/head dims"
        elif case == "rows":
            v, msg = v[:, :, :5], "v: expected 9 rows"
        elif case == "stride":
            k, msg = torch.randn(2, 3, 9, 32, device="cuda")[..., ::2], "k: expected stride 1"
        elif case == "dims":
            q, msg = q[0], "k: expected 3-D|q: expected a 2-D"
        elif case == "big_d":
            q, k, v = (torch.randn(4, 300, device="cuda") for _ in range(3))
            msg = "head dim d in 1..256"
        elif case == "dtype_all":
            q, k, v = (t.to(torch.int32) for t in (q, k, v))
            exc, msg = TypeError, "q: expected dtype in"
        elif case == "scale":
            msg = "scale: expected a finite"
        elif case == "causal":
            exc, msg = TypeError, "causal: expected a bool"
        elif case.startswith("window") or case.startswith("sinks"):
            msg = "window" if case.startswith("window") else "num_sinks"
        out = torch.full(q.shape, 7.0, device="cuda", dtype=q.dtype if q.dtype.is_floating_point else torch.float32)
        before = out.clone()
        kwargs = {"scale": {"scale": float("inf")}, "causal": {"causal": 1}, "window_left": {"window": (-1, 0)},
                  "window_right": {"window": (0, -3)}, "sinks": {"num_sinks": -1},
                  "sinks_windowed": {"window": (4, 0), "num_sinks": -2}}.get(case, {})
        with pytest.raises(exc, match=msg):
            attention(q, k, v, out=out, **kwargs)
        assert torch.equal(out, before)

    def test_bad_out(self):
        q, k, v = self._qkv()
        for out, exc, msg in [
            (torch.full((2, 3, 9, 16), 7.0, device="cuda"), ValueError, "out: expected shape"),
            (torch.full((2, 3, 8, 16), 7.0, device="cuda", dtype=torch.float64), TypeError, "out: expected dtype"),
            (torch.full((2, 3, 16, 8), 7.0, device="cuda").transpose(-1, -2), ValueError, "out: expected a contiguous"),
        ]:
            before = out.clone()
            with pytest.raises(exc, match=msg):
                attention(q, k, v, out=out)
            assert torch.equal(out, before)
        with pytest.raises(ValueError, match="out: overlaps the memory of q"):
            attention(q, k, v, out=q)

    def test_bad_config(self):
        q, k, v = self._qkv()
        with pytest.raises(ValueError, match="config: .*registers"):
            attention(q[..., :1].expand(2, 3, 8, 200).contiguous(), k[..., :1].expand(2, 3, 9, 200).contiguous(),
                         v[..., :1].expand(2, 3, 9, 200).contiguous(), config=fp32.Fp32Config(64, 32, 4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_output_is_p_when_v_is_identity(dtype, causal, generator):
    """With V = I (N <= d), the output is the softmax matrix P itself: any permutation of keys inside a
    fragment, or a row/column slip, shows up element by element."""
    n, d = 48, 64
    q = randn((1, 3, n, d), dtype, generator)
    k = randn((1, 3, n, d), dtype, generator)
    v = torch.eye(n, d, device="cuda").to(dtype).expand(1, 3, n, d).contiguous()
    out = check(q, k, v, causal=causal)
    scale = 1.0 / d ** 0.5
    scores = (q.double() @ k.double().transpose(-1, -2)) * scale
    if causal:
        scores = scores.masked_fill(torch.ones(n, n, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
    p = torch.softmax(scores, dim=-1)
    tolerance = 4 * torch.finfo(dtype).eps
    assert float((out.double()[..., :n] - p).abs().max()) <= tolerance


# ---- windows and sinks ------------------------------------------------------------------------------------


def torch_masked_same_precision(q, k, v, causal, window, num_sinks, scale):
    """torch's SDPA in the inputs' precision with the call's boolean mask (its empty rows, NaN, read as 0),
    heads expanded, TF32 off."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mask = aspec.attention_mask(q.shape[-2], k.shape[-2], q.device, causal, window, num_sinks)
    with oracle.fp32_matmuls(), sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        if q.dim() > 2 and k.shape[-3] != q.shape[-3]:
            k, v = (t.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3) for t in (k, v))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).nan_to_num(0.0)


def check_window(q, k, v, causal=False, window=None, num_sinks=0, scale=None, **kwargs):
    """Against the float64 masked softmax (rows that see no key: 0), allowed twice the error of torch's SDPA
    with the same boolean mask in the inputs' precision (its empty rows, NaN, read as 0)."""
    out = oracle.poisoned_like(torch.empty(q.shape, dtype=q.dtype, device=q.device))
    assert attention(q, k, v, scale=scale, causal=causal, window=window, num_sinks=num_sinks, out=out, **kwargs) is out
    ref, mag = aspec.reference_and_scale(q, k, v, scale, causal, window, num_sinks)
    theirs = torch_masked_same_precision(q, k, v, causal, window, num_sinks, scale)
    floor = 2 * torch.finfo(q.dtype).eps if q.dtype != torch.float32 else None
    verdict = oracle.compare(out, ref, theirs, scale=mag, floor=floor)
    assert verdict, (window, num_sinks, causal, verdict.detail)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window, num_sinks", [((0, 0), 0), ((0, None), 0), ((128, 0), 0), ((16, 16), 0),
                                               ((16, 16), 4), ((3, 0), 40), ((None, 5), 0), ((200, 70), 300)])
@pytest.mark.parametrize("causal", [False, True])
def test_windows_and_sinks(dtype, window, num_sinks, causal, generator):
    """M != N both ways, ragged sizes and head dims; a window's edges and the sinks' in every tile."""
    for (m, n, d) in ((300, 517, 64), (517, 300, 100), (1000, 1000, 128)):
        q = randn((2, 3, m, d), dtype, generator)
        k, v = (randn((2, 3, n, d), dtype, generator) for _ in range(2))
        check_window(q, k, v, causal, window, num_sinks)


@pytest.mark.parametrize("dtype", DTYPES)
def test_window_rows_that_see_no_key_are_zero(dtype, generator):
    q, k, v = randn((700, 64), dtype, generator), randn((100, 64), dtype, generator), randn((100, 64), dtype, generator)
    out = check_window(q, k, v, window=(10, 10))
    assert torch.equal(out[111:], torch.zeros_like(out[111:]))  # row i sees keys i - 10 ..: none from 110 on
    check_window(q, k, v, window=(10, 10), num_sinks=2)  # the sinks give every row a key


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [1, 4, 8])
def test_windows_with_grouped_query_heads_and_layouts(dtype, group, generator):
    q = randn((1, 2000, 8, 128), dtype, generator).transpose(1, 2)
    k, v = (randn((1, 2000, 8 // group, 128), dtype, generator).transpose(1, 2) for _ in range(2))
    check_window(q, k, v, causal=True, window=(256, 0), num_sinks=4)
    check_window(q[0], k[0], v[0], window=(100, 50))  # 3-D


_WINDOW_PROBLEM = prob.AttentionProblem(1, 2, 700, 900, 64, torch.float16, True, window=(130, 7), num_sinks=3)


@pytest.mark.parametrize("config", [c for c in flash.flash_candidates()
                                    if flash.flash_why_unsupported(c, _WINDOW_PROBLEM) is None], ids=str)
def test_every_flash_config_with_a_window(config, generator):
    q = randn((2, 700, 64), torch.float16, generator)
    k, v = (randn((2, 900, 64), torch.float16, generator) for _ in range(2))
    check_window(q, k, v, True, (130, 7), 3, config=config)


@pytest.mark.parametrize("config", fp32.fp32_candidates(), ids=str)
def test_every_fp32_config_with_a_window_and_key_splits(config, generator):
    """Few query tiles over many keys: the key loop's iterations are split across CTAs and merged."""
    q = randn((1, 2, 64, 128), torch.float32, generator)
    k, v = (randn((1, 2, 8192, 128), torch.float32, generator) for _ in range(2))
    check_window(q, k, v, False, (None, 3000), 7, config=config)
    check_window(q, k, v, False, (0, 100), 0, config=config)  # splits past a tile's last key: empty


# ---- return_lse -------------------------------------------------------------------------------------------


def _reference_lse(q, k, scale, causal, window=None, num_sinks=0):
    """float64 log-sum-exp of each row's scaled, masked scores (-inf for a row that sees no key)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if q.dim() > 2 and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    mask = aspec.attention_mask(q.shape[-2], k.shape[-2], q.device, causal, window, num_sinks)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.logsumexp(s, dim=-1)


def check_lse(q, k, v, causal=False, window=None, num_sinks=0, scale=None, **kwargs):
    """The output and lse of return_lse=True against float64, the output allowed twice the error of torch's
    SDPA with the call's mask; both come from memory reading NaN, so an element left unwritten shows."""
    _poison_allocator()
    out, lse = attention(q, k, v, scale=scale, causal=causal, window=window, num_sinks=num_sinks, return_lse=True,
                         **kwargs)
    ref = _reference_lse(q, k, scale, causal, window, num_sinks)
    assert lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    assert torch.equal(torch.isinf(lse), torch.isinf(ref))
    finite = torch.isfinite(ref)
    # FP32 scores and sums, and log2 as MUFU.LG2 (about 2^-22): a few 1e-6 of the scores' size.
    torch.testing.assert_close(lse[finite].double(), ref[finite], atol=2e-4, rtol=2e-5)
    plain = attention(q, k, v, scale=scale, causal=causal, window=window, num_sinks=num_sinks, **kwargs)
    ref_out, mag = aspec.reference_and_scale(q, k, v, scale, causal, window, num_sinks)
    theirs = torch_masked_same_precision(q, k, v, causal, window, num_sinks, scale)
    floor = 2 * torch.finfo(q.dtype).eps if q.dtype != torch.float32 else None
    for got in (out, plain):  # the lse kernels' output is as good as the plain ones'
        verdict = oracle.compare(got, ref_out, theirs, scale=mag, floor=floor)
        assert verdict, verdict.detail


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_return_lse(dtype, causal, generator):
    for m, n, d in ((300, 517, 64), (517, 300, 100), (1024, 1024, 128), (33, 70, 256)):
        q = randn((2, 3, m, d), dtype, generator)
        k, v = (randn((2, 3, n, d), dtype, generator) for _ in range(2))
        check_lse(q, k, v, causal)
        check_lse(q, k, v, causal, scale=-0.2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_return_lse_with_windows_grouped_heads_and_key_splits(dtype, generator):
    q = randn((1, 8, 700, 128), dtype, generator)
    k, v = (randn((1, 2, 900, 128), dtype, generator) for _ in range(2))
    check_lse(q, k, v, True, (100, 0), 3)
    q2, k2, v2 = randn((600, 64), dtype, generator), randn((100, 64), dtype, generator), randn((100, 64), dtype, generator)
    check_lse(q2, k2, v2, False, (10, 10))  # rows from 111 on see no key: lse -inf
    check_lse(randn((1, 2, 64, 128), dtype, generator), randn((1, 2, 8192, 128), dtype, generator),
              randn((1, 2, 8192, 128), dtype, generator))  # fused_fp32 splits the keys: the merge writes lse


def test_return_lse_under_torch_compile(generator):
    from cute_kernels import attention as ck_attention  # the public op (torch_ops): compile-aware

    q, k, v = (randn((2, 4, 128, 64), torch.float16, generator) for _ in range(3))

    @torch.compile(fullgraph=True)
    def f(q, k, v):
        out, lse = ck_attention(q, k, v, causal=True, return_lse=True)
        return out * 2, lse + 1

    out, lse = f(q, k, v)
    eager_out, eager_lse = ck_attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(out, eager_out * 2) and torch.equal(lse, eager_lse + 1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_return_lse_keeps_a_nan_row_nan(dtype, generator):
    """A NaN score makes the row's sum NaN: its lse and output are NaN (not -inf and 0, "saw no key"), with
    fused_fp32's key splits too (a split's NaN partial is not dropped by the merge)."""
    q = randn((1, 2, 64, 128), dtype, generator)
    k, v = (randn((1, 2, 8192, 128), dtype, generator) for _ in range(2))
    q[0, 1, 5, 3] = float("nan")
    out, lse = attention(q, k, v, return_lse=True)
    assert torch.isnan(lse[0, 1, 5]) and torch.isnan(out[0, 1, 5]).all()
    assert torch.isfinite(lse[0, 0]).all() and torch.isfinite(lse[0, 1, :5]).all()
