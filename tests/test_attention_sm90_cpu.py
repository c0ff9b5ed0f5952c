"""CPU tier: the Hopper attention forward (flash3_wgmma) without a GPU: its configs and predicate, the op's
routing, the launch parameters' layout, the TMA maps' fixed parts, and every candidate compiled for sm_90a
with ptxas's report: no spills, the registers the setmaxnreg split assumes, no serialised wgmma."""

import ctypes
import re
from pathlib import Path

import pytest
import torch

from cute_kernels import registry
from cute_kernels.ops.attention import flash3_wgmma as f3
from cute_kernels.ops.attention import op as aop
from cute_kernels.ops.attention import problem as prob
from cute_kernels.runtime import nvrtc, tma

F16, B16 = torch.float16, torch.bfloat16


def P(m=300, n=300, d=128, dtype=F16, causal=False, **kw):
    kw.setdefault("vector", 8)
    return prob.AttentionProblem(kw.pop("batch", 1), kw.pop("heads", 2), m, n, d, dtype, causal, **kw)


def test_config_validation():
    with pytest.raises(ValueError, match="Flash3Config.block_n"):
        f3.Flash3Config(block_n=96)
    with pytest.raises(ValueError, match="Flash3Config.stages"):
        f3.Flash3Config(stages=4)
    with pytest.raises(TypeError):
        f3.Flash3Config(overlap=1)
    with pytest.raises(ValueError, match="Flash3Config.consumers"):
        f3.Flash3Config(consumers=4)
    # Q (128 or 192 x d) + K and V per stage
    with pytest.raises(ValueError, match="Flash3Config.dynamic"):
        f3.Flash3Config(persistent=False, dynamic=True)
    # ... + 10 barriers + the pin slots (16 bytes) + 1024 of alignment.
    assert f3.Flash3Config(128, 2).shared_bytes(128) == 128 * 128 * 2 + 4 * 128 * 128 * 2 + 80 + 16 + 1024
    assert f3.Flash3Config(128, 2, consumers=3).shared_bytes(64) == 192 * 64 * 2 + 4 * 128 * 64 * 2 + 80 + 16 + 1024
    assert (f3.Flash3Config().block_m, f3.Flash3Config().threads) == (128, 384)
    assert (f3.Flash3Config(consumers=3).block_m, f3.Flash3Config(consumers=3).threads) == (192, 512)
    # A second Q buffer: 128 x d more, and its two barriers. With the TMA-store tiles at d 128 it still fits
    # the H200's 226 KB a CTA (230512 of 231424 bytes).
    two = f3.Flash3Config(tma_store=True, q_buffers=2)
    assert two.shared_bytes(128) == 3 * 128 * 128 * 2 + 4 * 128 * 128 * 2 + 96 + 16 + 1024 == 230512
    assert f3.flash3_why_unsupported(two, P(d=128)) is None
    assert f3.flash3_name_expression(two, P(d=128)).endswith(", true, 2>")
    assert f3.flash3_name_expression(f3.Flash3Config(tma_store=True), P(d=128)).endswith(", true>")
    with pytest.raises(ValueError, match="Flash3Config.q_buffers"):
        f3.Flash3Config(q_buffers=3)
    with pytest.raises(ValueError, match="Flash3Config.q_buffers"):
        f3.Flash3Config(persistent=False, q_buffers=2)


def test_why_unsupported():
    ok = f3.Flash3Config()
    assert f3.flash3_why_unsupported(ok, P()) is None
    assert f3.flash3_why_unsupported(ok, P(d=64, dtype=B16, causal=True)) is None
    assert "sm_90" in f3.flash3_why_unsupported(ok, P(sm=80))
    assert "sm_90" in f3.flash3_why_unsupported(ok, P(sm=100))
    assert "float16" in f3.flash3_why_unsupported(ok, P(dtype=torch.float32, vector=4))
    assert "head dim" in f3.flash3_why_unsupported(ok, P(d=264))
    assert f3.flash3_why_unsupported(ok, P(d=96)) is None  # run as d 128 (TMA reads zeros past column 96)
    assert "attention_sm90::forward_kernel<__half, 2, 128, 128," in f3.flash3_name_expression(ok, P(d=96))
    assert f3.flash3_name_expression(f3.Flash3Config(80), P(d=192)).startswith("attention_sm90::forward_kernel<__half, 2, 256, 80,")
    three = f3.Flash3Config(consumers=3)
    assert f3.flash3_why_unsupported(three, P(d=64)) is None and f3.flash3_why_unsupported(three, P(d=40)) is None
    assert "head dim 64" in f3.flash3_why_unsupported(three, P(d=72))
    assert "16-byte" in f3.flash3_why_unsupported(ok, P(vector=1))
    assert "16 bytes" in f3.flash3_why_unsupported(ok, P(tma=False))
    assert f3.flash3_why_unsupported(ok, P(window=(64, 0), num_sinks=4, lse=True)) is None
    assert f3.flash3_why_unsupported(ok, P(lse=True)) is None
    assert "shared memory" in f3.flash3_why_unsupported(ok, P(shared_limit=99 * 1024))
    # d 256: Q and two stages of 80-key (or 64-key) K and V fit the H200's 226 KB; 128-key tiles do not.
    assert f3.flash3_why_unsupported(f3.Flash3Config(80), P(d=256)) is None
    assert f3.flash3_why_unsupported(f3.Flash3Config(64), P(d=256, dtype=B16, causal=True)) is None
    assert "shared memory" in f3.flash3_why_unsupported(ok, P(d=256))
    assert "shared memory" in f3.flash3_why_unsupported(f3.Flash3Config(64, 3), P(d=256))
    assert "spill" in f3.flash3_why_unsupported(f3.Flash3Config(80), P(d=256, window=(64, 0)))
    assert f3.flash3_why_unsupported(f3.Flash3Config(80, overlap=False), P(d=256, window=(64, 0))) is None
    assert "grid" in f3.flash3_why_unsupported(ok, P(m=2**20, heads=2**16, batch=4))


