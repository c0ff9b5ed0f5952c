"""CPU tier: every .cu file compiles with NVRTC for sm_80 and sm_90a, and the compile cache is sound."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cute_kernels import registry
from cute_kernels.runtime import nvrtc

from covering import pairwise

ARCHS = ("sm_80", "sm_90a")
CU_FILES = sorted(p.name for p in nvrtc.SOURCE_DIR.glob("*.cu"))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CUTE_KERNELS_DISK_CACHE", "1")
    nvrtc.clear_memory_cache()
    yield tmp_path / "cache" / "nvrtc"
    nvrtc.clear_memory_cache()


# Sources of kernels that are not registry entries (yet), each compile-checked by its own CPU test instead.
UNREGISTERED: dict = {}


def test_every_cu_file_is_registered():
    """A .cu file no registry entry compiles would never be compile-checked, unless its own test does."""
    assert CU_FILES
    used = {name for spec in registry.list() if spec.backend == "nvrtc" for name in spec.sources}
    assert used | set(UNREGISTERED) == set(CU_FILES) and not used & set(UNREGISTERED)
    root = nvrtc.SOURCE_DIR.parent
    for source, test in UNREGISTERED.items():
        assert source in (root / test).read_text(), f"{test} does not compile {source}"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("spec", [s for s in registry.list() if s.backend == "nvrtc"], ids=lambda s: s.op)
def test_registry_instantiations_compile(spec, arch, cache_dir):
    from cute_kernels.__main__ import compile_plan

    for config, problem in compile_plan(spec, sample=4):
        cubin = spec.compile(config, problem, arch)
        assert cubin.data[:4] == b"\x7fELF", "NVRTC returned something that is not a cubin"
        assert cubin.arch == arch


@pytest.mark.exhaustive
@pytest.mark.parametrize("arch", ARCHS)
def test_scan_dtypes_and_modes_compile(arch, cache_dir):
    import torch
    from cute_kernels.ops.scan import config as scan_config
    from cute_kernels.ops.scan import lookback as scan_lookback
    from cute_kernels.ops.scan import problem as scan_problem

    # Every dtype, vector width (scalar or 16-byte), row count, mode, staging and look-back schedule, and
    # every pair of them (tests/covering.py; the GPU tier compiles and runs the whole product).
    from cute_kernels.ops.scan import columns as scan_columns

    # Every dtype, operator, direction, vector width (scalar or 16-byte), row count, mode, staging and
    # look-back schedule, and every pair of them (tests/covering.py; the GPU tier compiles and runs the whole
    # product); an operator a dtype lacks (logsumexp of integers) stands in as max. The columns variant's two
    # kernels over every dtype, operator, direction, mode and lane count, pairwise.
    names = []
    dtypes = list(scan_problem.DTYPES)
    ops = list(scan_problem.OPS)

    def op_for(op, dtype):
        return op if dtype in scan_problem.OPS[op][2] else "max"

    for dtype, op, reverse, wide, rows, exclusive, staged, lookback in pairwise(
            dtypes, ops, (False, True), (False, True), (1, 4), (False, True), (False, True), scan_config.LOOKBACKS):
        problem = scan_problem.ScanProblem(rows, 1024, dtype, exclusive, 16 // dtype.itemsize if wide else 1,
                                           op=op_for(op, dtype), reverse=reverse)
        config = scan_config.ScanConfig(128, 16, staged and problem.vector_width * dtype.itemsize >= 4, lookback)
        names.append(scan_lookback.name_expression(config, problem))
    # Segmented scans (inline and early): dtype, operator, direction, width, mode, staging and schedule, pairwise.
    for dtype, op, reverse, wide, exclusive, staged, lookback in pairwise(
            dtypes, ops, (False, True), (False, True), (False, True), (False, True), ("inline", "early")):
        problem = scan_problem.ScanProblem(3, 1024, dtype, exclusive, 16 // dtype.itemsize if wide else 1,
                                           op=op_for(op, dtype), reverse=reverse, segmented=True)
        config = scan_config.ScanConfig(128, 16, staged and problem.vector_width * dtype.itemsize >= 4, lookback)
        names.append(scan_lookback.name_expression(config, problem))
    for dtype, op, reverse, exclusive, lanes in pairwise(dtypes, ops, (False, True), (False, True), (0, 8, 32)):
        problem = scan_problem.ScanProblem(2, 100, dtype, exclusive, op=op_for(op, dtype), reverse=reverse, inner=64)
        names.extend(scan_columns.name_expressions(scan_config.ColumnScanConfig(lanes=lanes), problem))
    names = list(dict.fromkeys(names))
    cubin = nvrtc.compile_cubin(scan_lookback.SOURCE, names, arch)
    assert set(cubin.symbols) == set(names)
    assert all(sym.startswith("_Z") for sym in cubin.symbols.values())
    del torch


def test_disk_cache_is_used_by_a_second_process(cache_dir):
    expr = "scan::scan_kernel<float, float, scan::Sum<float>, 128, 8, 4, false, false, false, false>"
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
    expr = "scan::scan_kernel<double, double, scan::Sum<double>, 128, 8, 2, true, false, false, false>"
    a = nvrtc.compile_cubin("scan.cu", [expr], "sm_80")
    hits = nvrtc.stats["memory_hits"]
    b = nvrtc.compile_cubin("scan.cu", [expr], "sm_80")
    assert a is b and nvrtc.stats["memory_hits"] == hits + 1


def test_disk_cache_can_be_switched_off(cache_dir, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_DISK_CACHE", "0")
    assert nvrtc.cache_dir() is None
    nvrtc.compile_cubin("scan.cu", ["scan::scan_kernel<int, long long, scan::Sum<long long>, 128, 8, 4, false, true, false, false>"], "sm_90a")
    assert not cache_dir.exists()


def test_key_covers_headers_options_arch_and_names(tmp_path, monkeypatch):
    """Changing an included header (or anything else that shapes the binary) changes the key."""
    src = tmp_path / "src"
    shutil.copytree(nvrtc.SOURCE_DIR, src, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    monkeypatch.setattr(nvrtc, "SOURCE_DIR", src)
    names = ("scan::scan_kernel<float, float, scan::Sum<float>, 128, 8, 4, false, false, false, false>",)
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
    expr = "scan::scan_kernel<float, float, scan::Sum<float>, 256, 16, 4, true, false, false, false>"
    nvrtc.compile_cubin("scan.cu", [expr], "sm_90a")
    cubin_file = next(cache_dir.glob("*.cubin"))
    cubin_file.write_bytes(b"garbage")
    nvrtc.clear_memory_cache()
    compiled = nvrtc.stats["compiled"]
    c = nvrtc.compile_cubin("scan.cu", [expr], "sm_90a")
    assert c.data[:4] == b"\x7fELF" and nvrtc.stats["compiled"] == compiled + 1


def test_compile_error_names_the_file_and_shows_the_log(cache_dir):
    with pytest.raises(nvrtc.KernelError, match=r"(?s)NVRTC could not compile scan.cu for sm_90a.*error"):
        nvrtc.compile_cubin("scan.cu", ["scan::scan_kernel<float, float, scan::Sum<float>, 100, 8, 4, false, false, false, false>"], "sm_90a")


def test_foreign_metadata_is_recompiled(cache_dir):
    expr = "scan::scan_kernel<float, float, scan::Sum<float>, 256, 16, 4, false, true, false, false>"
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
    # The cache key's version too: a preloaded library is asked, not the wheel's metadata.
    assert "{}.{}".format(*nvrtc._nvrtc_library_version("")[:2]) == os.environ["CUTE_KERNELS_EXPECT_NVRTC"]
    nvrtc.nvrtc_version.cache_clear()
    assert "{}.{}".format(*nvrtc.nvrtc_version()[:2]) == os.environ["CUTE_KERNELS_EXPECT_NVRTC"]


def test_the_cache_keys_nvrtc_version_is_the_librarys():
    """From the wheel's metadata when no other libnvrtc is loaded (no bindings import), else from the
    library: the same answer either way."""
    nvrtc.nvrtc_version.cache_clear()
    try:
        assert nvrtc.nvrtc_version()[:2] == nvrtc._nvrtc_library_version("")[:2]
    finally:
        nvrtc.nvrtc_version.cache_clear()


def test_a_warm_cache_key_needs_no_nvrtc_bindings():
    """Working out a kernel's disk-cache key (all a process whose kernels are cached does before loading
    them) imports no NVRTC bindings when NVRTC comes from its wheel; without the wheel the version can
    only come from the library, through the bindings."""
    import importlib.metadata

    try:
        importlib.metadata.version("nvidia-cuda-nvrtc")
        from_wheel = True
    except importlib.metadata.PackageNotFoundError:
        from_wheel = False
    code = ("import sys; from cute_kernels.runtime import nvrtc; nvrtc.nvrtc_version(); "
            "print('cuda.bindings.nvrtc' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    assert result.stdout.strip() == str(not from_wheel)


def test_the_wheels_own_mapped_library_needs_no_nvrtc_bindings():
    """torch's CUDA wheels map the NVRTC wheel's libnvrtc at import: the wheel's version still stands there
    (no bindings import); a libnvrtc mapped from anywhere else (an LD_PRELOAD) is asked instead."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution("nvidia-cuda-nvrtc")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("NVRTC does not come from its wheel here")
    library = next(p for p in nvrtc._wheel_libraries(dist) if p.name.startswith("libnvrtc.so"))
    code = ("import ctypes, sys; ctypes.CDLL(sys.argv[1]); from cute_kernels.runtime import nvrtc; "
            "v = nvrtc.nvrtc_version(); print(v[2], 'cuda.bindings.nvrtc' in sys.modules, "
            "sys.argv[1] in {str(p) for p in nvrtc._mapped_nvrtc_paths()})")
    result = subprocess.run([sys.executable, "-c", code, str(library)], capture_output=True, text=True, check=True,
                            env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    assert result.stdout.split() == [dist.version, "False", "True"]


def test_a_remembered_fact_is_computed_once_per_identity(cache_dir, monkeypatch):
    """Facts about installed files (which wheel ships a header; whether the mapped libnvrtc is the wheel's) are
    computed once per identity of the files and kept in the disk cache; with the cache off, every time."""
    calls = []

    def compute():
        calls.append(1)
        return {"answer": len(calls)}

    assert nvrtc._remembered_fact("test", [1], compute) == {"answer": 1}
    assert nvrtc._remembered_fact("test", [1], compute) == {"answer": 1} and len(calls) == 1
    assert nvrtc._remembered_fact("test", [2], compute) == {"answer": 2}
    monkeypatch.setenv("CUTE_KERNELS_DISK_CACHE", "0")
    nvrtc._remembered_fact("test", [1], compute)
    assert len(calls) == 3


def test_a_warm_header_package_reads_no_wheel_metadata(cache_dir, monkeypatch):
    """A process after the first (the in-process memo cleared) names the headers' wheel from the disk cache,
    without importlib.metadata (whose RECORD reads were ~8 ms of a first call on the lent machines)."""
    import importlib.metadata

    headers = nvrtc.system_headers(nvrtc.read_source_tree("attention.cu"))
    real = Path(nvrtc.cuda_include_dir("attention.cu", headers))
    nvrtc._header_packages.clear()  # an earlier test's answer in this process would skip the first search
    first = nvrtc.header_package(real, headers[0])
    nvrtc._header_packages.clear()

    def refuse(name):
        raise AssertionError(f"read the metadata of {name}")

    monkeypatch.setattr(importlib.metadata, "distribution", refuse)
    assert nvrtc.header_package(real, headers[0]) == first


def test_the_mapped_library_check_is_kept_per_file(cache_dir, tmp_path, monkeypatch):
    """Whether the mapped libnvrtc files are the wheel's: the RECORD read once per set of files (path, inode,
    size, mtime), asked again when another file stands there."""
    library = tmp_path / "libnvrtc.so.13"
    library.write_bytes(b"x")

    class Dist:
        version = "13.5.37"

    monkeypatch.setattr(nvrtc, "_wheel_libraries", lambda dist: {library})
    assert nvrtc._all_from_wheel({library}, Dist())
    monkeypatch.setattr(nvrtc, "_wheel_libraries", lambda dist: set())  # would say no: it is not asked
    assert nvrtc._all_from_wheel({library}, Dist())
    library.write_bytes(b"another")
    assert not nvrtc._all_from_wheel({library}, Dist())
    # A library deleted (or upgraded) since it was mapped: /proc/self/maps says "<path> (deleted)"; the
    # library is then asked for its version rather than the key failing.
    assert not nvrtc._all_from_wheel({Path(str(library) + " (deleted)")}, Dist())


def test_the_runtime_headers_come_from_the_wheel_where_pathfinder_looks_first():
    """The runtime wheel's include directory, found without importing cuda.pathfinder, is the one
    cuda.pathfinder finds first."""
    from cuda.pathfinder import find_nvidia_header_directory

    sources = nvrtc.read_source_tree("attention.cu")
    found = nvrtc._runtime_wheel_include_dir(nvrtc.system_headers(sources))
    if found is None:
        pytest.skip("no CUDA runtime wheel here")
    assert Path(found).resolve() == Path(find_nvidia_header_directory("cudart")).resolve()


def test_scan_trace_instruments_the_current_scan():
    """scripts/probes/scan_trace.py stamps a text copy of scan.cu at fixed source lines and launches it with
    scan.cu's parameter list: it must still find every line, match the parameters and compile (for sm_90a),
    or the next trace on a GPU would fail."""
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, str(root / "scripts" / "probes" / "scan_trace.py"), "--dry-run"],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)}, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("compiled") == 4


