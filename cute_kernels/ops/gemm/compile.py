"""Compile and launch plumbing the CuTe GEMM variants share: compile keys, the cached compile after the
variant's validity predicate, ``cute.compile`` from fake tensors (no GPU needed) and the launch on torch's
current stream."""

from __future__ import annotations

from ...runtime.cute_compile import default_arch, dsl_version, env_stream, fake_matrix
from ...runtime.device import current_stream_handle
from ...runtime.dry_run import is_dry_run
from ...runtime.workspace import stream_buffer
from .problem import GemmProblem
from .split_k import tile_count

__all__ = ["compile_key", "alignment_vectors", "compile_cached", "compile_kernel", "CompiledLaunch",
           "SplitCompiledLaunch", "gemm_launch", "launch_compiled"]


def compile_key(family: str, config, problem: GemmProblem, vectors: tuple[int, int, int], arch: str) -> tuple:
    """Every compile-time property, nothing dynamic: sizes, leading dimensions and batch strides are runtime
    values. ``vectors``: the (A, B, C/D) copy widths the kernel uses; from ``problem`` the dtype, whether C
    is read, the operands' majorness and whether the call is batched."""
    return (family, config, problem.dtype, f"A:{problem.a_major.upper()}-major", f"B:{problem.b_major.upper()}-major",
            f"C:{problem.d_major.upper()}-major", *vectors, problem.beta_zero, arch, dsl_version(), *(("batched",) if problem.batch > 1 else ()))


def alignment_vectors(problem: GemmProblem) -> tuple[int, int, int]:
    """Copy widths of A, B and C/D for the warp-MMA kernels (``hgemm_sm80``, ``sgemm_tf32x3``): the widest
    each operand's alignment allows (their copies come in every width down to one element)."""
    return problem.a_align, problem.b_align, problem.c_align


def compile_cached(cache, config, problem: GemmProblem, arch, *, why_unsupported, key, build):
    """Compile (or fetch from ``cache``) the binary for ``config`` and the problem's compile-time traits,
    after the family's one validity predicate. ``key(config, problem, arch)`` and ``build(config, problem,
    arch)`` are the family's; ``arch`` defaults to ``CUTE_DSL_ARCH`` or the current device. A (config,
    problem, arch) that compiled before is one dict lookup (the launch path names its arch)."""
    if arch is not None:
        compiled = cache.by_problem.get((config, problem, arch))
        if compiled is not None:
            return compiled
    why = why_unsupported(config, problem)
    if why is not None:
        raise ValueError(f"config {config.short()} does not support {problem}: {why}")
    arch = arch or default_arch()
    generation = cache.generation
    compiled = cache.get(key(config, problem, arch), lambda: build(config, problem, arch))
    cache.remember_problem((config, problem, arch), compiled, generation)
    return compiled


def compile_kernel(kernel, cute_dtype, vectors: tuple[int, int, int], arch: str, problem: GemmProblem,
                   extra_args: tuple = (), extra_options: str = "", split: bool = False, transposed: bool = False):
    """``cute.compile`` a GEMM kernel object from fake tensors, so it works without a GPU: dynamic M, N, K
    and leading dimensions; the tensors as a call passes them (torch's layouts, no views made per call): A
    (M, K), B (K, N), C and D (M, N) row-major; each leading dimension its own symbol whose divisibility is
    the alignment the caller proved (``vectors``: A, B, C/D elements). The kernel's entry points take the
    kernel-order views of them inside the compiled function (``kernel_common.kernel_views``). ``extra_args``: a family's further runtime scalars (passed after alpha and beta;
    their values do not matter here, only their types). ``extra_options``: more ``cute.compile`` options,
    e.g. "--keep-ptx --dump-dir DIR" to inspect the code (tests). ``split``: compile the kernel's
    split-K entry (``kernel.call_split``), which also takes the FP32 workspace (M, N, S) -- strides (ldw, 1,
    plane), both multiples of the C/D vector -- and the Int32 arrival counters (tiles,) after the scalars.
    ``problem``: the operands' majorness (A M-major, a column-major ``x.t()``: strides (1, lda); B K-major,
    a column-major ``w.t()``: (1, ldb); B N-major, row-major: (ldb, 1); C and D M-major, column-major:
    (1, ldd)) and, for a batched problem, a
    leading mode L on every matrix (torch's (L, rows, cols)) with a batch stride of its own (a multiple of
    its vector, 0 allowed: an operand that broadcasts over the batch). ``transposed``: the kernel computes
    D^T = B^T A^T from the same tensors (its entry's views, ``kernel_common.kernel_views``), so its own
    result, and split-K's workspace, are N x M.

    The result is a TVM-FFI function (see ``runtime/cute_compile``): it takes torch tensors and Python
    scalars, checks them against this signature in C++ and launches on torch's current stream, for ~10 us
    of host time per call."""
    import cutlass
    import cutlass.cute as cute

    if (problem.d_major == "m") != transposed and not getattr(kernel, "d_m_major", False):
        raise ValueError(f"{type(kernel).__name__} writes row-major results only; {problem} asks for a column-major one")
    if transposed and problem.batch > 1:
        raise ValueError(f"a transposed GEMM runs one product; {problem} is batched")
    av, bv, cv = vectors
    m, n, k = cute.sym_int(), cute.sym_int(), cute.sym_int()
    a_k_major = problem.a_major == "k"
    b_k_major = problem.b_major == "k"
    batch = cute.sym_int() if problem.batch > 1 else None
    a = fake_matrix(cute_dtype, m, k, cute.sym_int64(divisibility=av), row_major=a_k_major, align_elems=av,
                    batch=batch)
    b = fake_matrix(cute_dtype, k, n, cute.sym_int64(divisibility=bv), row_major=not b_k_major, align_elems=bv,
                    batch=batch)
    d_row_major = problem.d_major == "n"
    c = fake_matrix(cute_dtype, m, n, cute.sym_int64(divisibility=cv), row_major=d_row_major, align_elems=cv,
                    batch=batch)
    d = fake_matrix(cute_dtype, m, n, cute.sym_int64(divisibility=cv), row_major=d_row_major, align_elems=cv,
                    batch=batch)
    f32 = cutlass.Float32
    entry = kernel
    if split:
        from cutlass.cute.runtime import make_fake_tensor

        plane = (cute.sym_int64(divisibility=cv), 1, cute.sym_int64(divisibility=cv))
        rows, cols = (n, m) if transposed else (m, n)
        workspace = make_fake_tensor(f32, (rows, cols, cute.sym_int()), plane, assumed_align=16)
        arrivals = make_fake_tensor(cutlass.Int32, (cute.sym_int(),), (1,), assumed_align=4)
        extra_args = (*extra_args, workspace, arrivals)
        entry = kernel.call_split
    return cute.compile(entry, a, b, c, d, f32(1.0), f32(0.0), *extra_args, env_stream(),
                        options=f"--gpu-arch {arch} --enable-tvm-ffi {extra_options}".strip())


