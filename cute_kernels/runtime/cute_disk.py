"""The CuTe kernels' entries in the on-disk cache (``runtime.disk_cache``): a compiled TVM-FFI function kept
between processes, so that a new process loads a kernel in milliseconds instead of compiling it for seconds.

An entry is the compiled function exported by the DSL (``export_to_c``: host code plus the embedded cubin)
and linked by the system C compiler into a shared library that names its own dependencies (the DSL's
``libcute_dsl_runtime`` and ``libtvm_ffi``, by path, resolved at load time: ``-z now``). Loading it is a
``tvm_ffi.load_module`` and needs neither the DSL nor its ~1 s import. Where no C compiler links, the entry
is the object file itself, which the DSL's own loader (``cute.runtime.load_module``) links in memory: no
compile, but the DSL's import.

The key is a sha256 over the compile key (config, dtypes, alignments, flags, arch, DSL version), the
installed DSL (and its CUDA library flavours) and TVM-FFI versions, and a fingerprint of the family's kernel sources (every ``.py`` file of
its package, and ``runtime/cute_compile.py``, whose fake tensors give every compiled function its signature),
so an edit of a kernel or of its arguments' layout, or another DSL, never loads a stale binary. Writes are atomic and
compiles of one key are serialised across processes by the cache's file lock; an entry that fails to load
is evicted and compiled again. ``CUTE_KERNELS_CACHE_DIR`` and ``CUTE_KERNELS_DISK_CACHE=0`` act on these
entries as on the NVRTC ones.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Hashable

from .disk_cache import DiskCache, cache_root

__all__ = ["load_or_build", "fingerprint", "entry_key", "installed_version"]

_LIBRARIES = DiskCache("cute", ".so")
_OBJECTS = DiskCache("cute-objects", ".o")  # where no C compiler links a shared library


class DiskCacheWarning(UserWarning):
    """A compiled kernel could not be kept on disk (the call itself is unaffected)."""


@functools.lru_cache(maxsize=None)
def installed_version(distribution: str) -> str:
    """An installed distribution's version from its metadata (no import of it), or "absent"."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


# Sources outside a family's package that shape its compiled functions: the fake tensors (their layouts are
# the compiled signatures) and the TVM-FFI stream argument.
SHARED_SOURCES = (Path(__file__).with_name("cute_compile.py"),)


@functools.lru_cache(maxsize=None)
def fingerprint(sources: Path) -> str:
    """sha256 over every ``.py`` file under ``sources`` (names and contents), ``SHARED_SOURCES`` and the
    versions of Python, the DSL and TVM-FFI: what a cached binary of that family was built from."""
    h = hashlib.sha256()
    h.update(f"python {sys.version_info.major}.{sys.version_info.minor}\n".encode())
    # The DSL's library flavours too: which one it runs (the newest the driver takes) changes when one is
    # installed or removed.
    for dist in ("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-cu12", "nvidia-cutlass-dsl-libs-cu13",
                 "apache-tvm-ffi"):
        h.update(f"{dist} {installed_version(dist)}\n".encode())
    for path in sorted(sources.rglob("*.py")):
        data = path.read_bytes()
        h.update(f"{path.relative_to(sources).as_posix()} {len(data)}\n".encode())
        h.update(data)
    for path in SHARED_SOURCES:
        data = path.read_bytes()
        h.update(f"shared {path.name} {len(data)}\n".encode())
        h.update(data)
    return h.hexdigest()


def entry_key(family: str, sources: Path, key: Hashable) -> str:
    """The disk key of one compile key of ``family`` (whose kernels live under ``sources``)."""
    return hashlib.sha256(f"{family}\n{fingerprint(sources)}\n{key!r}".encode()).hexdigest()


def _function_name(digest: str) -> str:
    return f"cute_kernels_{digest[:32]}"


def _load(digest: str, *, locked: bool = False) -> Any:
    """The cached function of ``digest``, or None (absent, switched off, or unloadable: then evicted).
    ``locked``: the caller holds the key's lock (``_LIBRARIES.lock``)."""
    for cache in (_LIBRARIES, _OBJECTS):
        entry = cache.load(digest)
        if entry is None:
            continue
        data, record = entry
        path = cache.directory() / f"{digest}{cache.suffix}"
        try:
            if cache is _LIBRARIES:
                import tvm_ffi

                return tvm_ffi.load_module(str(path)).get_function(record["function"])
            import cutlass.cute as cute

            return getattr(cute.runtime.load_module(str(path), enable_tvm_ffi=True), record["function"])
        except Exception as e:  # noqa: BLE001 - any failure to load means: evict, compile again
            warnings.warn(f"cute_kernels: the cached kernel {path} failed to load ({type(e).__name__}: {e}); "
                          "it is evicted and compiled again", DiskCacheWarning, stacklevel=3)
            # The lock load_or_build holds is the libraries' one; the objects' is another file.
            cache.evict(digest, data, locked=locked and cache is _LIBRARIES)
    return None


def _link(obj: Path) -> Path | None:
    """Link the exported object into a shared library that loads without the DSL, or None where no C
    compiler is found or the link fails."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return None
    import cutlass.cute as cute

    command = [compiler, "-shared", "-o", str(obj.with_suffix(".so")), str(obj)]
    for library in cute.runtime.find_runtime_libraries(enable_tvm_ffi=True):
        folder = os.path.dirname(library)
        command += [f"-L{folder}", f"-l:{os.path.basename(library)}", f"-Wl,-rpath,{folder}"]
    # Every symbol resolved when the library is loaded (a missing one fails the load, which evicts the
    # entry), none left for a call to trip over.
    command += ["-Wl,-z,now", "-Wl,--no-undefined"]
    try:
        done = subprocess.run(command, capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return obj.with_suffix(".so") if done.returncode == 0 else None


def _store(digest: str, compiled: Any, key: Hashable) -> None:
    name = _function_name(digest)
    record = {"function": name, "compile_key": repr(key), "dsl": installed_version("nvidia-cutlass-dsl"),
              "tvm_ffi": installed_version("apache-tvm-ffi")}
    try:
        with tempfile.TemporaryDirectory(prefix="cute_kernels-export-") as tmp:
            obj = Path(tmp) / "kernel.o"
            compiled.export_to_c(str(obj), function_name=name, export_only_tvm_ffi_symbols=True)
            library = _link(obj)
            if library is not None:
                _LIBRARIES.store(digest, library.read_bytes(), dict(record, format="shared library"))
            else:
                _OBJECTS.store(digest, obj.read_bytes(), dict(record, format="object"))
    except Exception as e:  # noqa: BLE001 - keeping a copy is an optimisation; the compiled kernel still runs
        warnings.warn(f"cute_kernels: a compiled kernel could not be kept on disk ({type(e).__name__}: {e}); "
                      "the next process compiles it again", DiskCacheWarning, stacklevel=3)


def load_or_build(family: str, sources: Path, key: Hashable, build: Callable[[], Any]) -> Any:
    """The compiled function of ``key``: from disk when a process kept it, else ``build()`` (and kept).
    Processes building one key take turns (the second loads the first one's entry)."""
    if cache_root() is None:
        return build()
    digest = entry_key(family, sources, key)
    compiled = _load(digest)
    if compiled is not None:
        return compiled
    with _LIBRARIES.lock(digest):
        compiled = _load(digest, locked=True)
        if compiled is None:
            compiled = build()
            _store(digest, compiled, key)
            # The process that compiled runs the kept binary too, as every later process will: one call
            # path (the bare TVM-FFI function, without the DSL's keyword-argument wrapper) for all of them.
            compiled = _load(digest, locked=True) or compiled
    return compiled
