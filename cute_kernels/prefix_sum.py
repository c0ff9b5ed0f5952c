"""Prefix sum along the last dimension: the single-pass decoupled look-back kernel of
``legacy_cuda/scan.cu``, compiled with NVRTC, its config, its registry entry and the public ``scan`` op."""

from __future__ import annotations

import ctypes
import dataclasses

import torch

from legacy_cuda import nvrtc

from . import _checks
from .registry import KernelSpec, register
from .testing import scan_scale

SOURCE = "scan.cu"
SHARED_MEMORY_PER_CTA = 227 * 1024  # opt-in dynamic shared memory per CTA on sm_90 (164 KB on sm_80)
WORKSPACE_HEADER_BYTES = 16  # scan.cu: kWorkspaceHeaderBytes (the tile counter lives there)


def workspace_bytes(tiles: int) -> int:
    """scan.cu's TileStates layout, the larger of the two: 4-byte status words padded to 16 bytes, then
    two 8-byte values per tile (the packed layout for float needs only 8 bytes per tile)."""
    return WORKSPACE_HEADER_BYTES + 16 * (-(-tiles * 4 // 16)) + 16 * tiles

# input dtype -> (output dtype, C++ input type, C++ output type); the output follows torch.cumsum.
DTYPES = {
    torch.float32: (torch.float32, "float", "float"),
    torch.float64: (torch.float64, "double", "double"),
    torch.int32: (torch.int64, "int", "long long"),
    torch.int64: (torch.int64, "long long", "long long"),
}


@dataclasses.dataclass(frozen=True)
class ScanConfig:
    """Threads per CTA and elements per thread; a tile is ``threads * items_per_thread`` elements."""

    threads: int = 256
    items_per_thread: int = 16
    # Where the tile waits between the scan and the stores: shared memory (filled by cp.async, so the loads
    # in flight are not bounded by the register file) or registers.
    staged: bool = True

    def __post_init__(self):
        if self.threads not in (64, 128, 256, 512, 1024):
            raise ValueError(f"ScanConfig.threads: expected one of 64, 128, 256, 512, 1024, got {self.threads}")
        if self.items_per_thread not in (1, 2, 4, 8, 16, 32, 64):
            raise ValueError(f"ScanConfig.items_per_thread: expected a power of two up to 64, got {self.items_per_thread}")

    @property
    def tile(self) -> int:
        return self.threads * self.items_per_thread

    def shared_bytes(self, dtype: torch.dtype) -> int:
        """Dynamic shared memory a CTA needs: the whole input tile when staged."""
        return self.tile * dtype.itemsize if self.staged else 0


@dataclasses.dataclass(frozen=True)
class ScanProblem:
    rows: int
    length: int
    dtype: torch.dtype = torch.float32
    exclusive: bool = False
    vector: int = 0  # elements per vector access; 0 means the widest (16 bytes), as for fresh allocations

    @property
    def numel(self) -> int:
        return self.rows * self.length

    @property
    def vector_width(self) -> int:
        return self.vector or 16 // self.dtype.itemsize

    @property
    def out_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype][0]


def _vector_width(x: torch.Tensor, y: torch.Tensor) -> int:
    """Elements per access such that both x and y are aligned for it (a power of two, 16 bytes at most)."""
    width = 16 // x.element_size()
    while width > 1 and (_checks.alignment_bytes(x) < width * x.element_size()
                         or _checks.alignment_bytes(y, 32) < width * y.element_size()):
        width //= 2
    return width


def why_unsupported(config: ScanConfig, problem: ScanProblem) -> str | None:
    if problem.dtype not in DTYPES:
        return f"dtype {problem.dtype} is not supported"
    if config.items_per_thread % problem.vector_width:
        return f"items_per_thread={config.items_per_thread} is not a multiple of the vector width {problem.vector_width}"
    if config.shared_bytes(problem.dtype) > SHARED_MEMORY_PER_CTA:
        return f"a staged tile of {config.shared_bytes(problem.dtype)} bytes exceeds {SHARED_MEMORY_PER_CTA} bytes of shared memory"
    if not config.staged and config.items_per_thread > 32:
        return "more than 32 items per thread do not fit in registers (stage them in shared memory)"
    tiles = -(-problem.numel // config.tile)
    if tiles > 2**31 - 1:
        return f"{problem.numel} elements need {tiles} tiles, more than one launch's grid holds"
    return None


def candidates() -> list[ScanConfig]:
    return [ScanConfig(t, i, staged) for t in (128, 256, 512) for i in (4, 8, 16, 32, 64) for staged in (False, True)]


def default_config(problem: ScanProblem) -> ScanConfig:
    # Measured on the H200 (float32, 2026-11-29, `python -m cute_kernels sweep --op scan`): at 2^28 elements
    # 512 threads x 32 items staged in shared memory ran 1.24x torch.cumsum (the best register-staged tile,
    # 512 x 32, 1.21x); at 2^24 the two are within 3%; at 250k, 256 x 32 in registers was the fastest.
    if problem.numel >= 1 << 22:
        config = ScanConfig(512, 32, staged=True)
    else:
        config = ScanConfig(256, 32, staged=False)
    if config.items_per_thread % problem.vector_width:
        config = dataclasses.replace(config, items_per_thread=problem.vector_width)
    return config


def name_expression(config: ScanConfig, problem: ScanProblem) -> str:
    _, cin, cout = DTYPES[problem.dtype]
    def cpp(flag: bool) -> str:
        return "true" if flag else "false"

    return (f"scan::scan_kernel<{cin}, {cout}, {config.threads}, {config.items_per_thread}, "
            f"{problem.vector_width}, {cpp(problem.rows > 1)}, {cpp(problem.exclusive)}, {cpp(config.staged)}>")


def compile(config: ScanConfig, problem: ScanProblem, arch: str) -> nvrtc.Cubin:  # noqa: A001
    reason = why_unsupported(config, problem)
    if reason is not None:
        raise ValueError(f"config {config} does not support {problem}: {reason}")
    return nvrtc.compile_cubin(SOURCE, [name_expression(config, problem)], arch)


_SIGNATURE = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)


# (config, dtype, segmented, exclusive, vector width, device) -> (kernel, tile elements, shared bytes): what a
# launch needs that does not change from call to call, so the hot path is a dict lookup.
_plans: dict[tuple, tuple] = {}


def _plan(config: ScanConfig, problem: ScanProblem, device: int) -> tuple:
    key = (config, problem.dtype, problem.rows > 1, problem.exclusive, problem.vector_width, device)
    plan = _plans.get(key)
    if plan is None:
        kernel = nvrtc.kernel_for(SOURCE, name_expression(config, problem), device)
        plan = _plans[key] = (kernel, config.tile, config.shared_bytes(problem.dtype))
    return plan


# One workspace per (device, stream), grown as needed. Reuse is safe because every use is stream-ordered:
# the memset of the next call on a stream runs after the scan of the last one. Under CUDA graph capture a
# fresh one comes from the graph's own memory pool instead, so a replay never shares it with eager calls.
# (A torch allocation per call would also be safe, but costs ~3 us of host time, and in timing loops that
# also write a large L2-flush buffer it was seen to stall the host for ~150 us.)
_workspaces: dict[tuple[int, int], torch.Tensor] = {}


def _workspace(device: int, stream: int, nbytes: int) -> torch.Tensor:
    if torch.cuda.is_current_stream_capturing():
        return torch.empty(nbytes // 8, dtype=torch.int64, device=device)
    ws = _workspaces.get((device, stream))
    if ws is None or ws.numel() * 8 < nbytes:
        ws = _workspaces[(device, stream)] = torch.empty(max(nbytes, 1 << 16) // 8, dtype=torch.int64, device=device)
    return ws


def launch(config: ScanConfig, problem: ScanProblem, inputs: dict, out: torch.Tensor) -> torch.Tensor:
    """Scan ``inputs["x"]`` (contiguous, non-empty) into ``out`` (contiguous) on torch's current stream."""
    x = inputs["x"]
    device = x.device.index
    kernel, tile, shared_bytes = _plan(config, problem, device)
    n = problem.numel
    tiles = -(-n // tile)
    nbytes = workspace_bytes(tiles)
    stream = torch.cuda.current_stream(device).cuda_stream
    ws = _workspace(device, stream, nbytes).data_ptr()
    # The tile counter and every tile's status start at "not published".
    nvrtc.memset32_async(ws, 0, nbytes // 4, stream)
    nvrtc.launch(kernel, (tiles, 1, 1), (config.threads, 1, 1),
                 (x.data_ptr(), out.data_ptr(), n, problem.length, ws, ws + WORKSPACE_HEADER_BYTES),
                 _SIGNATURE, shared_mem=shared_bytes, stream_handle=stream)
    return out


def scan(x: torch.Tensor, *, exclusive: bool = False, out: torch.Tensor | None = None,
         config: ScanConfig | None = None, variant: str | None = None) -> torch.Tensor:
    """Prefix sum of ``x`` along its last dimension, like ``torch.cumsum(x, -1)``.

    float32/float64 keep their dtype; int32/int64 give int64. ``exclusive=True`` shifts the sums by one
    (the first element of each row is 0). ``out`` may be ``x`` itself when the dtypes match. A
    non-contiguous ``x`` is copied to a contiguous one first; ``out`` must be contiguous.
    """
    _checks.cuda_tensor("x", x)
    _checks.dtype_in("x", x, DTYPES)
    out_dtype = DTYPES[x.dtype][0]
    if out is not None:
        _checks.output("out", out, shape=x.shape, dtype=out_dtype, device=x.device, inputs={"x": x},
                       allow_exact_alias=("x",) if x.is_contiguous() else ())
    spec = _registry_entry(variant)
    length = x.shape[-1] if x.dim() else 1
    rows = x.numel() // length if length else 0
    if out is None:
        out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if x.numel() == 0:
        return out
    x_c = x if x.is_contiguous() else x.contiguous()
    problem = ScanProblem(rows, length, x.dtype, bool(exclusive), vector=_vector_width(x_c, out))
    if config is None:
        config = spec.default_config(problem)
    else:
        reason = spec.why_unsupported(config, problem)
        if reason is not None:
            raise ValueError(f"config: {config} cannot run {problem}: {reason}")
    if x.device.index == torch.cuda.current_device():
        return spec.launch(config, problem, {"x": x_c}, out)
    with torch.cuda.device(x.device):
        return spec.launch(config, problem, {"x": x_c}, out)


# ---- Registry entry ----------------------------------------------------------------------------------------


def _make_inputs(problem: ScanProblem, device, generator=None) -> dict:
    shape = (problem.rows, problem.length) if problem.rows > 1 else (problem.length,)
    if problem.dtype.is_floating_point:
        x = torch.randn(shape, dtype=problem.dtype, device=device, generator=generator)
    else:
        x = torch.randint(-1000, 1000, shape, dtype=problem.dtype, device=device, generator=generator)
    return {"x": x}


def _reference(problem: ScanProblem, inputs: dict) -> torch.Tensor:
    x = inputs["x"]
    wide = torch.float64 if x.dtype.is_floating_point else torch.int64
    ref = torch.cumsum(x.to(wide), dim=-1)
    if problem.exclusive:
        ref = ref - x.to(wide)
    return ref


def _baseline(problem: ScanProblem, inputs: dict) -> torch.Tensor:
    return torch.cumsum(inputs["x"], dim=-1)


def _standard_problems() -> list[ScanProblem]:
    return [
        ScanProblem(1, 1 << 28, torch.float32),
        ScanProblem(1, 1 << 24, torch.float32),
        ScanProblem(1, 250_000, torch.float32),
        ScanProblem(1, 1 << 26, torch.float64),
        ScanProblem(1, 1 << 26, torch.int32),
        ScanProblem(4096, 4096, torch.float32),
        ScanProblem(1 << 16, 100, torch.float32),
    ]


def _bytes(problem: ScanProblem) -> float:
    return problem.numel * (problem.dtype.itemsize + problem.out_dtype.itemsize)


SPEC = register(KernelSpec(
    op="scan",
    variant="lookback",
    backend="nvrtc",
    dtypes=tuple(DTYPES),
    config_cls=ScanConfig,
    default_config=default_config,
    candidates=candidates,
    why_unsupported=why_unsupported,
    compile=compile,
    launch=launch,
    make_inputs=_make_inputs,
    reference=_reference,
    baseline=_baseline,
    flops=lambda p: float(p.numel),
    bytes=_bytes,
    standard_problems=_standard_problems,
    description="single-pass decoupled look-back prefix sum (scan.cu), rows as segments",
    sources=(SOURCE,),
    baseline_name="torch.cumsum",
    bound="bandwidth",
    error_scale=lambda p, inputs: scan_scale(inputs["x"]) if p.dtype.is_floating_point else None,
))


def _registry_entry(variant: str | None) -> KernelSpec:
    from . import registry

    return registry.get("scan", variant)
