"""CPU tier: conv3d's config space, its supports() predicate, its compile plan (every kernel shape compiles
with NVRTC) and the argument checks that need no GPU."""

import concurrent.futures
import ctypes
import itertools
import multiprocessing
import os

import numpy as np
import pytest
import torch

from cute_kernels.runtime.plans import CallPlans

import cute_kernels as ck
from cute_kernels import registry
from cute_kernels.ops.conv3d import op as conv3d_op
from cute_kernels.ops.conv3d import problem as conv3d_problem
from cute_kernels.ops.conv3d.config import Conv3dConfig, candidates, default_config, why_unsupported
from cute_kernels.ops.conv3d.direct import SOURCE, Conv3dArgs, _standard_problems, name_expression
from cute_kernels.ops.conv3d.op import conv3d
from cute_kernels.ops.conv3d.problem import Conv3dProblem, make_problem
from cute_kernels.ops.conv3d.reference import conv3d_reference, conv3d_scale
from cute_kernels.runtime import checks
from cute_kernels.runtime import nvrtc

from covering import pairwise

SHAPES = list(itertools.product(range(1, 8), repeat=3))


def test_config_validation():
    with pytest.raises(ValueError, match="Conv3dConfig.thread_w"):
        Conv3dConfig(thread_w=2)
    with pytest.raises(ValueError, match="Conv3dConfig.thread_h"):
        Conv3dConfig(thread_h=3)
    with pytest.raises(ValueError, match="Conv3dConfig.tile_w: expected a positive multiple of 8 \\* thread_w = 64"):
        Conv3dConfig(tile_w=96, thread_w=8)
    with pytest.raises(ValueError, match="Conv3dConfig.tile_h"):
        Conv3dConfig(tile_h=3, thread_h=2)
    with pytest.raises(ValueError, match="threads"):
        Conv3dConfig(tile_h=1, tile_w=32, thread_w=4)  # 8 threads
    with pytest.raises(ValueError, match="threads"):
        Conv3dConfig(tile_h=128, tile_w=128, thread_w=4)  # 4096 threads
    with pytest.raises(ValueError, match="Conv3dConfig.stages"):
        Conv3dConfig(stages=1)
    with pytest.raises(ValueError, match="Conv3dConfig.depth"):
        Conv3dConfig(depth=0)
    assert Conv3dConfig(16, 128, 1, 8).threads == 256


def test_shared_bytes_formula():
    # 3 buffers of (16 + 4) rows x (128 + 4) floats, and 5 x 5 weight rows of 8 floats.
    assert Conv3dConfig(16, 128, 1, 8, 32, 3).shared_bytes(5, 5, 5) == 4 * (3 * 20 * 132 + 5 * 5 * 8)
    # KW = 1 needs no halo columns; weight rows still pad to 4 floats.
    assert Conv3dConfig(8, 64, 1, 4, 8, 2).shared_bytes(1, 1, 1) == 4 * (2 * 8 * 64 + 4)


def test_why_unsupported():
    config = Conv3dConfig()
    ok = Conv3dProblem(1, 20, 20, 20, 3, 3, 3)
    assert why_unsupported(config, ok) is None
    assert "1..15" in why_unsupported(config, Conv3dProblem(1, 20, 20, 20, 16, 3, 3))  # the tiled variant runs it
    assert "larger than the volume" in why_unsupported(config, Conv3dProblem(1, 2, 20, 20, 3, 3, 3))
    # 7 planes x 2 rows x 8 columns of accumulators per thread would spill.
    assert "accumulators" in why_unsupported(Conv3dConfig(32, 128, 2, 8), Conv3dProblem(1, 20, 20, 20, 7, 3, 3))
    assert why_unsupported(Conv3dConfig(32, 128, 2, 4), Conv3dProblem(1, 20, 20, 20, 7, 3, 3)) is None
    assert "CTAs" in why_unsupported(Conv3dConfig(8, 32, 1, 4, 1), Conv3dProblem(2**20, 2**10, 2**10, 32, 1, 1, 1))


@pytest.mark.parametrize("volume", [(1, 1, 1), (7, 7, 7), (10, 10, 10), (3, 200, 5), (256, 256, 256), (1024, 1024, 1024)])
def test_default_config_supports_every_kernel_shape(volume):
    for kd, kh, kw in SHAPES:
        if kd > volume[0] or kh > volume[1] or kw > volume[2]:
            continue
        for in_vec, out_vec in ((1, 1), (2, 2), (4, 4)):
            problem = Conv3dProblem(1, *volume, kd, kh, kw, False, in_vec, out_vec)
            config = default_config(problem)
            assert why_unsupported(config, problem) is None, (problem, config)


