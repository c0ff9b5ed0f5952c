"""CPU tier for the Hopper 3xTF32 SGEMM (legacy_cuda/sgemm_sm90.cu, registry entry sgemm/tf32x3_wgmma): it
compiles for sm_90a with no spills and wgmmas ptxas does not serialise, and for sm_80 (an empty body there);
its parameter block matches the kernel's; what its tensor maps cannot describe is refused before a launch;
the op routes the large problems to it."""

import ctypes

import pytest
import torch

from cute_kernels.ops.gemm import sgemm_sm90 as S
from cute_kernels.runtime import nvrtc


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_compiles_without_spills_or_serialised_wgmmas(arch):
    names = [S.name_expression(b_k_major, stages, a_m_major, tile) for b_k_major in (False, True)
             for stages in (2, 3, 4) for a_m_major in (False, True) for tile in S.TILES]
    for name, resources in nvrtc.resource_usage(S.SOURCE, names, arch).items():
        assert resources.spill_stores == 0 and resources.spill_loads == 0 and resources.stack == 0, name
        assert not resources.wgmma_serialized, name
        if arch == "sm_90a":  # the launch's registers, which setmaxnreg splits: 65536 over the CTAs an SM runs
            assert resources.registers == (128 if name.endswith(", 64>") else 168), (name, resources.registers)


def test_parameters_match_the_kernel():
    # sgemm_sm90.cu static_asserts sizeof(Params) == 384 and the shared-memory size SHARED_BYTES counts.
    assert ctypes.sizeof(S.Params) == S.PARAMS_BYTES == 384
    assert S.Params.d.offset == 256 and S.Params.batch_c.offset == 296 and S.Params.beta.offset == 328
    assert S.Params.b_batched.offset == 336
    assert S.shared_bytes(128) <= 227 * 1024 and 2 * (S.shared_bytes(64) + 1024) <= 228 * 1024  # two CTAs an SM
    assert (S.threads(128), S.threads(64)) == (384, 256)


def test_what_the_maps_cannot_describe_is_refused():
    a, b = torch.randn(64, 40), torch.randn(40, 48)
    assert S.why_not(a, b, 90) is None
    assert "sm_90" in S.why_not(a, b, 80)
    assert S.why_not(a.t().contiguous().t(), b, 90) is None  # x.t() @ y
    assert S._maps(a.t().contiguous().t(), b)[0] == ((64, 40, 1, 1), (256, 256 * 40, 256 * 40), (32, 32, 1, 1))
    assert "row- or column-major a and b" in S.why_not(torch.randn(64, 80)[:, ::2], b, 90)  # a neither
    assert "row- or column-major a and b" in S.why_not(a, torch.randn(40, 96)[:, ::2], 90)  # b neither
    assert "both 2-D or both 3-D" in S.why_not(a[None], b, 90)
    assert S.why_not(a, torch.randn(48, 40).t(), 90) is None  # x @ w.t()
    assert S._maps(a, torch.randn(48, 40).t())[1] == ((40, 48, 1, 1), (160, 160 * 48, 160 * 48), (32, 128, 1, 1))
    assert "float32" in S.why_not(a.half(), b.half(), 90)
    assert "stride" in S.why_not(torch.randn(64, 41)[:, :40], b, 90)  # rows of 41 floats: not 16-byte multiples
    assert "K = 0" in S.why_not(torch.randn(64, 0), torch.randn(0, 48), 90)
    assert "M, N or K = 0" in S.why_not(torch.randn(0, 40), b, 90)
    assert "K differs" in S.why_not(a, torch.randn(44, 48), 90)
    assert "out:" in S.why_not(a, b, 90, out=torch.empty(64, 47))
    assert "c:" in S.why_not(a, b, 90, c=torch.empty(48, 64).t())