# ---- The CUDA headers in the key ---------------------------------------------------------------------------

ATTENTION_EXPR = "attention::fused_fp32_kernel<64, 32, 32, 2, 1>"


@pytest.fixture
def header_copy(tmp_path, monkeypatch):
    """A copy of the CUDA runtime headers, which compile_options then points NVRTC at (the directory
    cuda_include_dir found, replaced in its cache)."""
    sources = nvrtc.read_source_tree("attention.cu")
    real = nvrtc.cuda_include_dir("attention.cu", nvrtc.system_headers(sources))
    copy = tmp_path / "include"
    shutil.copytree(real, copy)
    monkeypatch.setitem(nvrtc._include_dir_cache, "cudart", str(copy))
    return copy


def _attention_key():
    sources = nvrtc.read_source_tree("attention.cu")
    return nvrtc.cache_key(sources, nvrtc.compile_options("attention.cu", sources), "sm_90a", (ATTENTION_EXPR,))


def test_key_covers_the_cuda_headers_it_includes(header_copy):
    """attention.cu includes <cuda_fp16.h> and <cuda_bf16.h>: a change to either, or to a header they include
    (cuda_fp16.hpp, vector_types.h), changes the key, in the same include directory; a header no include
    reaches does not."""
    sources = nvrtc.read_source_tree("attention.cu")
    assert nvrtc.system_headers(sources) == ["cuda_bf16.h", "cuda_fp16.h"]
    digests = nvrtc.system_header_digests(nvrtc.system_headers(sources), (f"-I{header_copy}",))
    reached = ("cuda_fp16.h", "cuda_bf16.h", "cuda_fp16.hpp", "vector_types.h")
    assert {str(header_copy / h) for h in reached} <= set(digests)
    keys = [_attention_key()]
    for name in ("cuda_bf16.h", "cuda_fp16.h", "cuda_fp16.hpp", "vector_types.h"):
        with open(header_copy / name, "a") as f:
            f.write("\n// patched\n")
        keys.append(_attention_key())
        assert keys[-1] != keys[-2], f"a change to {name} left the key as it was"
    unused = next(n for n in ("cuda_fp8.h", "cuda_fp4.h", "mma.h") if (header_copy / n).is_file()
                  and str(header_copy / n) not in digests)
    (header_copy / unused).write_text("// not read by attention.cu\n")
    assert _attention_key() == keys[-1]
    # Same size, other bytes: the content is hashed, not only the size.
    text = (header_copy / "cuda_fp16.h").read_text()
    (header_copy / "cuda_fp16.h").write_text(text.replace("// patched", "// PATCHED"))
    assert _attention_key() != keys[-1]


