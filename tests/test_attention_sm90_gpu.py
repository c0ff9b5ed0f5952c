"""GPU tier: the Hopper attention forward (flash3_wgmma) named explicitly, every config, against the float64
reference with test_attention_gpu's oracle (outputs poisoned): ragged M and N around the tiles, causal with
M != N both ways, grouped-query heads, strided and 2-D/3-D layouts, negative/zero/large scales, growing
maxima; tensor maps re-encoded for new pointers (tests/test_attention_sm90_cpu.py has the routing)."""

import dataclasses

import pytest
import torch

from cute_kernels.ops.attention import attention
from cute_kernels.ops.attention import flash3_wgmma as f3

from cute_kernels.ops.attention.problem import AttentionProblem
from test_attention_gpu import check, check_lse, check_window, randn

pytestmark = [pytest.mark.gpu]


@pytest.fixture(autouse=True)
def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("flash3_wgmma runs on sm_90 only")


DTYPES = (torch.float16, torch.bfloat16)
CONFIGS = f3.flash3_candidates()
# Every (config, head dim) the kernel takes: d 256 fits 64- and 80-key tiles only, three consumers d 64 only.
FITTING = [(c, d) for d in f3.HEAD_DIMS for c in CONFIGS
           if f3.flash3_why_unsupported(c, AttentionProblem(1, 1, 128, 128, d, torch.float16, vector=8)) is None]


def run(q, k, v, config=None, **kwargs):
    return check(q, k, v, variant="flash3_wgmma", config=config, **kwargs)


@pytest.mark.quick
@pytest.mark.parametrize("config, d", FITTING, ids=str)
def test_every_config(config, d, generator):
    for dtype in DTYPES:
        q, k, v = (randn((2, 2, r, d), dtype, generator) for r in (333, 1000, 1000))
        for causal in (False, True):
            run(q, k, v, config, causal=causal)


# Ragged tiles: M and N below, at and past 128 / 64, one key, one query, M != N both ways under causal.
SHAPES = [(1, 1), (1, 64), (64, 1), (127, 129), (128, 128), (129, 127), (255, 4097), (4097, 255), (1000, 17),
          (17, 1000), (4096, 4096)]