def test_a_batch_maps_its_third_dim_or_repeats_one_matrix():
    """A batch's maps take the batch as their third dim at its stride; an operand of batch stride 0 (one
    matrix for all, as the op expands it) is a dim of 1 that every product reads; what TMA cannot take, or a
    batch the kernel cannot run, is refused."""
    a, b = torch.randn(3, 64, 40), torch.randn(3, 40, 48)
    assert S.why_not(a, b, 90) is None
    assert S._maps(a, b) == (((40, 64, 3, 1), (160, 64 * 160, 64 * 160), (32, 128, 1, 1)),
                             ((48, 40, 3, 1), (192, 40 * 192, 40 * 192), (32, 32, 1, 1)))
    shared_b = torch.randn(40, 48).expand(3, 40, 48)  # stride 0: dim of 1, the 2-D map's strides
    assert S.why_not(a, shared_b, 90) is None
    assert S._maps(a, shared_b)[1] == ((48, 40, 1, 1), (192, 40 * 192, 40 * 192), (32, 32, 1, 1))
    a_cols = torch.randn(3, 40, 64).transpose(1, 2)  # x.mT @ y: (M, K, batch) at batch stride 40 * 64
    assert S._maps(a_cols, b)[0] == ((64, 40, 3, 1), (256, 40 * 256, 40 * 256), (32, 32, 1, 1))
    interleaved = torch.randn(64, 3, 40).transpose(0, 1)  # batch stride one row: the map takes it as it is
    assert S._maps(interleaved, b)[0] == ((40, 64, 3, 1), (3 * 160, 160, 160), (32, 128, 1, 1))
    assert "16-byte aligned" in S.why_not(torch.randn(3 * 64 * 40 + 1)[1:].view(3, 64, 40), b, 90)
    assert "stride" in S.why_not(torch.randn(64 * 40 * 3 + 3)[:-3].as_strided((3, 64, 40), (64 * 40 + 1, 40, 1)),
                                 b, 90)  # a batch stride of 4 * 2561 bytes
    assert "batches of one size" in S.why_not(a, torch.randn(2, 40, 48), 90)
    assert "out:" in S.why_not(a, b, 90, out=torch.empty(64, 48))
    assert "out:" in S.why_not(a, b, 90, out=torch.empty(3, 64, 49)[..., :47])  # N of 47, not 48
    assert "overlap" in S.why_not(a, b, 90, out=torch.empty(64, 48).expand(3, 64, 48))
    assert "overlap" in S.why_not(a, b, 90, out=torch.empty(64 * 48 + 2 * 48).as_strided((3, 64, 48), (48, 48, 1)))
    assert S.why_not(a, b, 90, out=torch.empty(64, 3, 48).transpose(0, 1)) is None  # interleaved row by row
    assert S.why_not(a, b, 90, out=torch.empty(3, 64, 48), c=torch.empty(64, 48).expand(3, 64, 48)) is None


