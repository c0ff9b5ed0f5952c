"""Host-side pieces shared by the GEMM ops: the problem description, argument validation, the degenerate
cases (empty outputs, K == 0) that never launch a kernel, the default-config ladder walk, compile/launch
plumbing (compile keys, fake-tensor compiles, launches on torch's stream), the public op's body and the
registry's inputs and reference.

Both ``sgemm`` and ``hgemm`` compute ``alpha * a @ b + beta * c`` on row-major matrices with the same
argument rules (DESIGN.md, "Public API"); only the dtypes and the widest vector differ.
"""

from __future__ import annotations

import dataclasses

import torch

from legacy_cuda.nvrtc import DRY_RUN  # cute_kernels.precompile's switch, shared with the NVRTC launcher

from .. import _checks
from ..runtime.cute_compile import (
    alignment_elems,
    default_arch,
    dsl_version,
    env_stream,
    fake_matrix,
)
from ..runtime.device import capability

__all__ = [
    "GemmProblem",
    "validate_gemm_args",
    "unit_strides",
    "make_problem",
    "device_sm",
    "trivial_result",
    "estimated_time",
    "choose_from_ladder",
    "smem_problem",
    "copy_layouts_problem",
    "compile_key",
    "compile_cached",
    "compile_kernel",
    "launch_compiled",
    "gemm_spec",
    "choose_variant",
    "run_gemm",
    "make_inputs",
    "reference",
    "launch_returning_out",
]

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


@dataclasses.dataclass(frozen=True)
class GemmProblem:
    """Everything about one GEMM call that a config or a compile key may depend on.

    ``dtype``: the element type of A, B, C and D ("float32", "float16" or "bfloat16").
    ``a_align``, ``b_align``, ``c_align``: the widest vector (in elements: 4, 2, 1 for float32; 8, 4, 2, 1
    for 16-bit types -- 16 bytes at most) that every access of A (along K), B (along N) and C/out (along N)
    can use -- base address, leading dimension and contiguous extent all multiples of it (see
    ``runtime.cute_compile.alignment_elems``). ``beta_zero``: C is not read.
    ``sm``: compute capability of the device it runs on (major * 10 + minor: 90 for the H100/H200), which
    decides the variants that can run it (TMA and wgmma need 90); problems made without a device (tests,
    sweeps, compile checks) describe the H200 the project tunes on.
    """

    m: int
    n: int
    k: int
    dtype: str = "float32"
    beta_zero: bool = True
    a_align: int = 4
    b_align: int = 4
    c_align: int = 4
    sm: int = 90

    def __post_init__(self) -> None:
        for name in ("m", "n", "k"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"GemmProblem.{name}: expected an int >= 0, got {getattr(self, name)!r}")
        if self.dtype not in _DTYPE_NAMES.values():
            raise ValueError(f"GemmProblem.dtype: expected one of {sorted(_DTYPE_NAMES.values())}, got {self.dtype!r}")
        widest = 4 if self.dtype == "float32" else 8
        allowed = tuple(v for v in (1, 2, 4, 8) if v <= widest)
        for name in ("a_align", "b_align", "c_align"):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"GemmProblem.{name}: expected one of {', '.join(map(str, allowed))} for {self.dtype}, "
                    f"got {getattr(self, name)!r}"
                )
        if not isinstance(self.sm, int) or self.sm < 10:
            raise ValueError(f"GemmProblem.sm: expected a compute capability such as 80 or 90, got {self.sm!r}")


def shape_bucket(problem: GemmProblem) -> str:
    """Tuned-config key (see cute_kernels/tuned.py): dtype, the log2 of M, N and K (rounded down), whether C
    is read, and the alignments (they change which configs compile)."""
    def log2(v: int) -> int:
        return max(v, 1).bit_length() - 1

    return (f"{problem.dtype}:m2^{log2(problem.m)}:n2^{log2(problem.n)}:k2^{log2(problem.k)}:"
            f"{'beta0' if problem.beta_zero else 'beta'}:align{problem.a_align}.{problem.b_align}.{problem.c_align}")


