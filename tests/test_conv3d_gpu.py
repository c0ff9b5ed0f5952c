"""GPU tier: ck.conv3d against float64 references (LeetGPU cases, every kernel shape, every candidate tile,
batched, sliced and misaligned volumes, streams and graph capture) and bad input that must write nothing."""

import concurrent.futures
import itertools
import math
import multiprocessing
import os

import pytest
import torch

import cute_kernels as ck
from cute_kernels import registry
from cute_kernels.ops.conv3d.config import Conv3dConfig, candidates, default_config
from cute_kernels.ops.conv3d.direct import SOURCE, name_expression
from cute_kernels.ops.conv3d.op import conv3d
from cute_kernels.ops.conv3d.problem import make_problem
from cute_kernels.ops.conv3d.reference import conv3d_reference, conv3d_scale, torch_conv3d
from cute_kernels.runtime import device, oracle
from cute_kernels.runtime import nvrtc

pytestmark = pytest.mark.gpu

SPEC = registry.get("conv3d")


def check(volume, kernel, **kwargs):
    """Run into a NaN-poisoned output and compare with the float64 reference, allowed twice cuDNN's error."""
    ref = conv3d_reference(volume, kernel)
    out = oracle.poisoned_like(torch.empty(ref.shape, dtype=torch.float32, device=volume.device))
    got = conv3d(volume, kernel, out=out, **kwargs)
    assert got is out
    verdict = oracle.compare(out, ref, torch_conv3d(volume, kernel), scale=conv3d_scale(volume, kernel))
    assert verdict, verdict.detail
    return out


def _compile_one(args):
    name, arch = args
    nvrtc.compile_cubin(SOURCE, [name], arch)


def precompile(names):
    """Fill the NVRTC disk cache for these kernels in parallel (one process per core), so that a test that
    launches hundreds of instantiations spends seconds, not minutes, compiling them one by one."""
    names = sorted(set(names))
    arch = device.arch(torch.cuda.current_device())
    if nvrtc.cache_dir() is None or len(names) < 4:
        return
    context = multiprocessing.get_context("spawn")  # no fork of a process that holds a CUDA context
    with concurrent.futures.ProcessPoolExecutor(min(16, os.cpu_count() or 1), mp_context=context) as pool:
        list(pool.map(_compile_one, [(n, arch) for n in names]))


def cuda(x):
    return torch.tensor(x, dtype=torch.float32, device="cuda")


# ---- LeetGPU's cases (tolerance 1e-5) ---------------------------------------------------------------------


def test_seed_example_all_ones():
    v = cuda([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]])
    out = conv3d(v, torch.ones(2, 2, 2, device="cuda"))
    assert out.shape == (1, 1, 1) and out.item() == 36.0


def test_leetgpu_3x3x3_volume_2x3x3_kernel():
    v = torch.arange(27, dtype=torch.float32, device="cuda").reshape(3, 3, 3)
    k = torch.arange(18, dtype=torch.float32, device="cuda").reshape(2, 3, 3) * 0.5 - 4
    out = conv3d(v, k)
    expected = torch.nn.functional.conv3d(v.double()[None, None], k.double()[None, None])[0, 0]
    assert out.shape == (2, 1, 1)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["unit", "zero", "negative"])
def test_leetgpu_special_kernels(name, generator):
    v = torch.randn(9, 11, 13, device="cuda", generator=generator)
    if name == "unit":
        k = torch.zeros(3, 3, 3, device="cuda")
        k[1, 1, 1] = 1.0
        out = conv3d(v, k)
        assert torch.equal(out, v[1:-1, 1:-1, 1:-1])
    elif name == "zero":
        out = conv3d(v, torch.zeros(2, 3, 4, device="cuda"))
        assert out.shape == (8, 9, 10) and bool((out == 0).all())
    else:
        out = check(-v.abs(), -torch.rand(3, 2, 4, device="cuda", generator=generator))
        assert bool((out > 0).all())


@pytest.mark.parametrize("vshape,kshape", [((10, 10, 10), (3, 4, 5)), ((4, 9, 17), (2, 5, 3)), ((17, 6, 40), (5, 1, 7)),
                                           ((1, 50, 60), (1, 3, 3)), ((30, 1, 30), (4, 1, 2)), ((20, 30, 1), (5, 5, 1))])