def test_key_covers_the_version_of_the_headers_package(header_copy, monkeypatch):
    base = _attention_key()
    monkeypatch.setattr(nvrtc, "header_package", lambda include_dir, header: "nvidia-cuda-runtime 99.0")
    assert _attention_key() != base


def test_the_headers_package_is_the_wheel_that_ships_them(header_copy):
    sources = nvrtc.read_source_tree("attention.cu")
    assert nvrtc.header_package(header_copy, "cuda_fp16.h") == ""  # a copy: no wheel ships it
    nvrtc._include_dir_cache.pop("cudart")
    real = Path(nvrtc.cuda_include_dir("attention.cu", nvrtc.system_headers(sources)))
    found = nvrtc.header_package(real, "cuda_fp16.h")
    if "site-packages" in str(real):
        import importlib.metadata

        name, version = found.split(" ")
        assert name.startswith("nvidia-cuda-runtime") and version == importlib.metadata.version(name)


def test_a_changed_header_recompiles_instead_of_loading_the_old_cubin(header_copy, cache_dir):
    nvrtc.compile_cubin("attention.cu", [ATTENTION_EXPR], "sm_90a")
    with open(header_copy / "cuda_fp16.hpp", "a") as f:
        f.write("\n// patched\n")
    nvrtc.clear_memory_cache()
    compiled, hits = nvrtc.stats["compiled"], nvrtc.stats["disk_hits"]
    assert nvrtc.compile_cubin("attention.cu", [ATTENTION_EXPR], "sm_90a").data[:4] == b"\x7fELF"
    assert (nvrtc.stats["compiled"], nvrtc.stats["disk_hits"]) == (compiled + 1, hits)