def _check_matrix(name: str, t, dtypes, shape: tuple[int, int] | None = None) -> None:
    _checks.tensor(name, t)
    _checks.dtype_in(name, t, dtypes)
    _checks.row_major_matrix(name, t, shape=shape)


def validate_gemm_args(a, b, c, *, alpha, beta, out, config, config_cls, dtypes) -> tuple[int, int, int, bool]:
    """Every check of a GEMM call, before anything is allocated or written; returns (m, n, k, beta_zero).

    ``dtypes``: the accepted input dtypes; when there are several, b, c and out must have a's.
    """
    _check_matrix("a", a, dtypes)
    same = (a.dtype,) if len(dtypes) > 1 else dtypes
    _check_matrix("b", b, same)
    m, k = a.shape
    if b.shape[0] != k:
        raise ValueError(f"b: expected {k} rows to match a's {k} columns (a is {tuple(a.shape)}), got {tuple(b.shape)}")
    n = b.shape[1]
    _checks.real_scalar("alpha", alpha)
    beta_zero = _checks.real_scalar("beta", beta) == 0.0
    if c is not None:
        _check_matrix("c", c, same, (m, n))
    elif not beta_zero:
        raise ValueError(f"c: required when beta != 0 (beta={beta}), got None")
    if out is not None:
        _check_matrix("out", out, same, (m, n))
    _checks.config_type(config, config_cls)

    # Device checks come after every structural check, so those are testable with CPU tensors.
    operands = {"a": a, "b": b, "c": c, "out": out}
    for name, t in operands.items():
        if t is not None:
            _checks.cuda_tensor(name, t)
    _checks.same_device(**operands)
    check_out_overlaps(a, b, c, out, beta_zero)
    return m, n, k, beta_zero


def check_out_overlaps(a, b, c, out, beta_zero: bool) -> None:
    """``out`` must not share memory with A or B, and with C only as C itself (in place): the checks that
    depend on where the tensors are, not on their structure."""
    if out is None:
        return
    for name, t in (("a", a), ("b", b)):
        if _checks.overlaps(out, t):
            raise ValueError(f"out: must not overlap input {name} (it is read while out is written)")
    if c is not None and not beta_zero and _checks.overlaps(out, c):
        same_view = out.data_ptr() == c.data_ptr() and out.stride() == c.stride()
        if not same_view:
            raise ValueError("out: must be c itself (in place) or not overlap c, got a partial overlap")


# Calls already validated, by their structure (see _checks.ValidatedCalls): the tensors, the type of beta
# and whether it is 0, the config's type and the op's dtypes. A repeat skips the structural checks and the
# problem measurement (about half of the host time of a small GEMM call); the scalars and the overlap checks
# still run every call.
_VALIDATED = _checks.ValidatedCalls()


def _call_key(a, b, c, out, beta, config, dtypes):
    try:
        beta_zero = bool(beta == 0)
    except Exception:  # noqa: BLE001 -- an odd beta goes to the full checks, which name it
        return None
    return _VALIDATED.key((a, b, c, out), type(beta), beta_zero, type(config), dtypes)


def trivial_result(result, c, *, k: int, beta, beta_zero: bool) -> bool:
    """Handle the calls that need no kernel; True when ``result`` is final.

    An empty output needs nothing. With K == 0 there is no product: D = beta * C (rounded once in the
    output dtype), and with beta == 0 exactly zero (C unread).
    """
    if result.shape[0] == 0 or result.shape[1] == 0:
        return True
    if k == 0:
        if beta_zero:
            result.zero_()
        else:
            result.copy_(c * float(beta))
        return True
    return False


def unit_strides(t):
    """A view with the canonical strides the kernels' layouts expect: stride 1 in the last dim and a row
    stride >= the column count even where a size-1 dim let torch report something else."""
    rows, cols = t.shape
    ld = t.stride(0) if rows > 1 else max(cols, 1)
    if t.stride(1) == 1 and t.stride(0) == ld:
        return t
    return t.as_strided((rows, cols), (ld, 1))


def device_sm(t) -> int:
    """Compute capability (major * 10 + minor) of a CUDA tensor's device; 90 for a CPU tensor (tests)."""
    if not t.is_cuda:
        return 90
    major, minor = capability(t.device.index)
    return 10 * major + minor