def test_routing():
    """On sm_90 the op runs the 16-bit calls flash3_wgmma takes, the others on flash2_mma; a config names its
    entry by its class."""
    def entry(config=None, **kw):
        return aop.default_entry(P(**kw), config).variant

    assert entry() == "flash3_wgmma"
    assert entry(dtype=B16, d=64, causal=True, kv_heads=1) == "flash3_wgmma"
    assert entry(lse=True, causal=True) == "flash3_wgmma"
    assert entry(window=(16, 0), num_sinks=2) == "flash3_wgmma"
    assert entry(d=256, dtype=B16, causal=True) == "flash3_wgmma"
    assert entry(d=40) == entry(d=200) == "flash3_wgmma"
    for kw in ({"vector": 1}, {"sm": 80}, {"shared_limit": 99 * 1024}):
        assert entry(**kw) == "flash2_mma", kw
    assert entry(dtype=torch.float32, vector=4) == "fused_fp32"
    assert entry(config=f3.Flash3Config(64)) == "flash3_wgmma"
    from cute_kernels.ops.attention.flash2_mma import FlashConfig

    assert entry(config=FlashConfig()) == "flash2_mma"


def test_params_layout():
    """attention_sm90::Params: maps at 0 / 128 / 256 / 384 (64-byte aligned), then o, lse, o's strides, the
    sizes (the unit groups' pairs among them), the scheduler's counters and the units' words; 640 bytes as the kernel static_asserts, and an
    instance the driver may write maps into (64-aligned)."""
    assert ctypes.sizeof(f3.Params) == f3.PARAMS_BYTES == 640
    assert [getattr(f3.Params, f"{n}_map").offset for n in "qkvo"] == [0, 128, 256, 384]
    assert f3.Params.o.offset == 512 and f3.Params.lse.offset == 520 and f3.Params.heads.offset == 552
    assert f3.Params.scale_log2.offset == 568 and f3.Params.m_blocks.offset == 572 and f3.Params.units.offset == 576
    assert f3.Params.group_pairs.offset == 580 and f3.Params.num_sinks.offset == 596 and f3.Params.d.offset == 600
    assert f3.Params.scheduler.offset == 608 and f3.Params.unit_slots.offset == 616  # 8-aligned past d
    for _ in range(8):
        assert ctypes.addressof(tma.aligned_instance(f3.Params)) % 64 == 0


def test_tma_enums_match_the_driver():
    from cuda.bindings import driver

    assert tma.DATA_TYPES[F16] == driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    assert tma.DATA_TYPES[B16] == driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    assert tma.DATA_TYPES[torch.float32] == driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32
    assert tma.SWIZZLE_128B == driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B
    assert tma.SWIZZLE_NONE == driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE
    assert tma.L2_PROMOTION_128B == driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B
    assert tma.OOB_FILL_ZEROS == driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE
    assert tma.INTERLEAVE_NONE == driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE
    assert ctypes.sizeof(tma.TmaMapBytes) == tma.MAP_BYTES


def test_maps_of_every_layout():
    """(dims, byte strides, box) of 4-D, strided (B, S, H, d) views, 3-D and 2-D operands; a dim of size 1
    gets a valid stride (what lies inside it)."""
    t = torch.empty(2, 3, 100, 64, dtype=F16)
    assert f3._map_of(t, 100, 128) == ((64, 100, 3, 2), (128, 100 * 128, 300 * 128), (64, 128, 1, 1))
    bshd = torch.empty(2, 100, 3, 64, dtype=F16).transpose(1, 2)
    assert f3._map_of(bshd, 100, 64) == ((64, 100, 3, 2), (3 * 128, 128, 300 * 128), (64, 64, 1, 1))
    assert f3._map_of(torch.empty(3, 100, 128, dtype=B16), 100, 128) == (
        (128, 100, 3, 1), (256, 100 * 256, 300 * 256), (64, 128, 1, 1))
    assert f3._map_of(torch.empty(100, 64, dtype=F16), 100, 128) == (
        (64, 100, 1, 1), (128, 100 * 128, 100 * 128), (64, 128, 1, 1))
    assert f3._map_of(torch.empty(1, 64, dtype=F16), 1, 128)[1] == (128, 128, 128)
    assert f3.map_why_not(t, 100, 128) is None
    odd = torch.empty(2, 3, 100, 68, dtype=F16)[..., :64]  # row stride 136 bytes: not a multiple of 16
    assert "stride" in f3.map_why_not(odd, 100, 128)
    shifted = torch.empty(6401, dtype=F16)[1:].view(1, 1, 100, 64)
    assert "aligned" in f3.map_why_not(shifted, 100, 128)


