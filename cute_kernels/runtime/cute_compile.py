"""Shared CuTe DSL runtime: compile cache, fake tensors for CPU compiles, the TVM-FFI call path.

Rules this module enforces (docs/design.md, "Runtime rules"):

- ``cute.compile`` runs once per *compile key*: every compile-time knob (config, dtypes, majorness, alignment,
  the beta==0 flag, arch, DSL version) and no dynamic dimension. Sizes and leading dimensions are dynamic, so
  one binary serves every M, N, K.
- Kernels are compiled from fake tensors (``make_fake_tensor`` with ``cute.sym_int`` sizes), so a machine
  with no GPU can compile-check every config; the arch is passed explicitly (``--gpu-arch``), never taken
  from whatever GPU happens to be present.
- Binaries are kept on disk between processes (``runtime.cute_disk``): a later process loads one without
  importing the DSL.
- Kernels are compiled with TVM-FFI (``--enable-tvm-ffi``; the ``apache-tvm-ffi`` package), so the
  compiled function takes torch tensors and Python scalars directly, converts them through DLPack in C++,
  checks each against the signature it was compiled from (a CPU tensor, say, is refused by argument name)
  and launches on torch's current stream (the stream argument is the *environment*
  stream, :func:`env_stream`). That is ~10 us of host time per call, where building CuTe tensors with
  ``from_dlpack`` and calling the DSL's Python executor costs ~150 us (docs/notes/host-path.md#tvm-ffi). The
  check does not know the GEMM's semantics (which sizes must agree, what may overlap), so callers still
  validate first.
"""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import Any, Callable, Hashable

from . import cute_disk, device
from .bounded import remember

__all__ = [
    "CompileCache",
    "dsl_version",
    "default_arch",
    "fake_matrix",
    "env_stream",
]


@functools.lru_cache(maxsize=1)
def dsl_version() -> str:
    """The installed nvidia-cutlass-dsl version (part of every compile key): from its metadata, without
    importing the DSL; from the DSL itself where it was unpacked without metadata."""
    version = cute_disk.installed_version("nvidia-cutlass-dsl")
    if version == "absent":
        import cutlass

        version = getattr(cutlass, "__version__", "unknown")
    return version


def default_arch() -> str:
    """The arch to compile for when none is given: ``CUTE_DSL_ARCH``, else the current CUDA device's."""
    arch = os.environ.get("CUTE_DSL_ARCH")
    if arch:
        return arch
    try:
        return device.arch(None, arch_specific=True)
    except RuntimeError as e:
        raise RuntimeError(f"{e}: pass an explicit arch such as 'sm_90a' to compile without a GPU") from None


class CompileCache:
    """Compile-key -> compiled executor, filled on first use.

    ``cute.compile`` is not thread-safe, so compiles are serialised by one lock; lookups of a warm key take
    no lock. Keys must be hashable tuples holding every compile-time property (see module docstring). A
    cache named for a ``family`` whose kernel sources live under ``sources`` also keeps each binary on disk
    for later processes (``runtime.cute_disk``); an unnamed one lives in memory only.
    """

    def __init__(self, family: str | None = None, sources: Path | None = None) -> None:
        self.family, self.sources = family, sources
        # Keyed by compile key, which holds no dynamic dimension: one entry per binary (config, dtypes,
        # majorness, alignment, beta flag, arch), a finite set, so unbounded.
        self._compiled: dict[Hashable, Any] = {}
        self._lock = threading.Lock()
        # (config, problem, arch) -> the executor a call of that problem runs: the launch path's lookup,
        # which skips the validity check and the compile-key build once a problem has run (see
        # ops.gemm.compile.compile_cached). Keyed by problem shapes, so bounded (runtime.bounded); filled
        # only through remember_problem, so that a clear() cannot be undone by a compile that was in flight.
        self.by_problem: dict[Hashable, Any] = {}
        self.generation = 0

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        compiled = self._compiled.get(key)
        if compiled is not None:
            return compiled
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is None:
                if self.family is None:
                    compiled = build()
                else:
                    compiled = cute_disk.load_or_build(self.family, self.sources, key, build)
                self._compiled[key] = compiled
        return compiled

    def __contains__(self, key: Hashable) -> bool:
        return key in self._compiled

    def __len__(self) -> int:
        return len(self._compiled)

    def remember_problem(self, problem_key: Hashable, compiled: Any, generation: int,
                         max_entries: int | None = None) -> None:
        """Record ``compiled`` for ``problem_key`` unless the cache was cleared since ``generation`` (read
        before the compile) was."""
        with self._lock:
            if generation == self.generation:
                remember(self.by_problem, problem_key, compiled, max_entries)

    def clear(self) -> None:
        from .plans import clear_all

        with self._lock:
            self._compiled.clear()
            self.by_problem.clear()
            self.generation += 1
        clear_all()  # the ops' plans hold compiled functions


def fake_matrix(dtype, rows, cols, ld, *, row_major: bool, align_elems: int, batch=None):
    """A fake (tensor-free) CuTe matrix for ``cute.compile``, laid out as the torch tensor a call passes.

    ``rows``, ``cols``, ``ld`` are ``cute.sym_int`` objects (shared ones for shared sizes). A row-major
    matrix has strides (ld, 1); a column-major one (1, ld). The leading dimension is a 64-bit symbol whose
    divisibility is ``align_elems`` (declared by the caller's ``sym_int64``), and the base pointer is
    assumed ``align_elems * element bytes`` aligned, which is what lets the DSL emit vector copies.
    ``batch``: a ``cute.sym_int`` for a leading mode (a batch of matrices, torch's (L, rows, cols)), whose
    stride is a 64-bit symbol divisible by ``align_elems`` too.
    """
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    stride = (ld, 1) if row_major else (1, ld)
    shape = (rows, cols)
    if batch is not None:
        shape, stride = (batch, rows, cols), (cute.sym_int64(divisibility=align_elems), *stride)
    return make_fake_tensor(dtype, shape, stride, assumed_align=align_elems * dtype.width // 8)


def env_stream():
    """The stream parameter of a TVM-FFI compile: dropped from the compiled signature, filled at each call
    with the caller's current stream (torch's, on the device of the tensor arguments)."""
    from cutlass.cute.runtime import make_fake_stream

    return make_fake_stream(use_tvm_ffi_env_stream=True)