def make_problem(a, b, c=None, *, beta=0.0, out=None) -> GemmProblem:
    """The problem of validated tensors (alignments measured on the actual pointers and strides, up to
    16 bytes for 16-bit types and 4 elements for float32; the compute capability of their device)."""
    m, k = a.shape
    n = b.shape[1]
    dtype = _DTYPE_NAMES[a.dtype]
    widest = 4 if dtype == "float32" else 8
    beta_zero = float(beta) == 0.0
    c_align = widest
    for t in ([out] if out is not None else []) + ([c] if (c is not None and not beta_zero) else []):
        c_align = min(c_align, alignment_elems(t, widest))
    return GemmProblem(
        m=m,
        n=n,
        k=k,
        dtype=dtype,
        beta_zero=beta_zero,
        a_align=alignment_elems(a, widest),
        b_align=alignment_elems(b, widest),
        c_align=c_align,
        sm=device_sm(a),
    )


# The heuristics' model of the H200: 132 SMs; an SM runs its arithmetic pipes at full rate from 8 resident
# warps up (the 1-CTA 8-warp configs), proportionally slower below (one 4-warp CTA alone on an SM cannot hide
# its shared-memory latency and barriers).
_SM_COUNT_H200 = 132
_WARPS_TO_SATURATE = 8