def test_leetgpu_rectangular_shapes(vshape, kshape, generator):
    v = torch.randn(vshape, device="cuda", generator=generator)
    k = torch.randn(kshape, device="cuda", generator=generator)
    out = check(v, k)
    torch.testing.assert_close(out.double(), conv3d_reference(v, k), atol=1e-5, rtol=1e-5)


def test_kernel_as_large_as_the_volume(generator):
    for shape in [(7, 7, 7), (3, 5, 7), (1, 1, 1)]:
        v = torch.randn(shape, device="cuda", generator=generator)
        k = torch.randn(shape, device="cuda", generator=generator)
        out = check(v, k)
        assert out.shape == (1, 1, 1)


def test_integer_data_is_exact_for_every_kernel_shape(generator):
    """Small integers sum exactly in FP32: any indexing slip for any of the 343 kernel shapes is a mismatch.
    The volume's sides (13, 35, 141) leave ragged tiles along every axis."""
    v = torch.randint(-3, 4, (13, 35, 141), device="cuda", generator=generator).float()
    out = torch.empty(1, 1, 1, 1, device="cuda")
    precompile([name_expression(default_config(p), p) for p in
                (make_problem(v[None], s, out, False) for s in itertools.product(range(1, 8), repeat=3))])
    for kd, kh, kw in itertools.product(range(1, 8), repeat=3):
        k = torch.randint(-3, 4, (kd, kh, kw), device="cuda", generator=generator).float()
        out = conv3d(v, k)
        ref = conv3d_reference(v, k)
        assert torch.equal(out.double(), ref), (kd, kh, kw)


@pytest.mark.parametrize("kshape", [(5, 5, 5), (3, 3, 3), (7, 7, 7), (1, 7, 2)])
def test_random_data_against_float64(kshape, generator):
    v = torch.randn(37, 70, 133, device="cuda", generator=generator)
    check(v, torch.randn(kshape, device="cuda", generator=generator))


def test_every_candidate_config(generator):
    """Every tile, per-thread block, stage count and run length in the sweep space, on a ragged volume."""
    v = torch.randint(-3, 4, (2, 23, 41, 150), device="cuda", generator=generator).float()
    k = torch.randint(-3, 4, (5, 3, 4), device="cuda", generator=generator).float()
    ref = conv3d_reference(v, k)
    problem = make_problem(v, (5, 3, 4), torch.empty(ref.shape, device="cuda"), True)
    configs = SPEC.supported_candidates(problem)
    assert len(configs) >= len(candidates()) // 2
    precompile([name_expression(c, problem) for c in configs])
    for config in configs:
        out = oracle.poisoned_like(torch.empty(ref.shape, device="cuda"))
        conv3d(v, k, out=out, config=config)
        assert torch.equal(out.double(), ref), config


def test_thread_h_and_run_lengths(generator):
    v = torch.randn(40, 33, 70, device="cuda", generator=generator)
    # KD x thread_h x thread_w accumulators must stay within the 64 supports() allows: a 4x4x3 kernel.
    k = torch.randn(4, 4, 3, device="cuda", generator=generator)
    configs = [Conv3dConfig(16, 64, 2, 4, 1, 2), Conv3dConfig(32, 64, 4, 4, 3, 4), Conv3dConfig(8, 128, 2, 8, 100, 3)]
    for config in configs:
        check(v, k, config=config)


@pytest.mark.parametrize("vshape", [(1, 40, 50), (30, 1, 50), (30, 40, 1), (1, 1, 1), (1, 1, 300)])
def test_volumes_with_a_side_of_one(vshape, generator):
    v = torch.randn(vshape, device="cuda", generator=generator)
    check(v, torch.randn(1, 1, 1, device="cuda", generator=generator))
    kshape = tuple(min(s, 3) for s in vshape)
    check(v, torch.randn(kshape, device="cuda", generator=generator))


@pytest.mark.parametrize("n", [1, 3, 8])
def test_batched(n, generator):
    v = torch.randn(n, 19, 21, 67, device="cuda", generator=generator)
    out = check(v, torch.randn(3, 5, 4, device="cuda", generator=generator))
    assert out.shape == (n, 17, 17, 64)


def test_empty_batch():
    out = conv3d(torch.empty(0, 5, 5, 5, device="cuda"), torch.ones(2, 2, 2, device="cuda"))
    assert out.shape == (0, 4, 4, 4)