class CompiledLaunch:
    """A compiled GEMM bound to its compile-time facts: ``launch(a, b, c, out, alpha, beta)`` runs it on
    torch's current stream with tensors of the structure it was compiled for, validated by the caller (the
    compiled function checks dtypes, devices, ranks, unit strides and the alignments it was compiled for,
    and nothing about the GEMM's semantics). ``a`` (M, K), ``b`` (K, N), ``c`` and ``out`` (M, N), or
    with a leading batch mode, passed as they are: the compiled function makes the kernel's views. alpha
    and beta are Python floats (float32 values); ``extra`` are a family's further runtime scalars (see
    :func:`compile_kernel`)."""

    __slots__ = ("compiled", "beta_zero", "extra")

    def __init__(self, compiled, beta_zero: bool, extra: tuple = ()):
        self.compiled, self.beta_zero, self.extra = compiled, beta_zero, extra

    def __call__(self, a, b, c, out, alpha: float, beta: float) -> None:
        if is_dry_run():  # cute_kernels.precompile: compiled (and cached) is all that was asked
            return
        # With beta == 0 the binary has no load of C: D stands in for it.
        self.compiled(a, b, out if (self.beta_zero or c is None) else c, out, alpha, beta, *self.extra)


class SplitCompiledLaunch(CompiledLaunch):
    """A split-K compiled GEMM (``compile_kernel(..., split=True)``) for calls of one (M, N): each call also
    passes the current stream's FP32 partial tiles, as an (M, N, planes) view with strides (N, 1, M * N),
    and its Int32 arrival counters, one per tile (``runtime.workspace``: shared by every launch on the
    stream). The views are remade only when the stream's buffers are not the last call's."""

    __slots__ = ("device_index", "m", "n", "planes", "tiles", "views")

    def __init__(self, compiled, beta_zero: bool, device_index: int, m: int, n: int, planes: int, tiles: int,
                 extra: tuple = ()):
        super().__init__(compiled, beta_zero, extra)
        self.device_index, self.m, self.n, self.planes, self.tiles = device_index, m, n, planes, tiles
        self.views = (None, None, None, None)

    def __call__(self, a, b, c, out, alpha: float, beta: float) -> None:
        if is_dry_run():
            return
        stream = current_stream_handle(self.device_index)
        partials = stream_buffer("partials", self.device_index, stream, self.planes * self.m * self.n)
        arrivals = stream_buffer("arrivals", self.device_index, stream, self.tiles)
        last_partials, last_arrivals, planes_view, counters = self.views
        if partials is not last_partials or arrivals is not last_arrivals:
            planes_view = partials[:self.planes * self.m * self.n].view(self.planes, self.m, self.n).permute(1, 2, 0)
            counters = arrivals[:self.tiles]
            self.views = (partials, arrivals, planes_view, counters)
        self.compiled(a, b, out if (self.beta_zero or c is None) else c, out, alpha, beta, *self.extra,
                      planes_view, counters)


def gemm_launch(compiled, config, problem: GemmProblem, device_index: int, extra: tuple = ()) -> CompiledLaunch:
    """The launch of a compiled GEMM of ``config`` (any family with ``tile_m``, ``tile_n``, ``split_k``) for
    calls of ``problem`` on the device: a split-K config's takes its stream's workspace at each call.
    ``extra``: the family's further runtime scalars."""
    if problem.batch > 1 or config.split_k == 1:
        return CompiledLaunch(compiled, problem.beta_zero, extra)
    return SplitCompiledLaunch(compiled, problem.beta_zero, device_index, problem.m, problem.n, config.split_k,
                               tile_count(config, problem), extra)


def launch_compiled(launch: CompiledLaunch, inputs: dict, out) -> None:
    """``launch`` on the inputs dict of the registry (a, b, optional c, alpha, beta)."""
    launch(inputs["a"], inputs["b"], inputs.get("c"), out, float(inputs.get("alpha", 1.0)),
           float(inputs.get("beta", 0.0)))