def estimated_time(config, ctas_per_sm: int, throughput: float, problem: GemmProblem) -> float:
    """Relative run time of ``config`` (anything with tile_m, tile_n, num_threads) on the busiest SM: the
    tiles it computes (tiles are spread over the SMs), each at the rate its resident warps sustain -- a
    full ``throughput`` from 8 warps up, proportionally less below. ``ctas_per_sm``: how many CTAs of the
    config one SM holds (registers and shared memory)."""
    tiles = -(-problem.m // config.tile_m) * -(-problem.n // config.tile_n)
    per_sm = -(-tiles // _SM_COUNT_H200)
    warps = min(ctas_per_sm, per_sm) * config.num_threads // 32
    rate = throughput * min(1.0, warps / _WARPS_TO_SATURATE)
    return per_sm * config.tile_m * config.tile_n / rate


# ---------------------------------------------------------------------------------------------- configs
def choose_from_ladder(ladder, problem: GemmProblem, *, why_unsupported, candidates, family: str, adapt=None):
    """The default-config heuristic both families share: of ``ladder`` ((config, CTAs one SM holds,
    relative throughput), largest tile first) the supported entry with the smallest
    :func:`estimated_time`; else the first supported candidate. ``adapt(config, problem)``: a family's
    per-problem change to a ladder entry before it is judged (None: none)."""
    best = None
    for config, ctas, throughput in ladder:
        if adapt is not None:
            config = adapt(config, problem)
        if why_unsupported(config, problem) is not None:
            continue
        t = estimated_time(config, ctas, throughput, problem)
        if best is None or t < best[0]:
            best = (t, config)
    if best is not None:
        return best[1]
    for fallback in candidates():
        if why_unsupported(fallback, problem) is None:
            return fallback
    raise ValueError(f"no {family} config supports {problem}")


def smem_problem(smem: int, budget: int) -> "str | None":
    """Why ``smem`` bytes of shared memory per CTA do not fit a CTA's ``budget`` (None: they fit)."""
    if smem > budget:
        return f"needs {smem} bytes of shared memory, more than the {budget} a CTA may have"
    return None


def copy_layouts_problem(config, a_vector: int, b_vector: int) -> "str | None":
    """Why the config's global->shared copy layouts cannot move A / B in vectors of that many elements."""
    for operand, vector in (("a", a_vector), ("b", b_vector)):
        why = config.copy_layout_problem(operand, vector)
        if why is not None:
            return why
    return None


# ---------------------------------------------------------------------------------------------- compile
def compile_key(family: str, config, dtype: str, vectors: tuple[int, int, int], beta_zero: bool, arch: str) -> tuple:
    """Every compile-time property, nothing dynamic: sizes and leading dimensions are runtime values.
    ``vectors``: the (A, B, C/D) copy widths the kernel uses."""
    return (family, config, dtype, "A:K-major", "B:N-major", "C:N-major", *vectors, beta_zero, arch, dsl_version())


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


def compile_kernel(kernel, cute_dtype, vectors: tuple[int, int, int], arch: str, extra_args: tuple = (),
                   extra_options: str = ""):
    """``cute.compile`` a GEMM kernel object from fake tensors, so it works without a GPU: dynamic M, N, K
    and leading dimensions; A (M, K) and C, D (M, N) row-major, B as (N, K) with N contiguous; each
    leading dimension its own symbol whose divisibility is the alignment the caller proved (``vectors``:
    A, B, C/D elements). ``extra_args``: a family's further runtime scalars (passed after alpha and beta;
    their values do not matter here, only their types). ``extra_options``: more ``cute.compile`` options,
    e.g. "--keep-ptx --dump-dir DIR" to inspect the code (tests).

    The result is a TVM-FFI function (see ``runtime/cute_compile``): it takes torch tensors and Python
    scalars, checks them against this signature in C++ and launches on torch's current stream, for ~10 us
    of host time per call."""
    import cutlass
    import cutlass.cute as cute

    av, bv, cv = vectors
    m, n, k = cute.sym_int(), cute.sym_int(), cute.sym_int()
    a = fake_matrix(cute_dtype, m, k, cute.sym_int64(divisibility=av), row_major=True, align_elems=av)
    b = fake_matrix(cute_dtype, n, k, cute.sym_int64(divisibility=bv), row_major=False, align_elems=bv)
    c = fake_matrix(cute_dtype, m, n, cute.sym_int64(divisibility=cv), row_major=True, align_elems=cv)
    d = fake_matrix(cute_dtype, m, n, cute.sym_int64(divisibility=cv), row_major=True, align_elems=cv)
    f32 = cutlass.Float32
    return cute.compile(kernel, a, b, c, d, f32(1.0), f32(0.0), *extra_args, env_stream(),
                        options=f"--gpu-arch {arch} --enable-tvm-ffi {extra_options}".strip())


def launch_compiled(compiled, problem: GemmProblem, inputs: dict, out, extra_args: tuple = ()) -> None:
    """Run ``compiled`` on ``out``'s device and torch's current stream. ``inputs``: a, b, optional c, alpha,
    beta, validated against ``problem`` by the caller (the compiled function checks dtypes, devices, ranks,
    unit strides and the alignments it was compiled for, and nothing about the GEMM's semantics);
    ``extra_args`` as in :func:`compile_kernel`, as Python ints."""
    if DRY_RUN.get():  # cute_kernels.precompile: compiled (and cached) is all that was asked
        return
    c = inputs.get("c")
    # With beta == 0 the binary has no load of C: D stands in for it.
    compiled(inputs["a"], inputs["b"].t(),  # B as its (N, K) view, N contiguous
             out if (problem.beta_zero or c is None) else c, out,
             float(inputs.get("alpha", 1.0)), float(inputs.get("beta", 0.0)), *extra_args)


# ---------------------------------------------------------------------------------------------- public ops
def choose_variant(specs, problem: GemmProblem, config, device_index: int):
    """(spec, config) that runs ``problem``: with ``config`` given, the entry of ``specs`` whose config class
    it is (ValueError, naming the reason, if that entry does not support the problem); with None, the first
    entry whose chosen config (tuned or heuristic) it supports -- the last entry is the catch-all."""
    if config is None:
        from .. import tuned

        for spec in specs:
            config, supported = tuned.choose_supported(spec, problem, device_index)
            if supported:
                return spec, config
    else:
        spec = next(s for s in specs if isinstance(config, s.config_cls))
    why = spec.why_unsupported(config, problem)
    if why is not None:
        raise ValueError(f"config: {config.short()} cannot run {problem}: {why}")
    return spec, config


def run_gemm(a, b, c, *, alpha, beta, out, config, dtypes, specs, order=None):
    """The body of a public GEMM op: validate, allocate (the result has ``a``'s dtype), handle the calls
    that need no kernel, measure the problem, choose the variant and config (or check the given one),
    launch on the result's device.

    ``specs``: the op's registry entries in order of preference. A given config runs on the entry whose
    config class it is; with none, the first entry whose chosen config (tuned or heuristic) it ``supports()``
    runs -- e.g. the Hopper HGEMM where TMA can describe the operands, the sm80-style one elsewhere.
    ``order(problem)``, when given, reorders ``specs`` per problem (a measured-speed preference).
    """
    key = _call_key(a, b, c, out, beta, config, dtypes)
    known = _VALIDATED.get(key)
    if known is None:
        config_classes = tuple(spec.config_cls for spec in specs)
        m, n, k, beta_zero = validate_gemm_args(
            a, b, c, alpha=alpha, beta=beta, out=out, config=config, config_cls=config_classes, dtypes=dtypes
        )
    else:  # a call of this structure passed every structural check before; see _VALIDATED
        m, n, k, beta_zero, problem = known
        _checks.real_scalar("alpha", alpha)
        _checks.real_scalar("beta", beta)
        check_out_overlaps(a, b, c, out, beta_zero)
    result = out if out is not None else torch.empty((m, n), dtype=a.dtype, device=a.device)
    if trivial_result(result, c, k=k, beta=beta, beta_zero=beta_zero):
        return result

    a_run, b_run, out_run = unit_strides(a), unit_strides(b), unit_strides(result)
    c_run = unit_strides(c) if (c is not None and not beta_zero) else None
    if known is None:
        problem = make_problem(a_run, b_run, c_run, beta=beta, out=out_run)
        _VALIDATED.remember(key, (m, n, k, beta_zero, problem))
    if order is not None:
        specs = order(problem)
    spec, config = choose_variant(specs, problem, config, result.device.index)
    inputs = {"a": a_run, "b": b_run, "c": c_run, "alpha": alpha, "beta": beta}
    if result.device.index == torch.cuda.current_device():
        spec.launch(config, problem, inputs, out_run)
    else:  # the compiled function follows its tensors' device, but compiling and torch's stream need it current
        with torch.cuda.device(result.device):
            spec.launch(config, problem, inputs, out_run)
    return result


# ---------------------------------------------------------------------------------------------- registry
def flops(problem: GemmProblem) -> float:
    return 2.0 * problem.m * problem.n * problem.k


def traffic_bytes(problem: GemmProblem) -> float:
    """A, B and D once each, and C when it is read."""
    element = 4 if problem.dtype == "float32" else 2
    return element * (problem.m * problem.k + problem.k * problem.n
                      + problem.m * problem.n * (1 if problem.beta_zero else 2))


def make_inputs(problem: GemmProblem, device, generator=None) -> dict:
    """randn A and B (and C when it is read) of the problem's dtype, drawn in FP32 and rounded;
    alpha = 1.5, beta = 0.5 (0 when C is not read)."""
    dtype = getattr(torch, problem.dtype)

    def randn(*shape):
        return torch.randn(*shape, dtype=torch.float32, device=device, generator=generator).to(dtype)

    inputs = {"a": randn(problem.m, problem.k), "b": randn(problem.k, problem.n), "alpha": 1.5, "beta": 0.0}
    if not problem.beta_zero:
        inputs["c"] = randn(problem.m, problem.n)
        inputs["beta"] = 0.5
    return inputs


def reference(problem: GemmProblem, inputs: dict):
    """alpha * a @ b + beta * c in float64."""
    a, b = inputs["a"].double(), inputs["b"].double()
    ref = inputs.get("alpha", 1.0) * (a @ b)
    if not problem.beta_zero:
        ref = ref + inputs["beta"] * inputs["c"].double()
    return ref


def launch_returning_out(launch):
    """The registry's launcher (it returns the result) from a family's ``launch``."""
    def run(config, problem, inputs, out):
        launch(config, problem, inputs, out)
        return out

    return run


def gemm_spec(*, launch, **fields):
    """A GEMM family's registry entry: what every CuTe GEMM shares (backend, randn inputs, the float64
    reference, flops and traffic, a launcher returning the result from the family's ``launch``) and the
    family's own ``fields``."""
    from ..registry import KernelSpec

    return KernelSpec(backend="cute", launch=launch_returning_out(launch), make_inputs=make_inputs,
                      reference=reference, flops=flops, bytes=traffic_bytes, **fields)
