"""CPU tier: the CuTe kernels' disk cache (runtime.cute_disk). A compile in one process is kept on disk and
loaded by the next without the DSL; the key follows the kernel sources and the versions; a torn, foreign or
unloadable entry is rebuilt (and evicted); the cache's off switch keeps everything in memory."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from cute_kernels.runtime import cute_disk

pytest.importorskip("cutlass")

ROOT = Path(__file__).resolve().parents[1]


class _Compiled:
    """A stand-in for a compiled function: callable, and its export fails (as it would for a foreign object)."""

    def __call__(self):
        return "ran"

    def export_to_c(self, *args, **kwargs):
        raise RuntimeError("no export here")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CUTE_KERNELS_DISK_CACHE", raising=False)
    return tmp_path / "cache"


def _sources(tmp_path, text="x = 1\n"):
    folder = tmp_path / "family"
    folder.mkdir(exist_ok=True)
    (folder / "kernel.py").write_text(text)
    cute_disk.fingerprint.cache_clear()
    return folder


def test_the_key_follows_sources_versions_and_compile_key(tmp_path, monkeypatch):
    sources = _sources(tmp_path)
    first = cute_disk.entry_key("sgemm", sources, ("sgemm", 1))
    assert first == cute_disk.entry_key("sgemm", sources, ("sgemm", 1))
    assert first != cute_disk.entry_key("sgemm", sources, ("sgemm", 2))
    assert first != cute_disk.entry_key("hgemm_sm80", sources, ("sgemm", 1))
    _sources(tmp_path, "x = 2\n")  # an edited kernel source
    assert first != cute_disk.entry_key("sgemm", sources, ("sgemm", 1))
    _sources(tmp_path)
    assert first == cute_disk.entry_key("sgemm", sources, ("sgemm", 1))
    monkeypatch.setattr(cute_disk, "installed_version", lambda dist: "9.9" if dist == "nvidia-cutlass-dsl" else "1.0")
    cute_disk.fingerprint.cache_clear()
    assert first != cute_disk.entry_key("sgemm", sources, ("sgemm", 1))  # another DSL
    cute_disk.fingerprint.cache_clear()


def test_the_key_follows_the_shared_compile_sources(tmp_path, monkeypatch):
    """An edit of runtime/cute_compile.py (the fake tensors whose layouts are the compiled signatures) makes
    new keys for every family, though no family's package changed."""
    (real,) = cute_disk.SHARED_SOURCES
    assert real.exists() and real.parent.name == "runtime" and real.name == "cute_compile.py"
    sources = _sources(tmp_path)
    shared = tmp_path / "cute_compile.py"
    shared.write_text("layout = 'torch'\n")
    monkeypatch.setattr(cute_disk, "SHARED_SOURCES", (shared,))
    cute_disk.fingerprint.cache_clear()
    first = cute_disk.entry_key("sgemm", sources, ("sgemm", 1))
    shared.write_text("layout = 'kernel'\n")
    cute_disk.fingerprint.cache_clear()
    assert first != cute_disk.entry_key("sgemm", sources, ("sgemm", 1))
    cute_disk.fingerprint.cache_clear()


def test_an_unloadable_entry_is_evicted_and_rebuilt(tmp_path, cache_dir):
    sources = _sources(tmp_path)
    key = ("family", "config")
    digest = cute_disk.entry_key("family", sources, key)
    # An entry whose checksum holds but that is no shared library.
    cute_disk._LIBRARIES.store(digest, b"not a shared library", {"function": "f", "format": "shared library"})
    assert cute_disk._LIBRARIES.load(digest) is not None
    built = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = cute_disk.load_or_build("family", sources, key, lambda: built.append(1) or _Compiled())
    assert built == [1] and compiled() == "ran"
    messages = [str(w.message) for w in caught if issubclass(w.category, cute_disk.DiskCacheWarning)]
    assert any("failed to load" in m and "evicted" in m for m in messages), messages
    assert any("could not be kept on disk" in m for m in messages), messages
    assert cute_disk._LIBRARIES.load(digest) is None  # evicted, and the failed export stored nothing


def test_a_torn_entry_is_rebuilt(tmp_path, cache_dir):
    sources = _sources(tmp_path)
    key = ("family", "torn")
    digest = cute_disk.entry_key("family", sources, key)
    cute_disk._LIBRARIES.store(digest, b"whole library", {"function": "f"})
    (cache_dir / "cute" / f"{digest}.so").write_bytes(b"half")  # the checksum no longer matches
    built = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cute_disk.DiskCacheWarning)
        cute_disk.load_or_build("family", sources, key, lambda: built.append(1) or _Compiled())
    assert built == [1]


def test_the_off_switch_keeps_nothing_on_disk(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_DISK_CACHE", "0")
    sources = _sources(tmp_path)
    built = []
    for _ in range(2):
        cute_disk.load_or_build("family", sources, ("k",), lambda: built.append(1) or _Compiled())
    assert built == [1, 1]
    assert not cache_dir.exists()


_CHILD = textwrap.dedent("""
    import json, sys, time
    from cute_kernels.ops.gemm import hgemm_sm80 as H
    from cute_kernels.ops.gemm.problem import GemmProblem
    problem = GemmProblem(512, 512, 512, dtype="float16")
    t0 = time.perf_counter()
    compiled = H.compile(H.default_config(problem), problem, "sm_90a")
    print(json.dumps({"seconds": time.perf_counter() - t0, "type": type(compiled).__name__,
                      "dsl_imported": "cutlass" in sys.modules}))
""")


def _child(cache_dir):
    env = dict(os.environ, CUTE_KERNELS_CACHE_DIR=str(cache_dir), CUTE_DSL_ARCH="sm_90a")
    env.pop("CUTE_KERNELS_DISK_CACHE", None)
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_kernel_without_the_dsl(tmp_path):
    cache_dir = tmp_path / "cache"
    first = _child(cache_dir)
    assert first["dsl_imported"]  # it compiled
    linked = bool(os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc"))
    folder, suffix = ("cute", ".so") if linked else ("cute-objects", ".o")
    entries = list((cache_dir / folder).glob(f"*{suffix}"))
    assert len(entries) == 1
    record = json.loads(entries[0].with_suffix(".json").read_text())
    assert record["format"] == ("shared library" if linked else "object")
    assert "HgemmConfig" in record["compile_key"]
    second = _child(cache_dir)
    assert second["type"] == "Function"
    # Without a C compiler the entry is an object file, which only the DSL's loader links.
    assert second["dsl_imported"] is not linked, "a linked kernel kept on disk loads without importing the DSL"


@pytest.mark.timeout(60)
def test_an_unloadable_entry_found_under_the_lock_is_evicted_without_waiting_for_itself(tmp_path, cache_dir):
    """load_or_build looks again while it holds the key's lock (another process may have stored it meanwhile);
    evicting what it finds there must not take that lock a second time (flock would wait for itself)."""
    sources = _sources(tmp_path)
    digest = cute_disk.entry_key("family", sources, ("under", "lock"))
    cute_disk._LIBRARIES.store(digest, b"not a shared library", {"function": "f"})
    with cute_disk._LIBRARIES.lock(digest), warnings.catch_warnings():
        warnings.simplefilter("ignore", cute_disk.DiskCacheWarning)
        assert cute_disk._load(digest, locked=True) is None
    assert cute_disk._LIBRARIES.load(digest) is None  # evicted