def _names(d):
    # Every candidate in fp16 and the default in bf16 too (bf16 changes only the conversions to P and O).
    plain = [P(d=d, causal=causal) for causal in (False, True)]
    bf16 = [P(m, m, d, B16, causal, batch=4, heads=16) for m in (300, 4096) for causal in (False, True)]
    # The log-sum-exp and windows (with sinks, and both) on the default and three other loops, in fp16.
    flagged = [P(d=d, causal=causal, lse=lse, window=window) for causal in (False, True)
               for lse, window in ((True, None), (False, (64, 0)), (True, (64, 64)))]
    block_n = f3.flash3_default_config(P(d=d)).block_n
    configs = [f3.Flash3Config(block_n), f3.Flash3Config(64), f3.Flash3Config(block_n, overlap=False, pingpong=False),
               f3.Flash3Config(consumers=3)]
    fits = lambda c, p: f3.flash3_why_unsupported(c, p) is None  # noqa: E731
    return sorted({f3.flash3_name_expression(c, p) for c in f3.flash3_candidates() for p in plain if fits(c, p)}
                  | {f3.flash3_name_expression(f3.flash3_default_config(p), p) for p in bf16 + flagged}
                  | {f3.flash3_name_expression(c, p) for c in configs for p in flagged if fits(c, p)})


@pytest.mark.exhaustive
@pytest.mark.parametrize("d", f3.HEAD_DIMS)
def test_every_candidate_compiles_for_sm90a_without_spills(d, tmp_path, monkeypatch):
    """Every candidate, dtype and causal flag (the log-sum-exp and windows on three loops), at both head
    dims: the launch-time register count the setmaxnreg split starts from (168 for 384 threads, whose
    producer takes 24 and two consumers 240; 128 for 512 threads, three consumers at 160), no spill traffic
    and no wgmma serialised by ptxas (C7514)."""
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    usage = nvrtc.resource_usage(f3.SOURCE, _names(d), "sm_90a")
    launch_registers = {"2": 168, "3": 128}  # by the name's second template argument, the consumers
    wrong = {n: r for n, r in usage.items()
             if r.spill_stores or r.spill_loads or r.registers != launch_registers[n.split(", ")[1]] or r.wgmma_serialized}
    assert not wrong, wrong


def test_fma_exp2_follows_q_buffers_in_the_name():
    """The kernel's template takes kQBuffers, then kFmaExp2Every: a polynomial share names both, in order."""
    name = f3.flash3_name_expression
    assert name(f3.Flash3Config(tma_store=True, fma_exp2=4), P()).endswith(", true, 1, 4>")
    assert name(f3.Flash3Config(tma_store=True, q_buffers=2, fma_exp2=8), P()).endswith(", true, 2, 8>")
    assert name(f3.Flash3Config(tma_store=True, q_buffers=2), P()).endswith(", true, 2>")
    assert name(f3.Flash3Config(tma_store=True), P()).endswith(", true>")
    with pytest.raises(ValueError, match="Flash3Config.fma_exp2"):
        f3.Flash3Config(fma_exp2=3)


def test_serialised_wgmma_is_reported():
    """The C7514 check above can fail: ptxas's warning, as NVRTC logs it, names the function."""
    log = ("ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
           "non wgmma instructions reading accumulator registers of  a wgmma between start and end of the pipeline "
           "stage in the function '_Zfoo' in line 0\n")
    assert nvrtc._PTXAS_WGMMA_SERIALIZED_RE.findall(log) == ["_Zfoo"]


def test_default_config():
    """128-key tiles, overlap and ping-pong, persistent CTAs; causal calls without a window take the dynamic
    scheduler (their units' costs differ too much for a fixed stride) with the units grouped by L2 (below d
    256); up to 1024 keys a second Q buffer where it fits in shared memory (d 256 has no room for it)."""
    L = 4096  # long enough for one Q buffer
    assert f3.flash3_default_config(P(L, L)) == f3.Flash3Config(128, 2, True, True, True, tma_store=True)
    assert f3.flash3_default_config(P(L, L, causal=True)) == f3.Flash3Config(dynamic=True, tma_store=True,
                                                                           grouped_units=True)
    assert f3.flash3_default_config(P(L, L, causal=True, window=(64, 0))) == f3.Flash3Config(tma_store=True)
    assert f3.flash3_default_config(P(d=256)) == f3.Flash3Config(80)
    assert f3.flash3_default_config(P(d=256, causal=True)) == f3.Flash3Config(80, dynamic=True)
    assert f3.flash3_default_config(P(d=256, window=(64, 0))) == f3.Flash3Config(64)
    # d 64: three consumers where their 192-row units add no round of units per SM (nor padded rows).
    assert f3.flash3_default_config(P(4096, 4096, 64, batch=4, heads=16)) == f3.Flash3Config(consumers=3, tma_store=True)
    assert f3.flash3_default_config(P(3000, 3000, 40, heads=12)).consumers == 3
    for m, batch in ((2048, 1), (256, 16), (1024, 1)):
        assert f3.flash3_default_config(P(m, m, 64, batch=batch, heads=16)).consumers == 2, (m, batch)
    assert f3.flash3_default_config(P(4096, 4096, 128, batch=4, heads=16)).consumers == 2
    # Causal: the same rule under the dynamic scheduler; with a window, a fixed stride and two consumers.
    assert f3.flash3_default_config(P(4096, 4096, 64, batch=4, heads=16, causal=True)) == f3.Flash3Config(
        consumers=3, dynamic=True, tma_store=True, grouped_units=True)
    assert f3.flash3_default_config(P(4096, 4096, 64, batch=4, heads=16, causal=True, window=(64, 0))) == (
        f3.Flash3Config(tma_store=True))
    # Short sequences: the same choices with a second Q buffer.
    assert f3.flash3_default_config(P()) == f3.Flash3Config(tma_store=True, q_buffers=2)
    assert f3.flash3_default_config(P(256, 256, 64, batch=16, heads=16)) == f3.Flash3Config(tma_store=True, q_buffers=2)
    assert f3.flash3_default_config(P(512, 512, 64, batch=8, heads=16, causal=True)) == f3.Flash3Config(
        dynamic=True, tma_store=True, q_buffers=2, grouped_units=True)
    assert f3.flash3_default_config(P(4096, 1024, 128, causal=True, window=(64, 0))) == f3.Flash3Config(
        tma_store=True, q_buffers=2)
    assert f3.flash3_default_config(P(1024, 1025)).q_buffers == 1
    for d in (8, 64, 96, 128):
        assert f3.flash3_default_config(P(d=d)).q_buffers == 2, d
    # d up to 128 stores O through TMA; d 256 has no room for its tiles.
    assert all(f3.flash3_default_config(P(d=d)).tma_store for d in (8, 64, 96, 128))
    assert not f3.flash3_default_config(P(d=200)).tma_store