def test_default_config_of_the_standard_problems():
    """The heuristic's picks, pinned so that a change to it is a deliberate one (see default_config)."""
    picks = [default_config(p) for p in _standard_problems()]
    # 256^3 with 5^3: the H200 sweep's winner
    assert picks[0] == Conv3dConfig(16, 64, 2, 4, 32, 2)
    assert all(c.thread_w == 4 and c.stages == 2 for c in picks)
    assert picks[3].thread_h == 1  # 7^3: one row per thread


def test_vector_widths_follow_width_and_alignment():
    assert Conv3dProblem(1, 8, 8, 256, 5, 5, 5).in_vec == 4
    assert Conv3dProblem(1, 8, 8, 256, 5, 5, 5).out_vec == 4  # 252 columns
    assert Conv3dProblem(1, 8, 8, 256, 3, 3, 3).out_vec == 2  # 254 columns
    assert Conv3dProblem(1, 8, 8, 255, 3, 3, 3).in_vec == 1
    base = torch.zeros(2, 9, 10, 12)
    p = make_problem(base, (3, 3, 3), torch.zeros(2, 7, 8, 10), True)
    assert (p.in_vec, p.out_vec) == (4, 2)
    p = make_problem(base[:, :, :, 1:], (3, 3, 3), torch.zeros(2, 7, 8, 9), True)  # 4-byte aligned start
    assert (p.in_vec, p.out_vec) == (1, 1)
    p = make_problem(base[:, :, :, 2:10], (1, 1, 1), torch.zeros(2, 9, 10, 8), True)  # 8-byte aligned start
    assert (p.in_vec, p.out_vec) == (2, 4)
    # A size-1 dim's stride never steps, so it does not narrow the copies.
    odd = torch.zeros(1, 1, 1, 20).as_strided((1, 1, 1, 16), (7, 5, 3, 1))
    assert make_problem(odd, (1, 1, 1), torch.zeros(1, 1, 1, 16), True).in_vec == 4


def test_name_expression_holds_every_knob():
    problem = Conv3dProblem(1, 10, 10, 10, 3, 4, 5, False, 2, 1)
    config = Conv3dConfig(8, 64, 2, 4, 16, 2)
    assert name_expression(config, problem) == "conv3d::conv3d_kernel<3, 4, 5, 8, 64, 2, 4, 2, 2, 1>"
    # depth is a launch argument: configs that differ only there share a binary.
    assert Conv3dConfig(depth=8).compile_key() == Conv3dConfig(depth=64).compile_key()


def test_args_struct_matches_the_kernel():
    """conv3d.cu static_asserts the same size and offsets for its Args."""
    assert ctypes.sizeof(Conv3dArgs) == 104
    assert Conv3dArgs.stride_n.offset == 24
    assert Conv3dArgs.depth.offset == 48
    assert Conv3dArgs.chunk_depth.offset == 84
    assert Conv3dArgs.pad_w.offset == 96


def test_registry_entry():
    spec = registry.get("conv3d")
    assert spec.variant == "direct" and spec.backend == "nvrtc" and spec.sources == ("conv3d.cu",)
    assert ck.conv3d.custom_op is not None  # public since its GPU tests passed on the H200
    shapes = [(p.depth, p.height, p.width, p.kd) for p in spec.standard_problems()]
    assert shapes == [(256, 256, 256, 5), (256, 128, 128, 5), (256, 256, 256, 3), (128, 128, 128, 7)]
    assert spec.flops(spec.standard_problems()[0]) == 2 * 252**3 * 125
    for p in spec.standard_problems():
        assert spec.supports(spec.default_config(p), p)
        assert len(spec.supported_candidates(p)) >= len(spec.candidates()) // 2