def test_a_launch_encodes_maps_for_new_pointers_and_describes_new_strides(monkeypatch):
    """A launch's maps describe its last call's shapes and strides: each call writes the result's and C's
    pointers and row strides, a map is encoded again only for a new pointer, operands of other shapes or
    strides get maps of their own, and a b of the other majorness (another kernel) is refused. CPU
    tensors: the kernel load, the encoder and the launch replaced."""
    import threading

    encoded, launched = [], []

    class Map:
        def __init__(self, dtype, dims, strides, box):
            pass

        def encode(self, address, destination):
            encoded.append(address)

    class Packed:
        def __init__(self, kernel, grid, block, args, shared_mem=0, lock=None):
            self.args, self.lock = args, threading.Lock()

        def launch(self, stream):
            launched.append(S.Params.from_buffer_copy(self.args[0]))

    monkeypatch.setattr(S.nvrtc, "kernel_for", lambda *args, **kw: "kernel")
    monkeypatch.setattr(S.tma, "TiledMap", Map)
    monkeypatch.setattr(S.nvrtc, "PackedLaunch", Packed)
    monkeypatch.setattr(S, "current_stream_handle", lambda device: 0)
    monkeypatch.setattr(S, "device_sm", lambda t: 90)
    a, b = torch.randn(64, 40), torch.randn(40, 48)
    wide = torch.empty(64, 52)[:, :48]
    launch = S.Sm90Tf32x3Launch(S.Sm90Tf32x3Config(), False, 0)
    launch(a, b, None, torch.empty(64, 48), 1.0, 0.0)
    b2 = torch.randn(40, 48)
    launch(a, b2, wide, wide, 2.0, 0.5)
    assert encoded == [a.data_ptr(), b.data_ptr(), b2.data_ptr()]
    assert [(p.ldd, p.ldc, p.beta) for p in launched] == [(48, 0, 0.0), (52, 52, 0.5)]
    assert launched[1].c == launched[1].d == wide.data_ptr() and launched[1].alpha == 2.0
    a3 = torch.randn(300, 40)
    launch(a3, b2, None, torch.empty(300, 48), 1.0, 0.0)  # another M: maps of its own
    assert encoded[-2:] == [a3.data_ptr(), b2.data_ptr()] and (launched[-1].m, launched[-1].tiles_m) == (300, 3)
    # beta 0: C is not read, whatever its layout (a staged call passes the caller's misaligned one).
    launch(a3, b2, torch.empty(300, 49)[:, :48].t().contiguous().t(), torch.empty(300, 48), 1.0, 0.0)
    assert not launched[-1].c and launched[-1].beta == 0.0  # a null pointer
    with pytest.raises(ValueError, match="row-major b"):
        launch(a, torch.randn(48, 40).t(), None, torch.empty(64, 48), 1.0, 0.0)
    with pytest.raises(ValueError, match="stride"):
        launch(torch.randn(64, 41)[:, :40], b, None, torch.empty(64, 48), 1.0, 0.0)
    assert [p.a_batched + p.b_batched + p.batch_d + p.batch_c for p in launched] == [0] * len(launched)
    # A batch: its grid's second dim, the result's and C's batch strides per call, the maps' batch flags.
    grids = []
    monkeypatch.setattr(S.nvrtc, "PackedLaunch", lambda kernel, grid, *args, **kw: grids.append(grid) or Packed(
        kernel, grid, *args, **kw))
    a5, out5 = torch.randn(5, 300, 40), torch.empty(5, 300, 52)[..., :48]
    launch(a5, b2.expand(5, 40, 48), torch.empty(300, 48).expand(5, 300, 48), out5, 1.0, 1.0)
    p = launched[-1]
    assert grids == [(3, 5, 1)] and (p.a_batched, p.b_batched) == (1, 0)
    assert (p.ldd, p.batch_d, p.ldc, p.batch_c) == (52, 300 * 52, 48, 0)


