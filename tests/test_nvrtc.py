"""CPU tier: every .cu file compiles with NVRTC for sm_80 and sm_90a, and the compile cache is sound."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cute_kernels import registry
from cute_kernels.runtime import nvrtc

ARCHS = ("sm_80", "sm_90a")
CU_FILES = sorted(p.name for p in nvrtc.SOURCE_DIR.glob("*.cu"))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CUTE_KERNELS_DISK_CACHE", "1")
    nvrtc.clear_memory_cache()
    yield tmp_path / "cache" / "nvrtc"
    nvrtc.clear_memory_cache()


def test_every_cu_file_is_registered():
    """A .cu file no registry entry compiles would never be compile-checked."""
    assert CU_FILES
    used = {name for spec in registry.list() if spec.backend == "nvrtc" for name in spec.sources}
    assert used == set(CU_FILES)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("spec", [s for s in registry.list() if s.backend == "nvrtc"], ids=lambda s: s.op)
def test_registry_instantiations_compile(spec, arch, cache_dir):
    from cute_kernels.__main__ import compile_plan

    for config, problem in compile_plan(spec, sample=4):
        cubin = spec.compile(config, problem, arch)
        assert cubin.data[:4] == b"\x7fELF", "NVRTC returned something that is not a cubin"
        assert cubin.arch == arch


@pytest.mark.parametrize("arch", ARCHS)
def test_scan_every_dtype_and_mode_compiles(arch, cache_dir):
    import torch
    from cute_kernels.ops.scan import config as scan_config
    from cute_kernels.ops.scan import lookback as scan_lookback
    from cute_kernels.ops.scan import problem as scan_problem

    names = []
    for dtype in scan_problem.DTYPES:
        for vector in sorted({1, 16 // dtype.itemsize}):
            for rows in (1, 4):
                for exclusive in (False, True):
                    problem = scan_problem.ScanProblem(rows, 1000, dtype, exclusive, vector)
                    for staged in (False, True):
                        for lookback in scan_config.LOOKBACKS:
                            config = scan_config.ScanConfig(128, 16, staged, lookback)
                            names.append(scan_lookback.name_expression(config, problem))
    cubin = nvrtc.compile_cubin(scan_lookback.SOURCE, names, arch)
    assert set(cubin.symbols) == set(names)
    assert all(sym.startswith("_Z") for sym in cubin.symbols.values())
    del torch


def test_disk_cache_is_used_by_a_second_process(cache_dir):
    expr = "scan::scan_kernel<float, float, 128, 8, 4, false, false, false>"
    nvrtc.compile_cubin("scan.cu", [expr], "sm_90a")
    assert nvrtc.stats["compiled"] >= 1
    files = sorted(p.suffix for p in cache_dir.iterdir())
    assert files == [".cubin", ".json"]
    code = (
        "from cute_kernels.runtime import nvrtc; "
        f"c = nvrtc.compile_cubin('scan.cu', [{expr!r}], 'sm_90a'); "
        "import json; print(json.dumps(nvrtc.stats))"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    assert stats == {"compiled": 0, "disk_hits": 1, "memory_hits": 0}


def test_memory_cache_hit(cache_dir):
    expr = "scan::scan_kernel<double, double, 128, 8, 2, true, false, false>"
    a = nvrtc.compile_cubin("scan.cu", [expr], "sm_80")
    hits = nvrtc.stats["memory_hits"]
    b = nvrtc.compile_cubin("scan.cu", [expr], "sm_80")
    assert a is b and nvrtc.stats["memory_hits"] == hits + 1


def test_disk_cache_can_be_switched_off(cache_dir, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_DISK_CACHE", "0")
    assert nvrtc.cache_dir() is None
    nvrtc.compile_cubin("scan.cu", ["scan::scan_kernel<int, long long, 128, 8, 4, false, true, false>"], "sm_90a")
    assert not cache_dir.exists()


def test_key_covers_headers_options_arch_and_names(tmp_path, monkeypatch):
    """Changing an included header (or anything else that shapes the binary) changes the key."""
    src = tmp_path / "src"
    shutil.copytree(nvrtc.SOURCE_DIR, src, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    monkeypatch.setattr(nvrtc, "SOURCE_DIR", src)
    names = ("scan::scan_kernel<float, float, 128, 8, 4, false, false, false>",)
    sources = nvrtc.read_source_tree("scan.cu")
    assert set(sources) == {"scan.cu", "common.cuh"}
    base = nvrtc.cache_key(sources, ("-std=c++17",), "sm_90a", names)
    (src / "common.cuh").write_text((src / "common.cuh").read_text() + "\n// a change\n")
    assert nvrtc.cache_key(nvrtc.read_source_tree("scan.cu"), ("-std=c++17",), "sm_90a", names) != base
    assert nvrtc.cache_key(sources, ("-std=c++17", "-G"), "sm_90a", names) != base
    assert nvrtc.cache_key(sources, ("-std=c++17",), "sm_80", names) != base
    assert nvrtc.cache_key(sources, ("-std=c++17",), "sm_90a", names + ("x",)) != base
    monkeypatch.setattr(nvrtc, "nvrtc_version", lambda: (99, 0))
    assert nvrtc.cache_key(sources, ("-std=c++17",), "sm_90a", names) != base


def test_corrupt_cache_file_is_recompiled(cache_dir):
    expr = "scan::scan_kernel<float, float, 256, 16, 4, true, false, false>"
    nvrtc.compile_cubin("scan.cu", [expr], "sm_90a")
    cubin_file = next(cache_dir.glob("*.cubin"))
    cubin_file.write_bytes(b"garbage")
    nvrtc.clear_memory_cache()
    compiled = nvrtc.stats["compiled"]
    c = nvrtc.compile_cubin("scan.cu", [expr], "sm_90a")
    assert c.data[:4] == b"\x7fELF" and nvrtc.stats["compiled"] == compiled + 1


def test_compile_error_names_the_file_and_shows_the_log(cache_dir):
    with pytest.raises(nvrtc.KernelError, match=r"(?s)NVRTC could not compile scan.cu for sm_90a.*error"):
        nvrtc.compile_cubin("scan.cu", ["scan::scan_kernel<float, float, 100, 8, 4, false, false, false>"], "sm_90a")


def test_foreign_metadata_is_recompiled(cache_dir):
    expr = "scan::scan_kernel<float, float, 256, 16, 4, false, true, false>"
    nvrtc.compile_cubin("scan.cu", [expr], "sm_90a")
    next(cache_dir.glob("*.json")).write_text("[1, 2]")
    nvrtc.clear_memory_cache()
    compiled = nvrtc.stats["compiled"]
    assert nvrtc.compile_cubin("scan.cu", [expr], "sm_90a").data[:4] == b"\x7fELF"
    assert nvrtc.stats["compiled"] == compiled + 1


@pytest.mark.skipif("CUTE_KERNELS_EXPECT_NVRTC" not in os.environ, reason="set by .ci/run's oldest-NVRTC pass")
def test_the_nvrtc_in_use_is_the_one_expected():
    """.ci/run preloads NVRTC 13.0 for a second pass; prove that pass really compiled with it."""
    from cuda.bindings import nvrtc as nvrtc_bindings

    _, major, minor = nvrtc_bindings.nvrtcVersion()
    assert f"{major}.{minor}" == os.environ["CUTE_KERNELS_EXPECT_NVRTC"]


def test_scan_trace_instruments_the_current_scan():
    """scripts/probes/scan_trace.py stamps a text copy of scan.cu at fixed source lines and launches it with
    scan.cu's parameter list: it must still find every line, match the parameters and compile (for sm_90a),
    or the next trace on a GPU would fail."""
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, str(root / "scripts" / "probes" / "scan_trace.py"), "--dry-run"],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)}, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("compiled") == 4