def test_reference_and_scale_on_cpu():
    """The float64 oracle itself: integer data, checked against a direct loop."""
    g = torch.Generator().manual_seed(0)
    v = torch.randint(-3, 4, (2, 5, 6, 7), generator=g).float()
    k = torch.randint(-2, 3, (2, 3, 4), generator=g).float()
    ref = conv3d_reference(v, k)
    assert ref.shape == (2, 4, 4, 4) and ref.dtype == torch.float64
    expected = torch.nn.functional.conv3d(v.double()[:, None], k.double()[None, None])[:, 0]
    assert torch.equal(ref, expected)
    scale = conv3d_scale(v, k)
    assert (scale >= ref.abs()).all() and (scale > 0).all()


# ---- Argument checks that need no GPU (structural checks run before the device check) ------------------


def test_bad_ranks_dtypes_and_shapes():
    v = torch.zeros(6, 6, 6)
    k = torch.zeros(3, 3, 3)
    cases = [
        ((torch.zeros(6, 6), k), ValueError, r"volume: expected a \(D, H, W\) or \(N, D, H, W\) tensor, got 2-D"),
        ((v, torch.zeros(3, 3)), ValueError, r"kernel: expected a \(KD, KH, KW\) tensor, got 2-D"),
        ((v.double(), k), TypeError, r"volume: expected dtype in \(torch.float32\), got torch.float64"),
        ((v, k.half()), TypeError, r"kernel: expected dtype in \(torch.float32\), got torch.float16"),
        ((v, torch.zeros(16, 1, 1)), ValueError, r"kernel: shape \(16, 1, 1\) is larger than the volume's"),
        ((v, torch.zeros(0, 1, 1)), ValueError, r"kernel: expected sides of at least 1, got shape \(0, 1, 1\)"),
        ((torch.zeros(6, 0, 6), k), ValueError, r"volume: expected non-empty \(D, H, W\) sides"),
        ((torch.zeros(6, 2, 6), k), ValueError, r"kernel: shape \(3, 3, 3\) is larger than the volume's"),
        (([1.0], k), TypeError, "volume: expected a torch.Tensor, got list"),
        ((v, None), TypeError, "kernel: expected a torch.Tensor, got NoneType"),
    ]
    for args, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            conv3d(*args)


def test_bad_out_on_cpu_writes_nothing():
    v = torch.zeros(2, 6, 6, 6)
    k = torch.zeros(3, 3, 3)
    for out, exc, msg in [
        (torch.full((2, 4, 4, 5), 7.0), ValueError, r"out: expected shape \(2, 4, 4, 4\)"),
        (torch.full((2, 4, 4, 4), 7.0, dtype=torch.float64), TypeError, "out: expected dtype torch.float32"),
        (torch.full((2, 4, 4, 4), 7.0).transpose(2, 3), ValueError, "out: expected a contiguous tensor"),
    ]:
        before = out.clone()
        with pytest.raises(exc, match=msg):
            conv3d(v, k, out=out)
        assert torch.equal(out, before)
    with pytest.raises(ValueError, match="out: overlaps the memory of volume"):
        conv3d(v, k, out=v.view(-1)[:128].view(2, 4, 4, 4))


def test_cpu_tensors_and_bad_config():
    with pytest.raises(ValueError, match="volume: expected a CUDA tensor"):
        conv3d(torch.zeros(6, 6, 6), torch.zeros(3, 3, 3))
    with pytest.raises(TypeError, match="config: expected a Conv3dConfig or TiledConvConfig or None, got dict"):
        conv3d(torch.zeros(6, 6, 6), torch.zeros(3, 3, 3), config={})


# ---- NVRTC: every instantiation the registry can ask for compiles --------------------------------------


def _compile_group(args):
    names, arch = args
    cubin = nvrtc.compile_cubin(SOURCE, names, arch)
    return sorted(cubin.symbols), cubin.data[:4]


def _compile_in_parallel(names: list[str], arch: str) -> None:
    """One NVRTC program per worker (one per core), the names dealt round-robin: NVRTC is single-threaded and
    the 343 kernel shapes take ~2 CPU-minutes for one arch. The disk cache makes a rerun immediate."""
    workers = max(1, min(os.cpu_count() or 1, 16))
    groups = [(names[i::workers], arch) for i in range(workers) if names[i::workers]]
    context = multiprocessing.get_context("spawn")  # never fork a process that may hold a CUDA context
    with concurrent.futures.ProcessPoolExecutor(len(groups), mp_context=context) as pool:
        results = list(pool.map(_compile_group, groups))
    compiled = sorted(n for symbols, _ in results for n in symbols)
    assert compiled == sorted(names)
    assert all(magic == b"\x7fELF" for _, magic in results)