# ---- Processes compiling one key take turns ----------------------------------------------------------------

_ROOT = Path(__file__).resolve().parents[1]
_RACE_EXPR = "scan::scan_kernel<float, float, scan::Sum<float>, 256, 16, 4, false, true, false, false>"


def _compiling_child(ready: Path, go: Path | None, expr: str) -> subprocess.Popen:
    """A process that imports the library, touches ``ready``, waits for ``go`` (if any), compiles ``expr``
    for sm_90a and prints its stats."""
    code = (
        "import json, sys, time; from pathlib import Path\n"
        "from cute_kernels.runtime import nvrtc\n"
        f"Path({str(ready)!r}).touch()\n"
        f"go = {str(go) if go else ''!r}\n"
        "deadline = time.time() + 120\n"
        "while go and not Path(go).exists() and time.time() < deadline: time.sleep(0.005)\n"
        f"nvrtc.compile_cubin('scan.cu', [{expr!r}], 'sm_90a')\n"
        "print(json.dumps(nvrtc.stats))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(_ROOT))
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _stats_of(child: subprocess.Popen) -> dict:
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _wait_for(path: Path, child: subprocess.Popen) -> None:
    import time

    deadline = time.time() + 120
    while not path.exists():
        assert child.poll() is None, child.communicate()[1]
        assert time.time() < deadline, "the child never got ready"
        time.sleep(0.01)


def test_two_processes_compiling_one_key_compile_it_once(cache_dir, tmp_path):
    """Both start compiling the same key at the same moment: one compiles and stores, the other waits for
    the lock and loads that cubin."""
    go = tmp_path / "go"
    children = [_compiling_child(tmp_path / f"ready{i}", go, _RACE_EXPR) for i in range(2)]
    for i, child in enumerate(children):
        _wait_for(tmp_path / f"ready{i}", child)
    go.touch()
    stats = [_stats_of(child) for child in children]
    assert sorted((s["compiled"], s["disk_hits"]) for s in stats) == [(0, 1), (1, 0)], stats
    assert sorted(p.suffix for p in cache_dir.iterdir()) == [".cubin", ".json"]


def test_a_process_waits_for_the_one_compiling_its_key(cache_dir, tmp_path):
    """While this process holds the key's lock (as a compiling process does), another one asking for the key
    waits, and then loads what this one stored instead of compiling it again."""
    import time

    sources = nvrtc.read_source_tree("scan.cu")
    options = nvrtc.compile_options("scan.cu", sources)
    key = nvrtc.cache_key(sources, options, "sm_90a", (_RACE_EXPR,))
    with nvrtc._DISK.lock(key):
        child = _compiling_child(tmp_path / "ready", None, _RACE_EXPR)
        _wait_for(tmp_path / "ready", child)
        time.sleep(1.0)  # the child is blocked on the lock now (it would have compiled the key by itself)
        assert child.poll() is None
        cubin = nvrtc._nvrtc_compile("scan.cu", sources, options, "sm_90a", (_RACE_EXPR,), key)
        nvrtc._store_on_disk(cubin)
    assert _stats_of(child) == {"compiled": 0, "disk_hits": 1, "memory_hits": 0}


# ---- A cached cubin that does not load ---------------------------------------------------------------------

_EVICT_EXPR = "scan::scan_kernel<float, float, scan::Sum<float>, 128, 8, 4, false, false, false, false>"


def _planted_cubin(data: bytes) -> str:
    """Compile _EVICT_EXPR for sm_90a, then replace its disk entry with ``data`` under a matching checksum (what
    another NVRTC or a cubin the driver refuses looks like); return the key."""
    good = nvrtc.compile_cubin("scan.cu", [_EVICT_EXPR], "sm_90a")
    nvrtc._DISK.store(good.key, data, {"arch": "sm_90a", "symbols": good.symbols})
    nvrtc.clear_memory_cache()
    return good.key


@pytest.fixture
def fake_loader(monkeypatch):
    """get_kernel replaced by a loader that refuses what is not an ELF file (the driver's check, on the CPU),
    or everything once ``refuse_all`` is set; ``loads`` lists the cubins it was given."""
    state = {"refuse_all": False, "loads": []}

    def load(cubin, name_expression, device_index):
        state["loads"].append(cubin)
        if state["refuse_all"] or cubin.data[:4] != b"\x7fELF":
            raise nvrtc.KernelError(f"could not load kernel {name_expression}: CUDA_ERROR_INVALID_IMAGE")
        return ("loaded", cubin.key, cubin.data)

    monkeypatch.setattr(nvrtc, "get_kernel", load)
    monkeypatch.setattr(nvrtc._device, "arch", lambda device_index, arch_specific=False: "sm_90a")
    return state


def test_a_cached_cubin_that_fails_to_load_is_evicted_and_recompiled(cache_dir, fake_loader):
    key = _planted_cubin(b"\x00 not a cubin")
    compiled = nvrtc.stats["compiled"]
    loaded = nvrtc.kernel_for("scan.cu", _EVICT_EXPR, 0)
    assert loaded[0] == "loaded" and loaded[2][:4] == b"\x7fELF"
    assert [c.from_disk for c in fake_loader["loads"]] == [True, False]
    assert nvrtc.stats["compiled"] == compiled + 1
    data, _ = nvrtc._DISK.load(key)  # the entry on disk is the working cubin now
    assert data == loaded[2]
    assert nvrtc.kernel_for("scan.cu", _EVICT_EXPR, 0) is loaded and len(fake_loader["loads"]) == 2


def test_a_second_load_failure_raises(cache_dir, fake_loader):
    _planted_cubin(b"\x00 not a cubin")
    fake_loader["refuse_all"] = True
    compiled = nvrtc.stats["compiled"]
    with pytest.raises(nvrtc.KernelError, match=r"(?s)CUDA_ERROR_INVALID_IMAGE.*failed to load too, and was evicted"):
        nvrtc.kernel_for("scan.cu", _EVICT_EXPR, 0)
    assert nvrtc.stats["compiled"] == compiled + 1 and len(fake_loader["loads"]) == 2  # recompiled once only


def test_a_fresh_cubin_that_fails_to_load_raises_without_a_recompile(cache_dir, fake_loader):
    fake_loader["refuse_all"] = True
    compiled = nvrtc.stats["compiled"]
    with pytest.raises(nvrtc.KernelError, match="CUDA_ERROR_INVALID_IMAGE"):
        nvrtc.kernel_for("scan.cu", _EVICT_EXPR, 0)
    assert nvrtc.stats["compiled"] == compiled + 1 and len(fake_loader["loads"]) == 1
    assert nvrtc._DISK.load(next(cache_dir.glob("*.cubin")).stem) is not None  # nothing evicted


def test_eviction_keeps_an_entry_another_process_replaced(cache_dir):
    key = _planted_cubin(b"\x00 not a cubin")
    replaced = nvrtc.compile_cubin("scan.cu", [_EVICT_EXPR], "sm_90a")  # what is on disk now: the bad one
    assert replaced.from_disk and replaced.data == b"\x00 not a cubin"
    nvrtc._DISK.store(key, b"\x7fELF another process's rebuild", {"arch": "sm_90a", "symbols": replaced.symbols})
    nvrtc.evict(replaced)
    assert nvrtc._DISK.load(key)[0] == b"\x7fELF another process's rebuild"
    nvrtc.evict(dataclasses.replace(replaced, data=b"\x7fELF another process's rebuild"))
    assert nvrtc._DISK.load(key) is None and not list(cache_dir.iterdir())


@pytest.mark.gpu
def test_a_cached_cubin_the_driver_refuses_is_rebuilt(cache_dir):
    """On the GPU: a checksummed cache entry that cuModuleLoad refuses is evicted, compiled again and loaded."""
    import torch

    from cute_kernels.runtime import device

    arch = device.arch(0)
    good = nvrtc.compile_cubin("scan.cu", [_EVICT_EXPR], arch)
    nvrtc._DISK.store(good.key, b"\x7fELF\x02\x01\x01 truncated", {"arch": arch, "symbols": good.symbols})
    nvrtc.clear_memory_cache()
    compiled = nvrtc.stats["compiled"]
    loaded = nvrtc.kernel_for("scan.cu", _EVICT_EXPR, 0)
    assert isinstance(loaded, nvrtc.LoadedKernel) and loaded.device_index == 0
    assert nvrtc.stats["compiled"] == compiled + 1
    # The rebuilt entry replaced the bad one. Not compared byte for byte with the first build: NVRTC's
    # output is not always repeatable (docs/notes/method.md#proving-a-change-left-the-kernels-alone).
    rebuilt = nvrtc._DISK.load(good.key)[0]
    assert rebuilt[:4] == b"\x7fELF" and b"truncated" not in rebuilt and len(rebuilt) > 1000
    assert nvrtc.occupancy(loaded, 128, 0) >= 1  # a kernel the driver knows
    torch.cuda.synchronize()


def _fp32_backward_names(vectors, limits):
    from cute_kernels.ops.attention import backward
    return sorted({name for d in backward.BWD_FP32_SHAPES for vector in vectors for windowed in (False, True)
                   for limit in limits if backward.bwd_fp32_shapes(d, limit)
                   for name in (*backward.bwd_fp32_name_expressions(d, vector, windowed, limit),
                                backward.bwd_fp32_atomic_name_expression(d, vector, windowed, limit))
                   if name is not None})


@pytest.mark.parametrize("arch", ARCHS)
def test_attention_backward_kernels_compile(arch, cache_dir):
    """attention.cu's FP32 backward kernels (dK/dV, its atomic-dQ flavour, and dQ), every head dim and windowed
    flavour with 16-byte copies, in the shapes the arch's flagship picks (the H200's 227 KB per block, the
    A100's 163 KB): no registry entry runs them, so they are compile-checked here, without spills. Every
    shape and copy width: the exhaustive check below."""
    names = _fp32_backward_names((4,), (None,) if arch == "sm_90a" else (163 * 1024,))
    assert sum(name.endswith(", true>") for name in names) >= 8  # the atomic-dQ flavour of every head dim
    # One compile: resource_usage compiles them all (raising on a failure) and reports each one's ptxas figures.
    usage = nvrtc.resource_usage("attention.cu", names, arch)
    assert set(usage) == set(names)
    spilling = {name: r for name, r in usage.items() if r.spill_stores or r.spill_loads}
    assert not spilling, spilling


@pytest.mark.exhaustive
@pytest.mark.parametrize("arch", ARCHS)
def test_every_fp32_attention_backward_shape_compiles(arch, cache_dir):
    """The FP32 backward kernels in every shape a launch may pick (the H200's, and those of GPUs with 163 or
    99 KB per block) and both copy widths, without spills."""
    names = _fp32_backward_names((4, 1), (None, 163 * 1024, 99 * 1024))
    usage = nvrtc.resource_usage("attention.cu", names, arch)
    assert set(usage) == set(names)
    spilling = {name: r for name, r in usage.items() if r.spill_stores or r.spill_loads}
    assert not spilling, spilling


@pytest.mark.parametrize("arch", ARCHS)
def test_a_16_bit_attention_backward_compiles(arch, cache_dir):
    """One 16-bit backward (fp16, d = 64, 16-byte copies) and its D kernel, in the default tier: the whole
    product is the exhaustive check below."""
    from cute_kernels.ops.attention import backward
    names = list(backward.bwd_mma_name_expressions(torch.float16, 64, 8, False, None))
    names += [backward.delta_name_expression(torch.float16), backward.delta_name_expression(torch.float16, 8, 8)]
    cubin = nvrtc.compile_cubin("attention.cu", names, arch)
    assert cubin.data[:4] == b"\x7fELF" and cubin.arch == arch and set(cubin.symbols) == set(names)


@pytest.mark.exhaustive
@pytest.mark.parametrize("arch", ARCHS)
def test_attention_backward_mma_kernels_compile(arch, cache_dir):
    """attention.cu's 16-bit backward kernels (dK/dV and dQ on mma.sync), every dtype, head dim, copy width
    and the windowed flavour, and the D kernel of every dtype. The 16-byte-copy kernels: no spills for sm_90a
    (the H200's), at most 8 bytes for sm_80 (NVRTC 13.0 spills 4 in the d = 64 dK/dV kernel, at the register
    edge with 32 kept rows per warp); the element-by-element ones (odd strides, the slow path) within 32
    bytes (the d = 64 dK/dV kernel: 4 on sm_90a)."""
    from cute_kernels.ops.attention import backward
    # Every shape a launch may pick: the H200's, and the narrow one of GPUs with 99 KB per block.
    names = sorted({name for dtype in (torch.float16, torch.bfloat16) for d in backward.BWD_MMA_HEAD_DIMS
                    for vector in (1, 8) for windowed in (False, True) for limit in (None, 99 * 1024)
                    for name in backward.bwd_mma_name_expressions(dtype, d, vector, windowed, limit)})
    names += [backward.delta_name_expression(dtype, lanes, vector)
              for dtype in (torch.float32, torch.float16, torch.bfloat16)
              for lanes, vector in ((32, 1), *((1 << j, 16 // dtype.itemsize) for j in range(6)))]
    cubin = nvrtc.compile_cubin("attention.cu", names, arch)
    assert cubin.data[:4] == b"\x7fELF" and cubin.arch == arch
    usage = nvrtc.resource_usage("attention.cu", names, arch)
    allowed = {name: (0 if arch == "sm_90a" else 8) if ", 8, " in name else 32 for name in names}
    spilling = {name: r for name, r in usage.items() if max(r.spill_stores, r.spill_loads) > allowed[name]}
    assert not spilling, spilling


@pytest.mark.exhaustive
@pytest.mark.parametrize("arch", ARCHS)
def test_attention_backward_tf32x3_kernels_compile_without_spills(arch, cache_dir):
    """The float32 backward's 3xTF32 mma.sync kernels (dK/dV and dQ), every head dim they serve, both copy
    widths and the windowed flavour: ptxas -v reports no spills."""
    from cute_kernels.ops.attention import backward
    names = sorted({name for d in backward.BWD_TF32X3_SHAPES for vector in (1, 4) for windowed in (False, True)
                    for name in backward.bwd_tf32x3_name_expressions(d, vector, windowed)})
    assert len(names) == 2 * 2 * 2 * 2
    usage = nvrtc.resource_usage("attention.cu", names, arch)
    spilling = {name: r for name, r in usage.items() if r.spill_stores or r.spill_loads}
    assert not spilling, spilling