@pytest.mark.parametrize("mn", SHAPES, ids=str)
@pytest.mark.parametrize("d", f3.HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_shapes(mn, d, causal, generator):
    m, n = mn
    for dtype in DTYPES:
        q, k, v = (randn((1, 3, r, d), dtype, generator) for r in (m, n, n))
        run(q, k, v, causal=causal)


@pytest.mark.parametrize("d", [8, 40, 96, 136, 192, 248])
def test_head_dims_between_the_compiled_ones(d, generator):
    """A d below 64, 128 or 256 runs as that (the maps read zeros past column d); only d columns are written
    (nothing lands past the output). Ragged, causal, grouped heads, the log-sum-exp."""
    for dtype in DTYPES:
        q = randn((2, 4, 300, d), dtype, generator)
        k, v = (randn((2, 2, 517, d), dtype, generator) for _ in range(2))
        for causal in (False, True):
            run(q, k, v, causal=causal)
            # A store past column d of the last row would land in the sentinels after the output.
            flat = torch.full((q.numel() + 64,), 7.0, dtype=dtype, device="cuda")
            got = attention(q, k, v, causal=causal, out=flat[:q.numel()].view(q.shape), variant="flash3_wgmma")
            torch.testing.assert_close(got, run(q, k, v, causal=causal), rtol=0, atol=0)
            assert bool((flat[q.numel():] == 7.0).all())
        check_lse(q, k, v, True, variant="flash3_wgmma")


@pytest.mark.parametrize("group", [1, 2, 4, 16])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_heads(group, causal, generator):
    for dtype in DTYPES:
        q = randn((2, 16, 257, 128), dtype, generator)
        k, v = (randn((2, 16 // group, 700, 128), dtype, generator) for _ in range(2))
        run(q, k, v, causal=causal)


def test_layouts(generator):
    """(B, S, H, d) storage viewed as (B, H, S, d) (row stride H*d), 3-D (H, S, d) and 2-D (S, d) inputs."""
    for dtype in DTYPES:
        q, k, v = (randn((2, r, 5, 64), dtype, generator).transpose(1, 2) for r in (300, 700, 700))
        run(q, k, v)
        run(q, k, v, causal=True)
        run(randn((8, 129, 128), dtype, generator), randn((2, 300, 128), dtype, generator),
            randn((2, 300, 128), dtype, generator), causal=True)
        run(randn((200, 64), dtype, generator), randn((300, 64), dtype, generator), randn((300, 64), dtype, generator))


@pytest.mark.parametrize("scale", [-0.09, -1.5, 0.0, 0.5])
def test_scales(scale, generator):
    for dtype in DTYPES:
        for d in (128, 256):
            q, k, v = (randn((2, 2, r, d), dtype, generator) for r in (300, 1000, 1000))
            for causal in (False, True):
                run(q, k, v, scale=scale, causal=causal)


def test_growing_maxima_and_large_scores(generator):
    for dtype in DTYPES:
        q = torch.ones((1, 2, 500, 64), device="cuda").to(dtype)
        k = (torch.arange(3000, device="cuda", dtype=torch.float32)[:, None] * 2.0 / 64).expand(3000, 64)
        k = (k + 0.1 * torch.randn((1, 2, 3000, 64), device="cuda", generator=generator)).to(dtype)
        v = randn((1, 2, 3000, 64), dtype, generator)
        for causal in (False, True):
            run(q, k, v, scale=1.0, causal=causal)
        q, k, v = (randn((2, 2, r, 128), dtype, generator, scale=30.0 if r != 1000 else 1.0) for r in (257, 1000, 1000))
        run(q, k, v)


def test_same_tensors_twice_and_new_pointers(generator):
    """The plan re-encodes a tensor map only when a pointer changes: the same call twice, then new tensors of
    the same structure, each against the reference."""
    q, k, v = (randn((1, 4, 512, 128), torch.float16, generator) for _ in range(3))
    run(q, k, v)
    run(q, k, v)
    q2, k2, v2 = (randn((1, 4, 512, 128), torch.float16, generator) for _ in range(3))
    run(q2, k, v2)
    run(q2, k2, v2)


@pytest.mark.parametrize("causal", [False, True])
def test_return_lse(causal, generator):
    """The log-sum-exp output (the training forward), ragged shapes, grouped heads, a negative scale."""
    for dtype in DTYPES:
        for m, n, d, kv in ((300, 517, 64, 3), (517, 300, 128, 3), (1024, 1024, 128, 1), (129, 4097, 64, 1),
                            (300, 517, 256, 3)):
            q = randn((2, 3, m, d), dtype, generator)
            k, v = (randn((2, kv, n, d), dtype, generator) for _ in range(2))
            check_lse(q, k, v, causal, variant="flash3_wgmma")
            check_lse(q, k, v, causal, scale=-0.2, variant="flash3_wgmma")


WINDOWS = [((0, 0), 0), ((0, None), 0), ((128, 0), 0), ((16, 16), 0), ((300, 5), 3), ((None, 0), 4), ((1, 1), 200)]


@pytest.mark.parametrize("window, num_sinks", WINDOWS, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_windows_and_sinks(window, num_sinks, causal, generator):
    """A window's edges and the sinks' in every tile, M != N both ways, ragged sizes, grouped heads, the
    log-sum-exp with them, and every config."""
    for dtype in DTYPES:
        for m, n, d, kv in ((300, 517, 64, 3), (517, 300, 128, 1), (1000, 1000, 128, 3), (517, 300, 256, 1)):
            q = randn((2, 3, m, d), dtype, generator)
            k, v = (randn((2, kv, n, d), dtype, generator) for _ in range(2))
            check_window(q, k, v, causal, window, num_sinks, variant="flash3_wgmma")
        check_lse(q, k, v, causal, window, num_sinks, variant="flash3_wgmma")
    q, k, v = (randn((1, 2, r, 64), torch.float16, generator) for r in (700, 900, 900))
    for config in CONFIGS:
        check_window(q, k, v, causal, window, num_sinks, variant="flash3_wgmma", config=config)


def test_window_rows_that_see_no_key_are_zero(generator):
    """Rows past the last key plus the window see nothing: output 0, lse -inf, whole units of them too."""
    for dtype in DTYPES:
        q, k, v = randn((1, 2, 1000, 64), dtype, generator), randn((1, 2, 100, 64), dtype, generator), randn(
            (1, 2, 100, 64), dtype, generator)
        out = check_window(q, k, v, window=(10, 10), variant="flash3_wgmma")
        assert torch.count_nonzero(out[:, :, 111:]) == 0
        check_lse(q, k, v, False, (10, 10), variant="flash3_wgmma")
        check_window(q, k, v, window=(10, 10), num_sinks=2, variant="flash3_wgmma")


def test_persistent_ctas_walk_many_units(monkeypatch, generator):
    """Two CTAs walk every unit, so the ring's stages and parities, Q's barrier and the ping-pong turns carry
    across dozens of units (the other tests' grids mostly give each CTA one): every persistent config, causal
    or not, GQA, the log-sum-exp, and a window whose units past the keys have no key tile, between others."""
    monkeypatch.setattr(f3, "sm_count", lambda device: 2)
    for config, d in FITTING:
        if config.persistent:
            q = randn((2, 4, 1300, d), torch.float16, generator)
            k, v = (randn((2, 2, 700, d), torch.float16, generator) for _ in range(2))
            for causal in (False, True):
                run(q, k, v, config, causal=causal)
            check_lse(q, k, v, True, variant="flash3_wgmma", config=config)
            window = (q, k[:, :, :150], v[:, :, :150], False, (40, 8), 2)
            if d == 256 and config.overlap and config.block_n > 64:  # spills: the op refuses it
                with pytest.raises(ValueError, match="spill"):
                    check_window(*window, variant="flash3_wgmma", config=config)
            else:
                check_window(*window, variant="flash3_wgmma", config=config)


@pytest.mark.timeout(300)  # a barrier parity mistake hangs rather than fails
@pytest.mark.parametrize("d", [64, 128])
def test_a_second_q_buffer_gives_the_same_bits(d, monkeypatch, generator):
    """q_buffers=2 loads each unit's Q a unit ahead into the other buffer; the products and their order are
    the same, so the output is bitwise the one-buffer kernel's: many short units per CTA (B16 S256, and
    two CTAs walking a ragged problem), causal or not, with the dynamic scheduler, with three consumers at
    d 64 and with the register epilogue too."""
    bases = [f3.Flash3Config(tma_store=True), f3.Flash3Config(dynamic=True, tma_store=True), f3.Flash3Config()]
    bases += [f3.Flash3Config(consumers=3, dynamic=True, tma_store=True)] if d == 64 else []
    for ctas in (132, 2):
        monkeypatch.setattr(f3, "sm_count", lambda device, ctas=ctas: ctas)
        for base in bases:
            two = dataclasses.replace(base, q_buffers=2)
            for dtype in DTYPES:
                shape = (16, 16, 256, d) if ctas == 132 else (2, 3, 333, d)
                q, k, v = (randn(shape, dtype, generator) for _ in range(3))
                for causal in (False, True):
                    torch.testing.assert_close(run(q, k, v, two, causal=causal), run(q, k, v, base, causal=causal),
                                               rtol=0, atol=0)


@pytest.mark.timeout(300)  # a consumer that misreads its unit deadlocks the ring rather than fails
@pytest.mark.parametrize("d", [64, 128])
def test_every_way_of_taking_units_gives_the_same_bits(d, monkeypatch, generator):
    """A unit's products and their order do not depend on which CTA computes it, so the output is bitwise
    the one-unit-per-CTA kernel's however persistent CTAs take the units: at a fixed stride (the consumers
    count the units themselves) and from the dynamic scheduler (each unit's index reaches the consumers
    through a global word per CTA and Q buffer), one and two Q buffers, two and 132 CTAs walking many
    units, causal or not, both epilogues, three consumers at d 64; and in any order of the units: causal
    units grouped by L2 (``grouped_units``: every pair in one group here), in groups of 5 pairs (a short
    last group: 256 and 6 pairs) and pair by pair. A consumer that reads a stale or wrong index computes another
    unit's rows or loses the ring's order; an order that skips or repeats a unit leaves rows unwritten."""
    from cute_kernels.runtime import plans

    kernels = [dict(tma_store=True), dict()] + ([dict(consumers=3, tma_store=True)] if d == 64 else [])
    grouping = f3.unit_group_pairs
    try:
        for ctas in (132, 2):
            monkeypatch.setattr(f3, "sm_count", lambda device, ctas=ctas: ctas)
            for pairs in (None, 5):
                monkeypatch.setattr(f3, "unit_group_pairs", grouping if pairs is None else
                                    lambda config, problem, pairs=pairs: pairs if grouping(config, problem) > 1 else 1)
                plans.clear_all()  # a launch keeps the grid and the grouping it was prepared with
                for dtype in DTYPES:
                    shape = (16, 16, 256, d) if ctas == 132 else (2, 3, 333, d)
                    q, k, v = (randn(shape, dtype, generator) for _ in range(3))
                    for causal in (False, True):
                        for kernel in kernels:
                            one_per_cta = run(q, k, v, f3.Flash3Config(persistent=False, grouped_units=False, **kernel),
                                              causal=causal)
                            for dynamic in (False, True):
                                for q_buffers in (1, 2):
                                    for grouped in (True, False):
                                        config = f3.Flash3Config(dynamic=dynamic, q_buffers=q_buffers,
                                                                 grouped_units=grouped, **kernel)
                                        torch.testing.assert_close(run(q, k, v, config, causal=causal), one_per_cta,
                                                                   rtol=0, atol=0, msg=lambda m, c=config: f"{c}: {m}")
    finally:
        plans.clear_all()  # the op's plans hold launches of a patched grid: none outlive the test


def test_dynamic_scheduler_leaves_its_counters_zero(monkeypatch, generator):
    """The scheduler's two counters (the stream's zeroed workspace) are zero again after every launch, on the
    default stream and another, so the next launch takes units from 0: back-to-back causal calls, each
    checked, with few and with many CTAs."""
    from cute_kernels.runtime.device import current_stream_handle
    from cute_kernels.runtime.workspace import stream_buffer

    q = randn((2, 4, 1000, 64), torch.float16, generator)
    k, v = (randn((2, 4, 1000, 64), torch.float16, generator) for _ in range(2))
    for stream in (torch.cuda.current_stream(), torch.cuda.Stream()):
        with torch.cuda.stream(stream):
            for ctas in (2, 132):
                monkeypatch.setattr(f3, "sm_count", lambda device, ctas=ctas: ctas)
                for config in (f3.Flash3Config(dynamic=True), f3.Flash3Config(consumers=3, dynamic=True)):
                    for _ in range(3):
                        run(q, k, v, config, causal=True)
            counters = stream_buffer("arrivals", q.device.index, current_stream_handle(q.device.index), 2)
            torch.cuda.synchronize()
            assert counters[:2].tolist() == [0, 0]


@pytest.mark.parametrize("d", [8, 40, 64, 96, 128])
def test_tma_store_clips_rows_and_columns(d, generator):
    """tma_store: O goes out through a map of the output, so rows past M and columns past d are clipped (the
    sentinels after the output stay), with the bits of the register stores."""
    configs = [f3.Flash3Config(tma_store=True), f3.Flash3Config(dynamic=True, tma_store=True)]
    configs += [f3.Flash3Config(consumers=3, tma_store=True)] if d <= 64 else []
    for config in configs:
        plain = dataclasses.replace(config, tma_store=False)
        for dtype in DTYPES:
            q = randn((2, 4, 300, d), dtype, generator)
            k, v = (randn((2, 2, 517, d), dtype, generator) for _ in range(2))
            for causal in (False, True):
                expected = run(q, k, v, config, causal=causal)
                torch.testing.assert_close(expected, run(q, k, v, plain, causal=causal), rtol=0, atol=0)
                flat = torch.full((q.numel() + 64,), 7.0, dtype=dtype, device="cuda")
                got = attention(q, k, v, causal=causal, out=flat[:q.numel()].view(q.shape), variant="flash3_wgmma",
                                config=config)
                torch.testing.assert_close(got, expected, rtol=0, atol=0)
                assert bool((flat[q.numel():] == 7.0).all())


@pytest.mark.parametrize("every", [2, 4, 8, 16])
def test_fma_exp2_passes_nan_scores_on(every, generator):
    """fma_exp2's polynomial exponentials pass a NaN score on as the MUFU's do: a NaN in one key makes every
    query row of its head NaN, output and lse, whichever unit computes that key's exponential; the other
    head stays finite. Key 2 every - 1 (and the same column of the next key tile) is one the polynomial
    computes: a thread's score v sits at column 8 (v >> 2) + 2 (lane % 4) + (v & 1), and v = every - 1 is
    the first that takes it; key 6 is one the MUFU computes at every spacing."""
    for dtype in DTYPES:
        q, k, v = (randn((1, 2, 300, 64), dtype, generator) for _ in range(3))
        for key in (6, 2 * every - 1, 128 + 2 * every - 1):
            bad = k.clone()
            bad[0, 1, key, 5] = float("nan")
            for config in (f3.Flash3Config(tma_store=True, fma_exp2=every),
                           f3.Flash3Config(consumers=3, tma_store=True, fma_exp2=every)):
                out, lse = attention(q, bad, v, return_lse=True, variant="flash3_wgmma", config=config)
                assert torch.isnan(out[0, 1]).all() and torch.isnan(lse[0, 1]).all(), (key, config)
                assert torch.isfinite(out[0, 0]).all() and torch.isfinite(lse[0, 0]).all(), (key, config)


@pytest.mark.parametrize("every", [2, 4, 16])
def test_fma_exp2_against_the_reference(every, generator):
    """The polynomial's 8.6e-5 relative error stays inside the oracle on long rows (its errors do not add up
    over 8192 keys), masked tiles (its -inf clamp), windows, the lse, large and negative scales."""
    for dtype in DTYPES:
        config = f3.Flash3Config(tma_store=True, fma_exp2=every)
        q, k, v = (randn((1, 2, r, 64), dtype, generator) for r in (517, 8192, 8192))
        for causal in (False, True):
            run(q, k, v, config, causal=causal)
        q, k, v = (randn((2, 2, r, 64), dtype, generator, scale=4.0) for r in (300, 1000, 1000))
        for scale in (-0.3, 1.0):
            run(q, k, v, config, scale=scale)
        check_window(q, k, v, False, (100, 20), 3, variant="flash3_wgmma", config=config)
        check_lse(q, k, v, True, variant="flash3_wgmma", config=config)