def test_kernel_shapes_compile_for_the_default_tile_sm90a():
    """Every kernel side on every axis, and every pair of sides on two axes (tests/covering.py: 49 of the 343
    shapes; the GPU tier compiles and runs all of them)."""
    names = set()
    sides = range(1, 8)
    shapes = pairwise(sides, sides, sides)
    for kd, kh, kw in shapes:
        problem = Conv3dProblem(1, 256, 256, 256, kd, kh, kw)
        names.add(name_expression(default_config(problem), problem))
    assert len(names) >= len(shapes)
    _compile_in_parallel(sorted(names), "sm_90a")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_vector_widths_and_tiles_compile(arch):
    """Every (copy width, store width) pair, and every tile shape the candidates and the heuristic use, for a
    3x4x5 kernel in one program."""
    names = set()
    for in_vec, out_vec in itertools.product((1, 2, 4), repeat=2):
        problem = Conv3dProblem(1, 64, 64, 64, 3, 4, 5, False, in_vec, out_vec)
        names.add(name_expression(Conv3dConfig(), problem))
    problem = Conv3dProblem(1, 64, 64, 64, 3, 4, 5)
    keys = sorted({c.compile_key() for c in candidates()})
    keys = set(keys[::5])  # an even sample: each compile takes about a second
    keys.update(default_config(Conv3dProblem(1, *v, 3, 4, 5)).compile_key()
                for v in [(10, 10, 10), (64, 64, 64), (300, 20, 20)])
    for key in keys:
        names.add(name_expression(Conv3dConfig(*key[:4], 8, key[4]), problem))
    cubin = nvrtc.compile_cubin(SOURCE, sorted(names), arch)
    assert set(cubin.symbols) == names and cubin.data[:4] == b"\x7fELF"


@pytest.mark.parametrize("limit", [163 * 1024 - 1024, 99 * 1024 - 1024])
def test_defaults_fit_smaller_shared_memory(limit):
    import dataclasses

    spec = registry.get("conv3d")
    for problem in spec.standard_problems():
        small = dataclasses.replace(problem, shared_limit=limit)
        assert spec.why_unsupported(spec.default_config(small), small) is None


def test_a_volume_side_past_the_kernels_coordinates_is_refused_naming_the_volume(monkeypatch):
    """A side past 2^31 - 1 fits no kernel's 32-bit coordinates: a ValueError naming the volume, raised with
    the other structural checks, before anything is allocated or launched (the limit is lowered to 10 here,
    so a 16-wide CPU volume crosses it)."""
    monkeypatch.setattr(conv3d_problem, "INT32_MAX", 10)
    monkeypatch.setattr(conv3d_op, "_PLANS", CallPlans("conv3d"))
    with pytest.raises(ValueError, match=r"^volume: sides \(4, 5, 16\) past 2\^31 - 1"):
        ck.conv3d(torch.randn(4, 5, 16), torch.randn(3, 3, 3))