def test_the_op_takes_large_aligned_products():
    """From a wave's worth of 64-square tiles and K 512 (the probe's 2048^3 and a batch of 8 512^3 won on
    128-square tiles, 1024^3 on 64-square ones), aligned rows, sm_90; the rest stays on the sm80-style
    3xTF32 kernel (or the op's other entries)."""
    from cute_kernels.ops.gemm import sgemm
    from cute_kernels.ops.gemm.problem import GemmProblem

    def first(**kw):
        return sgemm._variant_order(GemmProblem(**kw))[0].variant

    assert first(m=2048, n=2048, k=2048) == "tf32x3_wgmma"
    assert first(m=8192, n=6144, k=4096, beta_zero=False) == "tf32x3_wgmma"
    assert first(m=2048, n=2048, k=2048, b_major="k") == "tf32x3_wgmma"  # x @ w.t()
    assert first(m=1024, n=1024, k=1024) == "tf32x3_wgmma"  # 256 tiles of 64 x 64
    assert first(m=512, n=512, k=1024) == "tf32x3_mma"  # 64 of them
    assert first(m=2048, n=2048, k=256) == "tf32x3_mma"  # a short K
    assert first(m=128, n=4096, k=4096) == "tf32x3_mma"  # 128 tiles of 64 x 64
    assert first(m=2048, n=2048, k=2048, sm=80) == "tf32x3_mma"
    assert first(m=2048, n=2048, k=2048, a_align=1) == "tf32x3_mma"  # the op stages it; see below
    assert first(m=2048, n=2048, k=2048, a_major="m") == "tf32x3_wgmma"  # x.t() @ y
    assert first(m=2048, n=2048, k=2048, a_major="m", b_major="k") == "tf32x3_wgmma"
    assert first(m=2048, n=2048, k=2048, batch=4) == "tf32x3_wgmma"
    assert first(m=1024, n=1024, k=1024, batch=4) == "tf32x3_wgmma"  # 256 tiles over the batch
    assert first(m=1024, n=1024, k=1024, batch=2) == "tf32x3_wgmma"  # 128 of 128 x 128 (512 of 64: two waves)
    assert first(m=512, n=512, k=512, batch=8) == "tf32x3_wgmma"  # the same: 1.35x the sm80-style kernel
    assert first(m=64, n=64, k=512, batch=256) == "tf32x3_wgmma"  # 256 tiles of 64 x 64
    assert first(m=2048, n=2048, k=2048, batch=70000) != "tf32x3_wgmma"  # past the grid (the op chunks it)
    assert first(m=32, n=65536, k=4096) != "tf32x3_wgmma"
    assert first(m=16896, n=16, k=4096) != "tf32x3_wgmma"  # a skinny side wastes most of every tile
    staged = sgemm._runs_as(GemmProblem(m=2047, n=2049, k=2047, a_align=1, b_align=1, c_align=1))
    assert sgemm._variant_order(staged)[0].variant == "tf32x3_wgmma"


def test_config_and_problem_validation():
    with pytest.raises(ValueError, match="num_stages"):
        S.Sm90Tf32x3Config(5)
    with pytest.raises(ValueError, match="tile"):
        S.Sm90Tf32x3Config(4, 96)
    assert S.Sm90Tf32x3Config(3).short() == "s3"  # the op's error messages name configs by it
    assert S.Sm90Tf32x3Config(3, 64).short() == "s3_t64"
    from cute_kernels.ops.gemm.problem import GemmProblem

    ok = GemmProblem(m=300, n=200, k=100)
    assert S.why_unsupported(S.Sm90Tf32x3Config(), ok) is None
    assert "Sm90Tf32x3Config" in S.why_unsupported(object(), ok)
    assert "float32" in S.why_unsupported(S.Sm90Tf32x3Config(), GemmProblem(m=300, n=200, k=100, dtype="float16"))
    assert "16-byte" in S.why_unsupported(S.Sm90Tf32x3Config(), GemmProblem(m=300, n=200, k=100, b_align=2))
    assert S.why_unsupported(S.Sm90Tf32x3Config(), GemmProblem(m=300, n=200, k=100, a_major="m")) is None
    assert S._name_expression(S.Sm90Tf32x3Config(3), GemmProblem(m=300, n=200, k=100, a_major="m", b_major="k")) == (
        "sgemm_sm90::sgemm_tf32x3_kernel<3, true, true>")
    assert S._name_expression(S.Sm90Tf32x3Config(2, 64), GemmProblem(m=300, n=200, k=100)) == (
        "sgemm_sm90::sgemm_tf32x3_kernel<2, false, false, 64>")
    assert S.default_config(GemmProblem(m=64, n=64, k=512, batch=256)).tile == 64
    assert S.default_config(GemmProblem(m=65, n=16384, k=512)).tile == 128  # 512 tiles of 64: two waves
    assert S.default_config(GemmProblem(m=65, n=4096, k=512)).tile == 64  # 128 of them: one wave
    assert S.default_config(GemmProblem(m=1024, n=1024, k=1024)).tile == 64
    assert S.default_config(GemmProblem(m=256, n=256, k=512, batch=64)).tile == 128
    assert len(S.candidates()) == 6
    assert S.why_unsupported(S.Sm90Tf32x3Config(), GemmProblem(m=300, n=200, k=100, batch=2)) is None
    assert "grid" in S.why_unsupported(S.Sm90Tf32x3Config(), GemmProblem(m=300, n=200, k=100, batch=65536))
    assert "sm_90" in S.why_unsupported(S.Sm90Tf32x3Config(), GemmProblem(m=300, n=200, k=100, sm=100))