def test_broadcast_operands_are_not_described_by_tma():
    """k and v expanded over heads or batches (stride 0): TMA takes no zero stride, so such calls stay on
    flash2_mma (they did before flash3_wgmma existed); a size-1 dim's stride does not matter."""
    q = torch.empty(2, 8, 1024, 128, dtype=F16)
    k1 = torch.empty(2, 1, 1024, 128, dtype=F16)
    assert not f3.tma_describes(q, k1.expand(2, 8, 1024, 128), k1.expand(2, 8, 1024, 128))
    assert not f3.tma_describes(q, *(torch.empty(1, 8, 1024, 128, dtype=F16).expand(2, 8, 1024, 128),) * 2)
    assert f3.tma_describes(q, k1, k1) and f3.tma_describes(q[0, 0], q[0, 0], q[0, 0])
    assert aop.default_entry(P(tma=False)).variant == "flash2_mma"


def test_sm90_compiles_build_the_sm90a_kernel(tmp_path, monkeypatch):
    """The tools compile NVRTC entries for the device's plain arch (sm_90); this entry's kernels exist only
    for sm_90a, so its compile builds that (the trap-only sm_90 body would be a cubin no launch loads)."""
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    spec = registry.get("attention", "flash3_wgmma")
    assert spec.compile(f3.Flash3Config(), P(), "sm_90").arch == "sm_90a"
    assert spec.compile(f3.Flash3Config(), P(), "sm_80").arch == "sm_80"


def _cuobjdump_dir() -> Path | None:
    """The folder of cuobjdump and the nvdisasm it runs: the nvidia-cuda-cuobjdump / -nvdisasm wheels' (dev
    dependencies: installed, they must be there), else PATH's (a machine without the dev extras, such as the
    lent GPU machines)."""
    import importlib.metadata
    import shutil

    import nvidia

    for root in nvidia.__path__:
        folder = Path(root) / "cu13" / "bin"
        if (folder / "cuobjdump").exists() and (folder / "nvdisasm").exists():
            return folder
    for wheel in ("nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm"):
        try:
            importlib.metadata.version(wheel)
        except importlib.metadata.PackageNotFoundError:
            continue
        raise AssertionError(f"{wheel} is installed but nvidia/cu13/bin lacks its tool")
    tool = shutil.which("cuobjdump")
    return Path(tool).parent if tool and shutil.which("nvdisasm") else None


@pytest.mark.parametrize("problem", [P(4096, 4096, 64), P(4096, 4096, 128, B16, causal=True), P(2048, 2048, 256),
                                     P(4096, 4096, 128, causal=True, window=(256, 0), num_sinks=4, heads=8,
                                       kv_heads=2, lse=True)],
                         ids=["d64", "d128-bf16-causal", "d256", "d128-window-sinks-gqa-lse"])