def test_empty_batch_checks_config_and_variant():
    """An empty batch launches nothing, but a config or variant that cannot run the call is refused as for a
    full batch."""
    volume = torch.empty(0, 20, 20, 20, device="cuda")
    with pytest.raises(ValueError, match="accumulators"):
        conv3d(volume, torch.ones(5, 3, 3, device="cuda"), config=Conv3dConfig(32, 64, 2, 8, 8, 2))
    with pytest.raises(ValueError, match="1..15"):
        conv3d(volume, torch.ones(16, 3, 3, device="cuda"), variant="direct")


@pytest.mark.parametrize("offset", [1, 2, 3])
def test_misaligned_and_sliced_volumes(offset, generator):
    base = torch.randn(2, 20, 30, 64 + offset, device="cuda", generator=generator)
    check(base[..., offset:], torch.randn(3, 3, 3, device="cuda", generator=generator))  # 4/8-byte aligned
    check(base[1, 2:17, 5:29, offset:offset + 60], torch.randn(4, 5, 2, device="cuda", generator=generator))
    check(base[:, ::2, :, :33], torch.randn(2, 2, 5, device="cuda", generator=generator))  # plane stride skips
    check(base.transpose(2, 3)[0], torch.randn(3, 3, 3, device="cuda", generator=generator))  # W not unit-stride: copied


def test_widths_that_are_not_multiples_of_four(generator):
    for w in (5, 6, 7, 129, 255):
        v = torch.randn(9, 10, w, device="cuda", generator=generator)
        check(v, torch.randn(3, 3, min(w, 5), device="cuda", generator=generator))


def test_misaligned_out(generator):
    v = torch.randn(12, 13, 64, device="cuda", generator=generator)
    k = torch.randn(3, 3, 3, device="cuda", generator=generator)
    storage = torch.full((1 + 10 * 11 * 62,), float("nan"), device="cuda")
    out = storage[1:].view(10, 11, 62)
    conv3d(v, k, out=out)
    assert oracle.compare(out, conv3d_reference(v, k), torch_conv3d(v, k), scale=conv3d_scale(v, k))
    assert storage[0].isnan()


def test_non_contiguous_kernel(generator):
    v = torch.randn(10, 12, 14, device="cuda", generator=generator)
    k = torch.randn(4, 3, 2, device="cuda", generator=generator).permute(2, 1, 0)
    check(v, k)


def test_standard_problem_through_the_spec(generator):
    """The bench's path (spec.launch on spec.make_inputs) on LeetGPU's largest size, verified by spec.verify."""
    problem = SPEC.standard_problems()[1]
    inputs = SPEC.make_inputs(problem, "cuda", generator)
    base = SPEC.baseline(problem, inputs)
    out = oracle.poisoned_like(base)
    SPEC.launch(SPEC.default_config(problem), problem, inputs, out)
    verdict = SPEC.verify(problem, inputs, out, base)
    assert verdict, verdict.detail