def test_the_registry_launcher_keeps_its_launches(monkeypatch):
    """The benchmark's repeated calls of the entry's launcher reuse one launch per config, problem and
    operand layout (a fresh one would be built, and its maps encoded, on every timed call); the op's own
    plans hold theirs (``gemm_spec(keep_launches=True)``). CPU tensors: the launch's set-up and call
    replaced."""
    from cute_kernels.ops.gemm import spec as gemm_spec_module
    from cute_kernels.ops.gemm.problem import GemmProblem

    made, ran = [], []
    monkeypatch.setattr(S, "Sm90Tf32x3Launch", lambda config, b_k_major, device_index, a_m_major: made.append(config) or
                        (lambda a, b, c, o, alpha, beta: ran.append(o)))
    monkeypatch.setattr(gemm_spec_module, "_kept_launches", {})
    problem = GemmProblem(m=64, n=48, k=40)
    inputs = {"a": torch.randn(64, 40), "b": torch.randn(40, 48), "alpha": 1.5, "beta": 0.0}
    out = torch.empty(64, 48)
    for _ in range(3):
        assert S.SPEC.launch(S.Sm90Tf32x3Config(), problem, inputs, out) is out
    assert len(made) == 1 and len(ran) == 3
    S.SPEC.launch(S.Sm90Tf32x3Config(3), problem, inputs, out)
    wide = torch.empty(64, 52)[:, :48]
    S.SPEC.launch(S.Sm90Tf32x3Config(), problem, inputs, wide)
    assert len(made) == 3


def test_a_64_square_tile_launch_has_its_grid_block_shared_memory_and_boxes(monkeypatch):
    """The 64-square tile: tiles of 64 along M and N, 256 threads, Shared<64>'s bytes, and 64-wide boxes of
    a row-major A and a K-major B (a row-major B and a column-major A keep their 32 x 32 boxes)."""
    import threading

    made, boxes = [], []

    class Map:
        def __init__(self, dtype, dims, strides, box):
            boxes.append(tuple(box))

        def encode(self, address, destination):
            pass

    class Packed:
        def __init__(self, kernel, grid, block, args, shared_mem=0, lock=None):
            made.append((kernel, grid, block, shared_mem))
            self.lock = threading.Lock()

        def launch(self, stream):
            pass

    monkeypatch.setattr(S.nvrtc, "kernel_for", lambda source, name, *args, **kw: name)
    monkeypatch.setattr(S.tma, "TiledMap", Map)
    monkeypatch.setattr(S.nvrtc, "PackedLaunch", Packed)
    monkeypatch.setattr(S, "current_stream_handle", lambda device: 0)
    monkeypatch.setattr(S, "device_sm", lambda t: 90)
    launch = S.Sm90Tf32x3Launch(S.Sm90Tf32x3Config(3, 64), True, 0)
    a, w = torch.randn(8, 65, 40), torch.randn(8, 130, 40)
    launch(a, w.transpose(1, 2), None, torch.empty(8, 65, 130), 1.0, 0.0)
    assert made == [("sgemm_sm90::sgemm_tf32x3_kernel<3, true, false, 64>", (2 * 3, 8, 1), (256, 1, 1),
                     S.shared_bytes(64))]
    assert boxes == [(32, 64, 1, 1), (32, 64, 1, 1)]