def test_the_sass_of_the_defaults_has_hgmma_and_tma_loads_and_no_local_memory(problem, monkeypatch, tmp_path):
    """What the kernel's header says of its SASS: HGMMA and UTMALDG in every default, the TMA store's
    UTMASTG where the epilogue takes it, and no local memory (LDL/STL). The dev extras bring the tools; a
    machine without them and without a CUDA toolkit on PATH cannot read SASS at all, and says so."""
    import os
    import subprocess

    folder = _cuobjdump_dir()
    if folder is None:
        pytest.skip("no cuobjdump and nvdisasm: pip install -e \".[dev]\" brings them")
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")  # cuobjdump runs nvdisasm
    spec = registry.get("attention", "flash3_wgmma")
    config = f3.flash3_default_config(problem)
    cubin = tmp_path / "kernel.cubin"
    cubin.write_bytes(spec.compile(config, problem, "sm_90a").data)
    run = subprocess.run([str(folder / "cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True)
    assert run.returncode == 0, f"{folder / 'cuobjdump'}: {run.stderr.strip()[:500]}"
    sass = run.stdout
    opcodes = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass)
    assert opcodes, "cuobjdump printed no SASS"
    assert opcodes.count("HGMMA") >= 8 and opcodes.count("UTMALDG") >= 3, (opcodes.count("HGMMA"), opcodes.count("UTMALDG"))
    assert "LDL" not in opcodes and "STL" not in opcodes
    assert ("UTMASTG" in opcodes) == config.tma_store


def test_registry_entry():
    spec = registry.get("attention", "flash3_wgmma")
    assert spec.sources == (f3.SOURCE,) and spec.backend == "nvrtc"
    assert spec.default_config(P()) in spec.candidates()
    assert all(spec.supports(spec.default_config(p), p) for p in spec.standard_problems())


def test_launches_encode_maps_only_for_new_pointers(monkeypatch):
    """The registry's launch prepares a call structure once; every launch writes its o/lse pointers and scale,
    and a tensor map is encoded again only when its tensor's pointer changed. CPU tensors: the kernel load,
    the driver launch and the map encoder are replaced."""
    import threading

    monkeypatch.setattr(f3, "_registry_launches", {})
    monkeypatch.setattr(f3.nvrtc, "kernel_for", lambda *args, **kw: "kernel")
    monkeypatch.setattr(f3, "sm_count", lambda device: 132)
    monkeypatch.setattr(prob, "current_stream_handle", lambda device: 0)
    encoded, launched, packed = [], [], []

    class Map:
        def __init__(self, dtype, dims, strides, box):
            self.dims = dims

        def encode(self, address, destination):
            encoded.append(address)

    class Packed:
        def __init__(self, kernel, grid, block, args, shared_mem=0, lock=None):
            self.args, self.grid, self.lock = args, grid, threading.Lock()
            packed.append(self)

        def launch(self, stream):
            launched.append(f3.Params.from_buffer_copy(self.args[0]))

    monkeypatch.setattr(f3.tma, "TiledMap", Map)
    monkeypatch.setattr(f3.nvrtc, "PackedLaunch", Packed)
    problem = P(m=300, n=500, d=64, batch=2, heads=4, lse=True, window=(30, 0), num_sinks=2, causal=True)
    q = torch.randn(2, 4, 300, 64, dtype=F16)
    k, v = (torch.randn(2, 4, 500, 64, dtype=F16) for _ in range(2))
    outs = [torch.empty_like(q) for _ in range(2)]
    config = f3.Flash3Config()
    f3.flash3_launch(config, problem, {"q": q, "k": k, "v": v, "scale": 0.5}, outs[0])
    f3.flash3_launch(config, problem, {"q": q, "k": k, "v": v}, outs[1])
    k2 = torch.randn_like(k)
    f3.flash3_launch(config, problem, {"q": q, "k": k2, "v": v}, outs[1])
    assert len(packed) == 1 and packed[0].grid == (min(132, 3 * 8), 1, 1)
    assert encoded == [q.data_ptr(), k.data_ptr(), v.data_ptr(), k2.data_ptr()]
    assert [p.o for p in launched] == [outs[0].data_ptr(), outs[1].data_ptr(), outs[1].data_ptr()]
    assert all(p.lse for p in launched)
    assert launched[0].scale_log2 == pytest.approx(0.5 * prob.LOG2E)
    assert launched[1].scale_log2 == pytest.approx(64 ** -0.5 * prob.LOG2E)
    p = launched[0]
    assert (p.heads, p.m, p.n, p.kv_group, p.m_blocks, p.units) == (4, 300, 500, 1, 3, 24)
    assert (p.causal, p.window_left, p.window_right, p.num_sinks) == (1, 30, 0, 2)
    assert (p.o_batch_stride, p.o_head_stride, p.o_row_stride) == (4 * 300 * 64, 300 * 64, 64)


@pytest.mark.parametrize("dynamic", [False, True])
def test_the_units_words(dynamic, monkeypatch):
    """With the dynamic scheduler each launch takes, beside the stream's zeroed counters, a word per (CTA, Q
    buffer) from its uninitialised partials, through which the consumers learn each unit; at a fixed stride
    neither (the consumers count the units themselves)."""
    import threading

    monkeypatch.setattr(f3, "_registry_launches", {})
    monkeypatch.setattr(f3.nvrtc, "kernel_for", lambda *args, **kw: "kernel")
    monkeypatch.setattr(f3, "sm_count", lambda device: 132)
    monkeypatch.setattr(prob, "current_stream_handle", lambda device: 0)
    asked = []
    buffers = {"arrivals": torch.zeros(1 << 14, dtype=torch.int32), "partials": torch.empty(1 << 14)}

    def stream_buffer(kind, device, stream, numel):
        asked.append((kind, numel))
        return buffers[kind]

    monkeypatch.setattr(f3, "stream_buffer", stream_buffer)
    monkeypatch.setattr(f3.tma, "TiledMap", lambda *args: type("Map", (), {"encode": lambda self, a, d: None})())
    launched = []

    class Packed:
        def __init__(self, kernel, grid, block, args, shared_mem=0, lock=None):
            self.args, self.grid, self.lock = args, grid, threading.Lock()

        def launch(self, stream):
            launched.append(f3.Params.from_buffer_copy(self.args[0]))

    monkeypatch.setattr(f3.nvrtc, "PackedLaunch", Packed)
    problem = P(m=4096, n=4096, d=64, batch=2, heads=4, causal=True)
    q, k, v = (torch.randn(2, 4, 4096, 64, dtype=F16) for _ in range(3))
    config = f3.Flash3Config(dynamic=dynamic, q_buffers=2)
    for _ in range(2):
        f3.flash3_launch(config, problem, {"q": q, "k": k, "v": v}, torch.empty_like(q))
    assert len(launched) == 2
    for p in launched:
        assert p.unit_slots == (buffers["partials"].data_ptr() if dynamic else None)
        assert p.scheduler == (buffers["arrivals"].data_ptr() if dynamic else None)
    assert asked == ([("arrivals", 2), ("partials", 132 * 2)] * 2 if dynamic else [])


# ---- the wgmma backward (attention_sm90.cu's backward_dkdv_kernel / backward_dq_kernel) ----------------------


def test_backward_params_layout():
    """attention_sm90::BwdParams: five maps, five pointers, nine strides, six ints, two floats; 832 bytes as the
    kernel static_asserts."""
    from cute_kernels.ops.attention import backward as bwd

    p = bwd.Sm90BwdParams
    assert ctypes.sizeof(p) == 832
    assert [getattr(p, f"{n}_map").offset for n in ("q", "k", "v", "do", "rows")] == [0, 128, 256, 384, 512]
    assert (p.lse.offset, p.delta.offset, p.dq.offset, p.dv.offset) == (640, 648, 656, 672)
    assert (p.dq_batch_stride.offset, p.dv_row_stride.offset) == (680, 744)
    assert (p.heads.offset, p.kv_group.offset, p.causal.offset, p.scale.offset, p.scale_log2.offset) == (
        752, 768, 772, 776, 780)


def test_stage_rows_map_is_one_box_per_stage():
    """The dK/dV kernel's map of the delta kernel's stage rows: (M, 2, batch * heads, 1) over a pitch of M
    rounded up to 4 floats (16-byte strides, which TMA requires), one box a stage's [lse2 | D][rows]."""
    from cute_kernels.ops.attention import backward as bwd

    rows = bwd._stage_rows(6, 1001, "cpu")
    assert rows.shape == (6, 2, 1004) and rows.dtype == torch.float32
    dims, strides, box = bwd._stage_rows_map(rows, 1001, 128)
    assert (dims, strides, box) == ((1001, 2, 6, 1), (4016, 8032, 48192), (128, 2, 1, 1))
    assert tma.why_not(rows, dims, strides, box) is None


def test_backward_tiles_fit_the_h200():
    """Each kernel's shared memory (its layout's kAllocBytes) within sm_90's opt-in limit, every head dim: the
    kept tiles (64 rows per consumer warpgroup), the streamed tiles' two stages, the dK/dV kernel's lse2 and D
    rows, the barriers and the alignment."""
    from cute_kernels.ops.attention import backward as bwd
    from cute_kernels.runtime.device import SM90_SHARED_BYTES

    for d, tile in bwd.SM90_BWD_TILES.items():
        assert tile.kept == 128
        dkdv, dq = bwd.sm90_bwd_shared_bytes("dkdv", d, tile), bwd.sm90_bwd_shared_bytes("dq", d, tile)
        assert dkdv == 2 * 128 * d * 2 + 2 * 2 * tile.query_rows * d * 2 + 2 * 2 * tile.query_rows * 4 + 8 * 5 + 1024
        assert dq == 2 * 128 * d * 2 + 2 * 2 * tile.keys * d * 2 + 8 * 5 + 1024
        assert max(dkdv, dq) <= SM90_SHARED_BYTES
    # float32 as three bf16 planes: every tile three times; at d 128 two consumers sharing 64 kept rows.
    split = bwd.SM90_BWD_PLANE_TILES[128]
    assert split.split_steps and split.kept == 64
    for d, tile in bwd.SM90_BWD_PLANE_TILES.items():
        dkdv = bwd.sm90_bwd_shared_bytes("dkdv", d, tile, planes=3)
        dq = bwd.sm90_bwd_shared_bytes("dq", d, tile, planes=3)
        kept = tile.kept
        assert dkdv == 3 * (2 * kept * d * 2 + 2 * 2 * tile.query_rows * d * 2) + 2 * 2 * tile.query_rows * 4 + 8 * 5 + 1024
        assert dq == 3 * (2 * kept * d * 2 + 2 * 2 * tile.keys * d * 2) + 8 * 5 + 1024
        assert max(dkdv, dq) <= SM90_SHARED_BYTES
    # Two consumers' own 128 kept rows would not fit at d 128: why the planes' d 128 shape splits the steps.
    assert bwd.sm90_bwd_shared_bytes("dq", 128, bwd.Sm90BwdTile(32, 32), planes=3) > SM90_SHARED_BYTES


def test_a_backward_tile_keeps_what_its_kernels_keep():
    """The host derives a tile's kept rows as the kernels do: 64 for each of two consumers, or 64 that both
    share when they split the steps."""
    from cute_kernels.ops.attention import backward as bwd

    assert bwd.Sm90BwdTile(32, 32, split_steps=True).kept == 64 and bwd.Sm90BwdTile(32, 32).kept == 128
    # The launch's block is the kernels' __launch_bounds__: the producer warpgroup and kBwdConsumers.
    source = (Path(__file__).parents[1] / "legacy_cuda" / "attention_sm90.cu").read_text()
    consumers = int(re.search(r"constexpr int kBwdConsumers = (\d+);", source).group(1))
    assert bwd.SM90_BWD_THREADS == 128 * (1 + consumers)


def test_backward_kernels_compile_for_sm90a_without_spills(tmp_path, monkeypatch):
    """Both kernels, both 16-bit dtypes, both head dims, causal or not, and float32 as bf16 planes: 168
    registers at launch (the producer releases to 40, the consumers take 232; the split-steps d 128 planes'
    dK/dV consumers take 240). No spill traffic (but the split dK/dV kernel's few words), no wgmma serialised
    by ptxas."""
    from cute_kernels.ops.attention import backward as bwd

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    names = tuple(name for dtype in (F16, B16) for d in bwd.SM90_BWD_HEAD_DIMS for causal in (False, True)
                  for name in bwd.sm90_bwd_name_expressions(dtype, d, causal))
    names += tuple(name for d in bwd.SM90_BWD_PLANE_TILES for causal in (False, True)
                   for name in bwd.sm90_bwd_name_expressions(torch.float32, d, causal))
    assert len(names) == 24
    split = {name for causal in (False, True) for name in bwd.sm90_bwd_name_expressions(torch.float32, 128, causal)}
    assert all(name.endswith(", 3, float, true>") for name in split)
    usage = nvrtc.resource_usage(bwd.SM90_SOURCE, names, "sm_90a")
    # The split dK/dV kernel's consumers (240 registers) spill a few loop-invariant words; no more than that.
    spills_allowed = {name: 16 for name in split if "dkdv" in name}
    wrong = {n: r for n, r in usage.items()
             if r.spill_stores > spills_allowed.get(n, 0) or r.spill_loads > 2 * spills_allowed.get(n, 0)
             or r.wgmma_serialized or r.registers != 168}
    assert not wrong, wrong


def test_backward_routing(monkeypatch):
    """The wgmma backward takes 16-bit calls on sm_90 without a window, d up to 128, operands TMA reads and
    outputs pairs can be written to; it names why it declines the others."""
    from cute_kernels.ops.attention import backward as bwd

    monkeypatch.setattr(bwd, "capability", lambda device: (9, 0))

    def why(d=64, dtype=F16, window=None, offset=0, rows=100, batch=1):
        def t():
            return torch.empty(batch * 2 * rows * d + offset, dtype=dtype)[offset:].view(batch, 2, rows, d)
        q, k, v, g = t(), t(), t(), t()
        return bwd.sm90_backward_why_not(q, k, v, g, torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
                                         window)

    assert why() is None and why(d=128, dtype=B16) is None and why(d=80) is None
    assert "float16" in why(dtype=torch.float64)
    monkeypatch.setattr(bwd, "SM90_FP32_PLANES", False)
    assert "SM90_FP32_PLANES" in why(dtype=torch.float32)
    monkeypatch.setattr(bwd, "SM90_FP32_PLANES", True)
    # float32 as bf16 planes (the default): head dims up to 128, any operand layout (the planes are fresh
    # copies), float outputs in 8-byte pairs.
    assert why(dtype=torch.float32) is None and why(d=40, dtype=torch.float32) is None
    assert why(d=36, dtype=torch.float32, offset=1) is None  # misaligned operands: the planes are aligned
    q = torch.empty(1, 2, 100, 64)
    shifted = torch.empty(2 * 100 * 64 + 1)[1:].view(1, 2, 100, 64)
    assert "8-byte" in bwd.sm90_backward_why_not(q, q, q, q, shifted, q, q, None)
    assert why(d=80, dtype=torch.float32) is None and why(d=128, dtype=torch.float32) is None
    assert "above 128" in why(d=130, dtype=torch.float32)
    planes_case = torch.empty(1, 2, 100, 64)
    assert bwd.runs_on_bf16_planes(planes_case, planes_case, planes_case, planes_case)
    half = planes_case.half()
    assert not bwd.runs_on_bf16_planes(half, half, half, half)  # 16-bit on the same kernels, no planes
    monkeypatch.setattr(bwd, "SM90_FP32_PLANES", False)
    assert "above 128" in why(d=256)
    assert "window" in why(window=(16, 0))
    assert "aligned" in why(offset=1)
    assert "stride" in why(d=36)  # rows of 72 bytes
    assert "odd" in why(d=63)
    assert why(batch=32767, rows=1, d=8) is None and "grid.y" in why(batch=32768, rows=1, d=8)  # 2 heads each
    monkeypatch.setattr(bwd, "capability", lambda device: (8, 0))
    assert "sm_90" in why()


def test_float32_splits_into_three_bf16_planes_exactly():
    """The float32 wgmma backward's operands: t = t0 + t1 + t2 exactly in bf16 (each plane takes the next
    8 significant bits), laid out (batch * 3, heads, rows, d) with plane p of batch b at index 3 b + p, from
    strided views too."""
    from cute_kernels.ops.attention import backward as bwd

    g = torch.Generator().manual_seed(0)
    t = torch.randn(2, 3, 50, 40, generator=g) * torch.logspace(-20, 20, 40)
    view = t.transpose(1, 2).contiguous().transpose(1, 2)  # (B, S, H, d) memory, as flash-attn lays it out
    planes = bwd.bf16_planes_reference(view)
    assert planes.shape == (6, 3, 50, 40) and planes.dtype == torch.bfloat16 and planes.is_contiguous()
    by_plane = planes.view(2, 3, 3, 50, 40).double()
    assert torch.equal(by_plane.sum(1), t.double())
    assert torch.equal(planes[3], t[1].bfloat16())  # batch 1's first plane: its values rounded to bf16
    assert bwd.bf16_planes_reference(torch.randn(7, 64, generator=g)).shape == (3, 1, 7, 64)  # (S, d): one batch, one head
    # A head dim whose bf16 rows are no multiple of 16 bytes: the planes' rows are padded, so TMA reads them.
    odd = torch.randn(1, 2, 100, 36, generator=g)
    planes = bwd.bf16_planes_reference(odd)
    assert planes.shape == (3, 2, 100, 36) and planes.stride(-2) == 40
    assert torch.equal(planes.view(1, 3, 2, 100, 36).double().sum(1), odd.double())
    assert tma.why_not(planes, *bwd._bwd_map(planes, 100, bwd.SM90_BWD_PLANE_TILES[64].kept)) is None


def test_the_split_kernel_compiles_and_its_parameters_match():
    """split_planes_kernel (the planes in one pass on the GPU): the host's ctypes layout is the kernel's
    72-byte SplitParams (static_assert there), and it compiles for sm_90a without spills."""
    import ctypes as c

    from cute_kernels.ops.attention import backward as bwd

    assert c.sizeof(bwd.SplitParams) == 72
    assert (bwd.SplitParams.count.offset, bwd.SplitParams.heads.offset, bwd.SplitParams.width.offset) == (48, 56, 68)
    usage = nvrtc.resource_usage(bwd.SM90_SOURCE, (bwd.SPLIT_NAME,), "sm_90a")[bwd.SPLIT_NAME]
    assert not (usage.spill_stores or usage.spill_loads)


def _unit_of(u, m_blocks, pairs_total, group_pairs):
    """attention_sm90.cu unit_of's order, as the kernel computes it: (m_index, pair) of unit u."""
    group_units = group_pairs * m_blocks
    first_pair = u // group_units * group_pairs
    pairs = min(group_pairs, pairs_total - first_pair)
    in_group = u - first_pair * m_blocks
    return in_group // pairs, first_pair + in_group % pairs


@pytest.mark.parametrize("m_blocks, pairs_total", [(1, 1), (4, 128), (3, 6), (22, 64), (64, 8), (5, 7)])
def test_grouped_units_take_every_unit_once_longest_first(m_blocks, pairs_total):
    """Every grouping of the kernel's unit order covers each (query tile, pair) once, groups of pairs one
    after another, within a group every pair's rank r (its r-th longest causal tile) before any pair's
    r + 1; a group of one pair is the pair-by-pair order (query tile fastest)."""
    units = m_blocks * pairs_total
    for group_pairs in sorted({1, 2, 5, pairs_total, pairs_total + 3}):
        order = [_unit_of(u, m_blocks, pairs_total, group_pairs) for u in range(units)]
        assert sorted(order) == [(i, b) for i in range(m_blocks) for b in range(pairs_total)]
        for (i0, b0), (i1, b1) in zip(order, order[1:]):
            if b0 // group_pairs == b1 // group_pairs:
                assert (i1, b1) > (i0, b0)  # within a group: by rank, then pair
            else:
                assert b1 // group_pairs == b0 // group_pairs + 1  # the next group
        if group_pairs == 1:
            assert order == [(u % m_blocks, u // m_blocks) for u in range(units)]


def test_unit_groups_hold_what_l2_holds():
    """Causal calls without a window group as many pairs as hold UNIT_GROUP_L2_BYTES of K and V (a grouped-
    query head's share of its kv head's), capped at every pair, at least one; other calls, and
    ``grouped_units=False``, pair by pair."""
    config = f3.Flash3Config(grouped_units=True)
    budget = f3.UNIT_GROUP_L2_BYTES
    assert f3.unit_group_pairs(config, P(512, 512, 64, causal=True, batch=8, heads=16)) == 128  # 128 KiB each
    assert f3.unit_group_pairs(config, P(4096, 4096, 128, causal=True, batch=4, heads=16)) == budget // 2 ** 21
    assert f3.unit_group_pairs(config, P(8192, 8192, 128, causal=True, heads=32, kv_heads=8)) == 32  # 1 MiB each
    assert f3.unit_group_pairs(config, P(2 ** 20, 2 ** 20, 256, causal=True)) == 1  # 1 GiB of K and V a pair
    assert f3.unit_group_pairs(config, P(512, 512, 64, causal=False, batch=8, heads=16)) == 1
    assert f3.unit_group_pairs(config, P(512, 512, 64, causal=True, batch=8, heads=16, window=(64, 0))) == 1
    assert f3.unit_group_pairs(f3.Flash3Config(grouped_units=False), P(512, 512, 64, causal=True, heads=16)) == 1