# ---- conv2d and conv1d: the front ends' checks name their own arguments -----------------------------------
@pytest.mark.parametrize("call, message", [
    (lambda: ck.conv2d(torch.randn(8), torch.randn(3, 3)), r"^image: expected a \(H, W\) or \(N, H, W\) tensor"),
    (lambda: ck.conv2d(torch.randn(8, 8), torch.randn(3)), r"^kernel: expected a \(KH, KW\) tensor"),
    (lambda: ck.conv2d(torch.randn(20, 20), torch.randn(0, 3)), r"^kernel: expected sides of at least 1"),
    (lambda: ck.conv2d(torch.randn(4, 8), torch.randn(5, 3)), r"^kernel: shape \(5, 3\) is larger than the image's"),
    (lambda: ck.conv2d(torch.randn(8, 8).double(), torch.randn(3, 3)), r"^image: expected dtype"),
    (lambda: ck.conv2d(torch.randn(8, 8), torch.randn(3, 3), out=torch.empty(6, 5)), r"^out: expected shape \(6, 6\)"),
    (lambda: ck.conv2d(torch.randn(8, 8), torch.randn(3, 3)), r"^image: expected a CUDA tensor"),
    (lambda: ck.conv1d(torch.randn(2, 3, 8), torch.randn(3)), r"^signal: expected a \(W,\) or \(N, W\) tensor"),
    (lambda: ck.conv1d(torch.randn(8), torch.randn(3, 1)), r"^kernel: expected a \(KW,\) tensor"),
    (lambda: ck.conv1d(torch.randn(2, 0), torch.randn(1)), r"^signal: expected non-empty sides"),
    (lambda: ck.conv1d(torch.randn(5), torch.randn(3)), r"^signal: expected a CUDA tensor"),
], ids=lambda v: "" if callable(v) else v[:30])
def test_planar_front_ends_name_their_arguments(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


# ---- Padding ----------------------------------------------------------------------------------------------


def test_padding_forms_as_pads():
    from cute_kernels.ops.conv3d.problem import conv_pads

    assert conv_pads("valid", (3, 4, 5), 3) == (0, 0, 0, 0, 0, 0)
    assert conv_pads("same", (3, 4, 5), 3) == (1, 1, 1, 2, 2, 2)  # an even side's extra zero after, as torch
    assert conv_pads(2, (3, 4, 5), 3) == (2, 2, 2, 2, 2, 2)
    assert conv_pads((1, 0, 3), (3, 4, 5), 3) == (1, 1, 0, 0, 3, 3)
    assert conv_pads("same", (1, 4, 6), 2) == (0, 0, 1, 2, 2, 3)
    assert conv_pads(5, (7,), 1) == (0, 0, 0, 0, 5, 5)
    assert conv_pads(((1, 2), (0, 3)), (3, 3), 2) == (0, 0, 1, 2, 0, 3)
    # As torch's convolutions take them: a tuple of one size for every dim, NumPy integers, a 0-dim int tensor.
    assert conv_pads((2,), (3, 4, 5), 3) == (2, 2, 2, 2, 2, 2)
    assert conv_pads([1], (3, 3), 2) == (0, 0, 1, 1, 1, 1)
    assert conv_pads(np.int64(2), (3,), 1) == (0, 0, 0, 0, 2, 2)
    assert conv_pads((np.int32(1), 0, np.int64(3)), (3, 4, 5), 3) == (1, 1, 0, 0, 3, 3)
    assert conv_pads(torch.tensor(1), (3, 3, 3), 3) == (1,) * 6
    assert all(type(v) is int for v in conv_pads((np.int64(1),), (3, 3, 3), 3))
    for bad, error in (("full", ValueError), (-1, ValueError), ((1, -1, 0), ValueError), ((1, 2), TypeError),
                       (1.0, TypeError), (True, TypeError), (np.float64(1), TypeError), (torch.tensor(1.0), TypeError),
                       ((True,), TypeError), ((), TypeError), (None, TypeError), (((1, 2), (3, -1), (0, 0)), ValueError),
                       (((1, 2, 3), (0, 0), (0, 0)), TypeError)):
        with pytest.raises(error, match=r"^padding: "):
            conv_pads(bad, (3, 3, 3), 3)


@pytest.mark.parametrize("padding", ["same", 1, (2, 0, 3)])
def test_the_padded_reference_is_torchs_padded_convolution(padding):
    from cute_kernels.ops.conv3d.problem import conv_pads

    g = torch.Generator().manual_seed(3)
    v = torch.randint(-3, 4, (2, 5, 6, 7), generator=g).double()
    for sides in ((2, 3, 4), (3, 3, 3)):
        k = torch.randint(-2, 3, sides, generator=g).double()
        pads = conv_pads(padding, sides, 3)
        expected = torch.nn.functional.conv3d(v[:, None], k[None, None], padding=padding)[:, 0]
        assert torch.equal(conv3d_reference(v, k, pads), expected)
        assert (conv3d_scale(v, k, pads) >= expected.abs()).all()


def test_padded_problems_size_their_output_and_vectors():
    p = Conv3dProblem(1, 8, 8, 256, 5, 5, 5, pads=(2, 2, 2, 2, 2, 2))
    assert (p.out_depth, p.out_height, p.out_width) == (8, 8, 256) and p.in_vec == 2  # copies never straddle column 0
    assert Conv3dProblem(1, 8, 8, 256, 5, 5, 5, pads=(0, 0, 0, 0, 4, 0)).in_vec == 4
    assert Conv3dProblem(1, 8, 8, 256, 5, 5, 5, pads=(0, 0, 0, 0, 1, 0)).in_vec == 1
    assert "left padding" in why_unsupported(Conv3dConfig(), Conv3dProblem(1, 8, 8, 256, 5, 5, 5, in_vector=4,
                                                                           pads=(0, 0, 0, 0, 2, 2)))
    assert why_unsupported(default_config(p), p) is None
    assert "padded volume" in why_unsupported(Conv3dConfig(), Conv3dProblem(1, 2, 2, 2, 5, 5, 5, pads=(1,) * 6))
    base = torch.zeros(2, 9, 10, 12)
    assert make_problem(base, (3, 3, 3), torch.zeros(2, 9, 10, 12), True, (1, 1, 1, 1, 1, 1)).in_vec == 1


def test_padding_is_checked_before_the_device():
    v, k = torch.zeros(4, 4, 4), torch.zeros(5, 5, 5)
    with pytest.raises(ValueError, match=r"^kernel: shape \(5, 5, 5\) is larger than the volume's"):
        conv3d(v, k)
    with pytest.raises(ValueError, match=r"^kernel: shape \(5, 5, 5\) is larger than the padded volume's \(D, H, W\) = \(4, 6, 4\)"):
        conv3d(v, k, padding=(0, 1, 0))
    with pytest.raises(ValueError, match=r"^volume: expected a CUDA tensor"):
        conv3d(v, k, padding=1)  # passes the structural checks
    with pytest.raises(TypeError, match=r"^padding: expected 'valid', 'same', an int, or a tuple of 2 ints or of 2 \(before, after\) pairs, got \(1, 2, 3\)"):
        ck.conv2d(torch.zeros(5, 5), torch.zeros(3, 3), padding=(1, 2, 3))
    with pytest.raises(ValueError, match=r"^kernel: shape \(7,\) is larger than the padded signal's \(6,\)"):
        ck.conv1d(torch.zeros(4), torch.zeros(7), padding=1)


def test_padded_kernels_compile():
    """Padding is a launch argument: the vector widths it allows are the instantiations it needs."""
    names = []
    for pads in ((0, 0, 1, 1, 1, 1), (2, 2, 0, 0, 2, 2), (1, 1, 1, 1, 4, 4)):
        problem = Conv3dProblem(1, 40, 40, 64, 3, 3, 3, pads=pads)
        names.append(name_expression(default_config(problem), problem))
    names = list(dict.fromkeys(names))
    cubin = nvrtc.compile_cubin(SOURCE, names, "sm_90a")
    assert set(cubin.symbols) == set(names)


def test_sides_past_seven_compile():
    """Sides 8..15 are specialisations like the small ones (15^3, ~30 s of NVRTC, is left to the GPU tier)."""
    names = []
    for sides in ((1, 15, 15), (9, 9, 9), (1, 1, 15), (3, 11, 8), (8, 1, 1)):
        problem = Conv3dProblem(1, 40, 40, 64, *sides)
        names.append(name_expression(default_config(problem), problem))
    cubin = nvrtc.compile_cubin(SOURCE, names, "sm_90a")
    assert set(cubin.symbols) == set(names)



@pytest.mark.parametrize("ksides, pads", [((3, 2, 4), (0, 0, 0, 0, 0, 0)), ((3, 3, 3), (1, 1, 1, 1, 1, 1)),
                                          ((2, 4, 5), (0, 1, 1, 2, 2, 2)), ((3, 1, 2), (4, 0, 0, 3, 1, 5))])
def test_the_input_gradient_is_the_flipped_kernels_correlation(ksides, pads):
    """What the custom op's backward computes with our forward kernel, in float64 torch ops: the output's
    gradient cropped and padded (input_grad_padding), correlated with the flipped kernel, is autograd's
    gradient of the padded correlation; and the kernel's gradient is the padded volume's correlation with
    the output's gradient (conv3d_kernel_grad's sums)."""
    from cute_kernels.ops.conv3d.grad import input_grad_padding
    from cute_kernels.ops.conv3d.reference import padded

    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 5, 6, 7, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(ksides, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.nn.functional.conv3d(padded(x, pads)[:, None], k[None, None])[:, 0]
    grad = torch.randn(y.shape, dtype=torch.float64, generator=g)
    dx, dk = torch.autograd.grad(y, (x, k), grad)
    crops, padding = input_grad_padding(ksides, pads)
    cropped = grad
    for dim, (before, after) in zip((1, 2, 3), crops):
        cropped = cropped.narrow(dim, before, cropped.shape[dim] - before - after)
    flat = tuple(v for pair in padding for v in pair)
    ours = torch.nn.functional.conv3d(padded(cropped, flat)[:, None], k.detach().flip((0, 1, 2))[None, None])[:, 0]
    torch.testing.assert_close(ours, dx)
    kernel_sums = torch.nn.functional.conv3d(padded(x.detach(), pads)[None], grad[:, None].transpose(0, 1))[0, 0]
    torch.testing.assert_close(kernel_sums, dk)


@pytest.mark.parametrize("ksides, pads", [((3, 2, 4), (0, 0, 0, 0, 0, 0)), ((2, 4, 5), (0, 1, 1, 2, 2, 2)),
                                          ((3, 1, 2), (4, 0, 0, 3, 1, 5))])
def test_the_kernel_gradients_backward_is_autograds(ksides, pads, monkeypatch):
    """The kernel-gradient op's own backward (what a gradient penalty differentiates), run with a float64
    torch convolution in place of ours: its gradients for the volume and the output's gradient are
    autograd's through the kernel gradient written as a torch convolution."""
    from cute_kernels import torch_ops
    from cute_kernels.ops.conv3d.reference import padded

    def torch_conv(volume, kernel, padding):
        flat = tuple(v for pair in padding for v in pair)
        return torch.nn.functional.conv3d(padded(volume, flat)[:, None], kernel[None, None])[:, 0]

    monkeypatch.setattr(torch_ops, "conv3d", torch_conv)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 5, 6, 7, dtype=torch.float64, generator=g, requires_grad=True)
    out_shape = [2] + [s + lo + hi - k + 1 for s, k, lo, hi in zip((5, 6, 7), ksides, pads[0::2], pads[1::2])]
    grad = torch.randn(out_shape, dtype=torch.float64, generator=g, requires_grad=True)
    dk = torch.nn.functional.conv3d(padded(x, pads)[None], grad[:, None].transpose(0, 1))[0, 0]
    grad_of_kernel = torch.randn(ksides, dtype=torch.float64, generator=g)
    expected = torch.autograd.grad(dk, (x, grad), grad_of_kernel)

    class Ctx:
        saved_tensors = (x.detach(), grad.detach())
        needs_input_grad = (True, True, False, False)

    Ctx.pads = pads
    ours = torch_ops._kernel_grad_backward(Ctx, grad_of_kernel)[:2]
    for mine, ref in zip(ours, expected):
        torch.testing.assert_close(mine, ref)


def test_the_kernel_gradient_compiles():
    from cute_kernels.ops.conv3d.grad import Conv3dGradArgs, grad_name_expression

    assert ctypes.sizeof(Conv3dGradArgs) == 104
    from cute_kernels.ops.conv3d.grad import GRAD_ROW_TILE

    names = [grad_name_expression(k) for k in ((1, 1, 1), (3, 3, 3), (1, 15, 15), (1, 1, 15), (15, 2, 9))]
    names += [grad_name_expression(k, GRAD_ROW_TILE) for k in ((1, 1, 1), (1, 1, 15), (4, 1, 7))]
    cubin = nvrtc.compile_cubin(SOURCE, names, "sm_90a")
    assert set(cubin.symbols) == set(names)


# ---- The tiled variant: any side ---------------------------------------------------------------------------


def test_a_small_grid_splits_a_deep_kernel():
    from cute_kernels.ops.conv3d.tiled import RESIDENT_CTAS, TiledConvConfig, default_config, kd_split

    deep = Conv3dProblem(1, 64, 64, 64, 15, 15, 15)  # 50^3 outputs: 100 tiles of 32 x 64
    config = default_config(deep)
    per_split, splits = kd_split(config, deep)
    assert config.kd_splits == 11 and (per_split, splits) == (2, 8)  # 15 planes as 7 pairs and a single
    assert default_config(Conv3dProblem(1, 400, 400, 400, 3, 3, 3)).kd_splits == 1  # grid past RESIDENT_CTAS
    assert default_config(Conv3dProblem(1, 1, 100, 100, 1, 31, 31)).kd_splits == 1  # one kernel plane
    assert kd_split(TiledConvConfig(kd_splits=4), Conv3dProblem(1, 20, 20, 40, 6, 1, 1)) == (2, 3)
    assert RESIDENT_CTAS >= 132
    assert default_config(Conv3dProblem(1, 1, 1, 1 << 24, 1, 1, 7)).thread_w == 8  # a long signal, short kernel
    assert default_config(Conv3dProblem(1, 1, 1, 1_500_000, 1, 1, 2047)).thread_w == 4
    with pytest.raises(ValueError, match="kd_splits"):
        TiledConvConfig(kd_splits=0)


def test_sides_past_fifteen_take_the_tiled_variant():
    from cute_kernels.ops.conv3d.op import variant_for
    from cute_kernels.ops.conv3d.tiled import TiledConvConfig

    assert variant_for(None, (9, 9, 9), 120) == "direct" and variant_for(None, (1, 15, 15), 3000) == "direct"
    assert variant_for(None, (11, 11, 11), 54) == "tiled"  # past MAX_UNROLLED_TAPS
    assert variant_for(None, (1, 1, 2047), 1) == "tiled" and variant_for(None, (16, 1, 1), 40) == "tiled"
    assert variant_for(None, (1, 1, 7), 1) == "tiled"  # one output row: the tiled kernel's one-row tiles
    assert variant_for(Conv3dConfig(), (1, 1, 7), 1) == "direct"
    # A Conv3dConfig is the direct kernel's: past MAX_UNROLLED_TAPS it still runs there (11^3: 44 accumulators),
    # and past its sides its checks say why it cannot.
    assert variant_for(Conv3dConfig(8, 32, 1, 4), (11, 11, 11), 2) == "direct"
    assert variant_for(Conv3dConfig(), (16, 3, 3), 40) == "direct"
    assert variant_for(TiledConvConfig(), (3, 3, 3), 40) == "tiled"
    assert "1..15" in why_unsupported(Conv3dConfig(), Conv3dProblem(1, 20, 20, 40, 1, 1, 31))


def test_tiled_config_validation_and_predicate():
    from cute_kernels.ops.conv3d.tiled import TILED_SPEC, TiledConvConfig, candidates, default_config

    with pytest.raises(ValueError, match="block_c"):
        TiledConvConfig(block_c=30)
    with pytest.raises(ValueError, match="static shared memory"):
        TiledConvConfig(64, 512, 4, 8, 16, 256)
    with pytest.raises(ValueError, match="threads"):
        TiledConvConfig(1, 64, 1, 8)
    signal = Conv3dProblem(1, 1, 1, 1_500_000, 1, 1, 2047)
    assert default_config(signal).tile_h == 1 and TILED_SPEC.supports(default_config(signal), signal)
    image = Conv3dProblem(1, 1, 1024, 1024, 1, 63, 63, pads=(0, 0, 31, 31, 31, 31))
    assert TILED_SPEC.supports(default_config(image), image)
    assert "larger than the padded volume" in TILED_SPEC.why_unsupported(TiledConvConfig(), Conv3dProblem(1, 1, 5, 5, 1, 9, 9))
    assert len(candidates()) >= 12 and all(c.shared_bytes <= 48 * 1024 for c in candidates())
    for p in TILED_SPEC.standard_problems():
        assert TILED_SPEC.supports(TILED_SPEC.default_config(p), p)


def test_tiled_kernels_compile():
    from cute_kernels.ops.conv3d.tiled import Conv3dTiledArgs, candidates, name_expression as tiled_name

    assert ctypes.sizeof(Conv3dTiledArgs) == 128
    problem = Conv3dProblem(1, 4, 40, 64, 2, 17, 33)
    names = list(dict.fromkeys(tiled_name(c, problem) for c in candidates()))
    cubin = nvrtc.compile_cubin(SOURCE, names, "sm_90a")
    assert set(cubin.symbols) == set(names)


def test_the_kernel_gradients_sizes_take_numpy_integers_as_ints():
    import numpy as np

    from cute_kernels.ops.conv3d.grad import _sizes

    sizes = _sizes("kernel_sides", [np.int64(3), 3, np.int32(2)], 3, 1)
    assert sizes == (3, 3, 2) and all(type(v) is int for v in sizes)
    for bad in ([3, 3], [3, 3, True], [3, 3, 2.0], "333"):
        with pytest.raises(TypeError, match=r"kernel_sides: expected 3 ints"):
            _sizes("kernel_sides", bad, 3, 1)
    with pytest.raises(ValueError, match=r"kernel_sides: expected 3 ints >= 1"):
        _sizes("kernel_sides", [3, np.int64(0), 3], 3, 1)