def test_side_stream_and_graph_capture(generator):
    v = torch.randn(40, 64, 96, device="cuda", generator=generator)
    k1 = torch.randn(5, 5, 5, device="cuda", generator=generator)
    k2 = torch.randn(5, 5, 5, device="cuda", generator=generator)
    ref1, ref2 = conv3d_reference(v, k1), conv3d_reference(v, k2)
    scale1, scale2 = conv3d_scale(v, k1), conv3d_scale(v, k2)
    base1, base2 = torch_conv3d(v, k1), torch_conv3d(v, k2)
    # Two streams, two kernels at once: weights travel with each launch, nothing module-wide to race for.
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for s in (s1, s2):
        s.wait_stream(torch.cuda.current_stream())
    outs = []
    for _ in range(10):
        with torch.cuda.stream(s1):
            o1 = conv3d(v, k1)
        with torch.cuda.stream(s2):
            o2 = conv3d(v, k2)
        outs.append((o1, o2))
    for s in (s1, s2):
        torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    for o1, o2 in outs:
        assert oracle.compare(o1, ref1, base1, scale=scale1)
        assert oracle.compare(o2, ref2, base2, scale=scale2)
    # Graph capture after a warm-up call; the replay sees the kernel's values at replay time.
    out = torch.empty_like(base1)
    conv3d(v, k1, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        conv3d(v, k1, out=out)
    out.fill_(float("nan"))
    k1.copy_(k2)
    graph.replay()
    torch.cuda.synchronize()
    verdict = oracle.compare(out, ref2, base2, scale=scale2)
    assert verdict, verdict.detail


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device(generator):
    v = torch.randn(10, 20, 30, device="cuda:1")
    k = torch.randn(3, 3, 3, device="cuda:1")
    out = conv3d(v, k)
    assert out.device == v.device
    assert oracle.compare(out, conv3d_reference(v, k), torch_conv3d(v, k), scale=conv3d_scale(v, k))


@pytest.mark.memory_heavy
def test_64_bit_offsets():
    """Three 1024^3 volumes span 3 * 2^30 elements: batch and plane offsets past 2^31 must be 64-bit."""
    if torch.cuda.get_device_properties(0).total_memory < 60 * 2**30:
        pytest.skip("needs a GPU with 60 GB or more (the volumes, output and checks take ~25 GB)")
    v = torch.empty(3, 1024, 1024, 1024, device="cuda")
    v[:, :, :, :] = torch.arange(1024, device="cuda", dtype=torch.float32).remainder(7) - 3
    v[1] *= -1
    v[2] *= 2
    k = torch.ones(2, 1, 3, device="cuda")
    out = conv3d(v, k)
    # Every output plane of item n is the same: 2 * (three consecutive row values), times item n's factor.
    row = v[0, 0, 0].double()
    expected_row = 2 * (row[:-2] + row[1:-1] + row[2:])
    for n, sign in ((0, 1), (1, -1), (2, 2)):
        for plane in (0, 511, 1022):
            assert torch.equal(out[n, plane, ::97].double(), (sign * expected_row).expand(len(range(0, 1024, 97)), -1))
    del v, out


class TestBadInput:
    def test_device_mismatch(self):
        v = torch.randn(5, 5, 5, device="cuda")
        with pytest.raises(ValueError, match="kernel: expected a CUDA tensor"):
            conv3d(v, torch.ones(2, 2, 2))

    def test_errors_write_nothing(self):
        v = torch.randn(6, 7, 8, device="cuda")
        k = torch.randn(2, 3, 4, device="cuda")
        good_shape = (5, 5, 5)
        cases = [
            (torch.full(good_shape, 7.0, device="cuda", dtype=torch.float64), TypeError, "out: expected dtype torch.float32"),
            (torch.full(good_shape, 7.0, device="cuda").transpose(0, 2), ValueError, "out: expected a contiguous"),
            (torch.full(good_shape, 7.0), ValueError, "out: expected a tensor on cuda"),
            (torch.full((5, 5, 6), 7.0, device="cuda"), ValueError, r"out: expected shape \(5, 5, 5\)"),
        ]
        for out, exc, msg in cases:
            before = out.clone()
            with pytest.raises(exc, match=msg):
                conv3d(v, k, out=out)
            assert torch.equal(out, before)
        out = torch.full(good_shape, 7.0, device="cuda")
        for bad_args, exc, msg in [
            ((v, torch.randn(7, 3, 4, device="cuda")), ValueError, "kernel: shape .* is larger than the volume"),
            ((v, torch.randn(2, 3, 4, device="cuda", dtype=torch.float64)), TypeError, "kernel: expected dtype"),
            ((v.half(), k), TypeError, "volume: expected dtype"),
            ((v[None, None], k), ValueError, "volume: expected a"),
        ]:
            with pytest.raises(exc, match=msg):
                conv3d(*bad_args, out=out)
            assert bool((out == 7.0).all())

    def test_out_overlapping_an_input_is_refused(self):
        storage = torch.randn(6 * 7 * 8 + 200, device="cuda")
        v = storage[:336].view(6, 7, 8)
        before = storage.clone()
        with pytest.raises(ValueError, match="out: overlaps the memory of volume"):
            conv3d(v, torch.randn(2, 3, 4, device="cuda"), out=storage[100:225].view(5, 5, 5))
        assert torch.equal(storage, before)

    def test_unsupported_config(self):
        v = torch.randn(9, 9, 9, device="cuda")
        out = torch.full((3, 3, 3), 7.0, device="cuda")
        with pytest.raises(ValueError, match="config: .* accumulators"):
            conv3d(v, torch.randn(7, 7, 7, device="cuda"), out=out, config=Conv3dConfig(32, 128, 2, 8))
        assert bool((out == 7.0).all())


# ---- conv2d and conv1d: images and signals on the same kernels ----------------------------------------------
@pytest.mark.parametrize("shape, kernel_shape", [((64, 80), (3, 3)), ((37, 129), (7, 2)), ((3, 50, 61), (5, 5)),
                                                 ((7, 7), (7, 7)), ((1, 9), (1, 4))])
def test_conv2d_is_conv3d_of_depth_one(shape, kernel_shape):
    image, kernel = torch.randn(shape, device="cuda"), torch.randn(kernel_shape, device="cuda")
    volume, kernel3 = image.unsqueeze(-3), kernel.unsqueeze(0)
    ref = conv3d_reference(volume, kernel3).squeeze(-3)
    out = oracle.poisoned_like(torch.empty(ref.shape, device="cuda"))
    assert ck.conv2d(image, kernel, out=out) is out
    verdict = oracle.compare(out, ref, torch_conv3d(volume, kernel3).squeeze(-3),
                             scale=conv3d_scale(volume, kernel3).squeeze(-3))
    assert verdict, verdict.detail
    torch.testing.assert_close(ck.conv2d(image, kernel), out, rtol=0, atol=0)  # the plan's path, same bits


@pytest.mark.parametrize("rank", [2, 1])
def test_planar_repeat_call_names_its_own_arguments(rank):
    """A repeated call of a seen structure runs conv3d's plan; its overlap error still names the image or
    signal, not the volume."""
    op, name = (ck.conv2d, "image") if rank == 2 else (ck.conv1d, "signal")
    x = torch.randn((16, 20) if rank == 2 else (16 * 20,), device="cuda")
    kernel = torch.ones((3, 3) if rank == 2 else (3,), device="cuda")
    out_shape = (14, 18) if rank == 2 else (318,)
    op(x, kernel, out=torch.empty(out_shape, device="cuda"))  # the structure's plan
    overlapping = x.view(-1)[:math.prod(out_shape)].view(out_shape)  # same layout and alignment, x's memory
    before = x.clone()
    with pytest.raises(ValueError, match=f"out: .*{name}"):
        op(x, kernel, out=overlapping)
    assert torch.equal(x, before)


@pytest.mark.parametrize("shape, taps", [((1000,), 7), ((4, 333), 3), ((7,), 7), ((2, 1), 1)])
def test_conv1d_is_conv3d_of_depth_and_height_one(shape, taps):
    signal, kernel = torch.randn(shape, device="cuda"), torch.randn(taps, device="cuda")
    volume, kernel3 = signal.unsqueeze(-2).unsqueeze(-2), kernel.reshape(1, 1, -1)
    ref = conv3d_reference(volume, kernel3).squeeze(-2).squeeze(-2)
    got = ck.conv1d(signal, kernel)
    verdict = oracle.compare(got, ref, torch_conv3d(volume, kernel3).squeeze(-2).squeeze(-2),
                             scale=conv3d_scale(volume, kernel3).squeeze(-2).squeeze(-2))
    assert verdict, verdict.detail
    assert got.shape == (*shape[:-1], shape[-1] - taps + 1)


# ---- Padding: zeros read as zero-filled copies, never stored ------------------------------------------------


def check_padded(volume, kernel, padding, **kwargs):
    from cute_kernels.ops.conv3d.problem import conv_pads

    pads = conv_pads(padding, tuple(kernel.shape), 3)
    ref = conv3d_reference(volume, kernel, pads)
    out = oracle.poisoned_like(torch.empty(ref.shape, dtype=torch.float32, device=volume.device))
    assert conv3d(volume, kernel, padding=padding, out=out, **kwargs) is out
    verdict = oracle.compare(out, ref, torch_conv3d(volume, kernel, pads), scale=conv3d_scale(volume, kernel, pads))
    assert verdict, (padding, tuple(kernel.shape), verdict.detail)


@pytest.mark.parametrize("kshape", [(1, 1, 1), (2, 2, 2), (3, 3, 3), (4, 5, 6), (7, 7, 7), (7, 1, 2)])
@pytest.mark.parametrize("padding", ["same", 1, 3, (0, 2, 1), (2, 0, 4)])
def test_padding_every_form(kshape, padding, generator):
    check_padded(torch.randn(2, 9, 21, 37, device="cuda", generator=generator),
                 torch.randn(kshape, device="cuda", generator=generator), padding)


@pytest.mark.parametrize("config", [c for c in candidates() if c.depth in (8, 64)][::5])
def test_padding_every_tile(config, generator):
    volume = torch.randn(20, 33, 70, device="cuda", generator=generator)
    kernel = torch.randn(5, 4, 3, device="cuda", generator=generator)
    if SPEC.supports(config, make_problem(volume[None], (5, 4, 3), torch.empty(1, 20, 33, 70, device="cuda"), False,
                                          (2, 2, 1, 2, 1, 1))):
        check_padded(volume, kernel, "same", config=config)


def test_padding_past_a_small_volume_and_misaligned_rows(generator):
    check_padded(torch.randn(2, 2, 2, device="cuda", generator=generator),
                 torch.randn(5, 5, 5, device="cuda", generator=generator), 2)  # every output reads mostly zeros
    base = torch.randn(3 * 17 * 41 + 1, device="cuda", generator=generator)
    check_padded(base[1:].view(3, 17, 41), torch.randn(3, 3, 3, device="cuda", generator=generator), "same")


def test_planar_padding_is_torchs(generator):
    image, kernel = torch.randn(2, 50, 61, device="cuda", generator=generator), torch.randn(4, 5, device="cuda")
    for padding in ("same", 2, (1, 3)):
        got = ck.conv2d(image, kernel, padding=padding)
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            expected = torch.nn.functional.conv2d(image.double()[:, None], kernel.double()[None, None],
                                                  padding=padding)[:, 0]
        assert oracle.compare(got, expected)
    signal, taps = torch.randn(3, 1000, device="cuda", generator=generator), torch.randn(6, device="cuda")
    for padding in ("same", 5):
        expected = torch.nn.functional.conv1d(signal.double()[:, None], taps.double()[None, None], padding=padding)[:, 0]
        assert oracle.compare(ck.conv1d(signal, taps, padding=padding), expected)


# ---- Sides past 7 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kshape", [(1, 15, 15), (9, 9, 9), (1, 1, 15), (3, 11, 8), (8, 1, 1), (15, 15, 15)])
def test_sides_past_seven(kshape, generator):
    volume = torch.randn(20, 41, 70, device="cuda", generator=generator)
    check(volume, torch.randn(kshape, device="cuda", generator=generator))
    check_padded(volume, torch.randn(kshape, device="cuda", generator=generator), "same")


def test_planar_sides_past_seven(generator):
    image, kernel = torch.randn(300, 500, device="cuda", generator=generator), torch.randn(15, 15, device="cuda")
    expected = torch.nn.functional.conv2d(image.double()[None, None], kernel.double()[None, None])[0, 0]
    assert oracle.compare(ck.conv2d(image, kernel), expected)
    signal, taps = torch.randn(2, 10_000, device="cuda", generator=generator), torch.randn(13, device="cuda")
    expected = torch.nn.functional.conv1d(signal.double()[:, None], taps.double()[None, None], padding="same")[:, 0]
    assert oracle.compare(ck.conv1d(signal, taps, padding="same"), expected)



# ---- Gradients ---------------------------------------------------------------------------------------------


def _torch_grads(x, k, pads, grad, dtype):
    """autograd's gradients of the padded correlation in ``dtype`` (float64: the reference; float32 with TF32
    off: torch's answer)."""
    from cute_kernels.ops.conv3d.reference import padded

    xv, kv = x.detach().to(dtype).requires_grad_(), k.detach().to(dtype).requires_grad_()
    rank = k.dim()
    vol, ker = xv, kv
    for _ in range(3 - rank):
        vol, ker = vol.unsqueeze(-rank - 1), ker.unsqueeze(0)
    vol = vol if vol.dim() == 4 else vol.unsqueeze(0)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # the backward's convolutions too
        y = torch.nn.functional.conv3d(padded(vol, pads)[:, None], ker[None, None])[:, 0]
        return torch.autograd.grad(y.reshape(grad.shape), (xv, kv), grad.to(dtype))


@pytest.mark.parametrize("shape, kshape, padding", [
    ((2, 9, 21, 37), (3, 3, 3), "valid"), ((9, 21, 37), (2, 4, 5), "same"), ((2, 6, 10, 12), (3, 1, 2), 4),
    ((40, 61), (5, 5), "same"), ((3, 40, 61), (15, 15), 1), ((2, 1000), (7,), "same"), ((500,), (13,), 0),
    ((8, 9, 10), (5, 5, 5), ((1, 3), (0, 2), (4, 0)))])
def test_gradients_match_the_float64_reference(shape, kshape, padding, generator):
    from cute_kernels.ops.conv3d.problem import conv_pads

    rank = len(kshape)
    op = {3: ck.conv3d, 2: ck.conv2d, 1: ck.conv1d}[rank]
    x = torch.randn(shape, device="cuda", generator=generator, requires_grad=True)
    k = torch.randn(kshape, device="cuda", generator=generator, requires_grad=True)
    y = op(x, k, padding=padding)
    grad = torch.randn(y.shape, device="cuda", generator=generator)
    ours = torch.autograd.grad(y, (x, k), grad)
    pads = conv_pads(padding, kshape, rank)
    exact = _torch_grads(x, k, pads, grad, torch.float64)
    theirs = _torch_grads(x, k, pads, grad, torch.float32)
    for name, mine, ref, same in zip(("input", "kernel"), ours, exact, theirs):
        assert mine.shape == ref.shape, name
        verdict = oracle.compare(mine, ref, same)
        assert verdict, (name, verdict.detail)
    again = torch.autograd.grad(op(x, k, padding=padding), k, grad)[0]
    assert torch.equal(again, ours[1])  # the kernel's gradient adds each CTA's sums in a fixed order


@pytest.mark.parametrize("op, shape, kshape, padding", [
    ("conv1d", (2, 12), (3,), "same"), ("conv2d", (7, 9), (2, 3), 1), ("conv3d", (4, 5, 6), (3, 2, 2), ((1, 0), (0, 2), (1, 1)))])
def test_gradcheck(op, shape, kshape, padding, generator):
    """torch's finite-difference checks of the first and second derivatives. Our kernels compute in FP32, so
    the step is large (the convolution is linear: no truncation error) and the tolerances FP32's."""
    fn = getattr(ck, op)
    x = torch.randn(shape, device="cuda", generator=generator, requires_grad=True)
    k = torch.randn(kshape, device="cuda", generator=generator, requires_grad=True)
    tolerances = dict(eps=1e-2, atol=1e-3, rtol=1e-3)
    assert torch.autograd.gradcheck(lambda x, k: fn(x, k, padding=padding), (x, k), **tolerances)
    assert torch.autograd.gradgradcheck(lambda x, k: fn(x, k, padding=padding), (x, k), **tolerances)


def test_a_double_backward_reaches_both_inputs(generator):
    """create_graph (a gradient penalty): the input's gradient is our convolution, differentiable again; the
    kernel's is the kernel-gradient op, whose backward is two of our convolutions."""
    x = torch.randn(2, 20, 20, device="cuda", generator=generator, requires_grad=True)
    k = torch.randn(3, 3, device="cuda", generator=generator, requires_grad=True)
    dx, dk = torch.autograd.grad(ck.conv2d(x, k, padding=1).square().sum(), (x, k), create_graph=True)
    ours = torch.autograd.grad(dx.square().sum() + dk.square().sum(), (x, k))
    x64, k64 = x.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    y = torch.nn.functional.conv2d(x64[:, None], k64[None, None], padding=1)[:, 0]
    dx64, dk64 = torch.autograd.grad(y.square().sum(), (x64, k64), create_graph=True)
    exact = torch.autograd.grad(dx64.square().sum() + dk64.square().sum(), (x64, k64))
    for mine, ref in zip(ours, exact):
        assert oracle.compare(mine, ref)


# ---- The tiled variant: any side -------------------------------------------------------------------------


@pytest.mark.parametrize("vshape, kshape, padding", [
    ((1, 1, 3000), (1, 1, 2047), "valid"), ((2, 1, 1, 5000), (1, 1, 1000), "same"), ((1, 200, 300), (1, 31, 31), 3),
    ((1, 120, 130), (1, 63, 17), "same"), ((20, 24, 28), (17, 3, 5), "valid"), ((9, 30, 40), (16, 16, 16), 4),
    ((1, 40, 50), (1, 1, 16), ((0, 0), (2, 1), (7, 9))), ((3, 1, 1, 3001), (1, 1, 255), "same"),
    ((1, 300, 41), (1, 255, 9), "valid")])
def test_tiled_any_side(vshape, kshape, padding, generator):
    volume = torch.randn(vshape, device="cuda", generator=generator)
    check_padded(volume, torch.randn(kshape, device="cuda", generator=generator), padding)


@pytest.mark.parametrize("config", __import__("cute_kernels.ops.conv3d.tiled", fromlist=["candidates"]).candidates(),
                         ids=lambda c: f"{c.tile_h}x{c.tile_w}-{c.block_r}x{c.block_c}")
def test_tiled_every_candidate(config, generator):
    volume = torch.randn(3, 37, 75, device="cuda", generator=generator)
    check_padded(volume, torch.randn(2, 5, 19, device="cuda", generator=generator), "same", config=config)


@pytest.mark.parametrize("kd_splits", [2, 3, 7])
def test_tiled_splits_the_kernels_planes(kd_splits, generator):
    """Split kernel planes (partial sums added on the host), depth padding included: each split zero-fills
    its own padding planes."""
    from cute_kernels.ops.conv3d.tiled import TiledConvConfig

    volume = torch.randn(2, 12, 20, 30, device="cuda", generator=generator)
    kernel = torch.randn(7, 3, 17, device="cuda", generator=generator)
    config = TiledConvConfig(16, 64, 2, 4, 8, 32, 1, kd_splits)
    check_padded(volume, kernel, ((2, 1), (1, 1), (0, 3)), config=config)


def test_a_deep_kernel_splits_by_default_and_repeats_bitwise(generator):
    volume = torch.randn(40, 40, 40, device="cuda", generator=generator)
    kernel = torch.randn(13, 13, 13, device="cuda", generator=generator)
    check_padded(volume, kernel, "valid")
    assert torch.equal(conv3d(volume, kernel), conv3d(volume, kernel))


def test_tiled_keeps_an_inf_out_of_outputs_whose_window_misses_it():
    """The tiled kernel's 4-column steps read window columns past a block's last tap: they must not meet a
    zero weight (0 * inf is NaN), as torch's result has no NaN there."""
    volume = torch.zeros(1, 1, 64, device="cuda")
    volume[..., 40] = float("inf")
    kernel = torch.ones(1, 1, 17, device="cuda")  # 17 taps: a block's last step is one column wide
    out = conv3d(volume, kernel)
    expected = torch.nn.functional.conv1d(volume[0].double(), kernel[0].double()[None])[0]
    assert torch.equal(torch.isnan(out[0, 0]), torch.isnan(expected)) and not torch.isnan(out).any()


def test_gradients_past_side_fifteen(generator):
    """Past side 15 the kernel's gradient is torch's convolution (TF32 off), the input's our tiled one."""
    from cute_kernels.ops.conv3d.problem import conv_pads

    for shape, kshape, padding in (((2, 500), (31,), "same"), ((30, 40), (17, 3), 2)):
        op = {2: ck.conv2d, 1: ck.conv1d}[len(kshape)]
        x = torch.randn(shape, device="cuda", generator=generator, requires_grad=True)
        k = torch.randn(kshape, device="cuda", generator=generator, requires_grad=True)
        y = op(x, k, padding=padding)
        grad = torch.randn(y.shape, device="cuda", generator=generator)
        ours = torch.autograd.grad(y, (x, k), grad)
        pads = conv_pads(padding, kshape, len(kshape))
        exact = _torch_grads(x, k, pads, grad, torch.float64)
        theirs = _torch_grads(x, k, pads, grad, torch.float32)
        for name, mine, ref, same in zip(("input", "kernel"), ours, exact, theirs):
            verdict = oracle.compare(mine, ref, same)
            assert verdict, (kshape, name, verdict.detail)


def test_an_inf_weight_meets_the_padding_as_torchs_does(generator):
    """Padding planes, rows and columns are zeros that a weight multiplies (inf * 0 is NaN, as in torch), in
    both variants."""
    for kshape, pads in (((3, 5, 7), 1), ((1, 18, 35), (1, 8, 19))):
        volume = torch.randn(2, 22, 80, device="cuda", generator=generator)
        kernel = torch.randn(kshape, device="cuda", generator=generator)
        kernel[0, 0, 0] = float("inf")
        got = conv3d(volume, kernel, padding=pads)
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            expected = torch.nn.functional.conv3d(volume.double()[None, None], kernel.double()[None, None],
                                                  padding=pads)[0, 0]
        assert torch.equal(torch.isnan(got), torch.isnan(expected)), kshape
