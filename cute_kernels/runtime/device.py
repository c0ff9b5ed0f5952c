"""Per-device facts the ops size their kernels by, each read once per device, and the one way an op runs
its launch on a tensor's device."""

from __future__ import annotations

# The H200 (132 SMs) is the GPU the heuristics model: default configs are chosen for it and then checked
# on the real device by each entry's ``supports()``. Launch plans read the real count with ``sm_count``.
H200_SM_COUNT = 132

# The most CTAs one launch's grid holds along x (CUDA's gridDim.x limit on every supported chip).
MAX_GRID_X = 2**31 - 1

# Opt-in dynamic shared memory per block on sm_90 (H100/H200): 227 KB. The CuTe GEMMs size their stages
# against it (their shared memory is all dynamic).
SM90_SHARED_OPTIN_BYTES = 227 * 1024

# Shared memory of one sm_90 SM, and what the hardware keeps of it per resident CTA: two CTAs share an SM
# only if each takes at most (228 KB - 2 x 1 KB) / 2 = 113 KB.
SM90_SHARED_PER_SM_BYTES = 228 * 1024
SHARED_RESERVED_PER_CTA_BYTES = 1024


def sm90_shared_per_cta_bytes(ctas_per_sm: int) -> int:
    """Dynamic shared memory each of ``ctas_per_sm`` CTAs may take for that many to be resident on one sm_90
    SM at once (one CTA: the opt-in maximum)."""
    if ctas_per_sm == 1:
        return SM90_SHARED_OPTIN_BYTES
    return SM90_SHARED_PER_SM_BYTES // ctas_per_sm - SHARED_RESERVED_PER_CTA_BYTES


# The same opt-in per compute capability (major * 10 + minor), for problems measured on other chips: the
# CUDA programming guide's per-block maximum. A capability not listed gets the smallest (99 KB).
_SHARED_OPTIN_BY_SM = {80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024, 89: 99 * 1024, 90: SM90_SHARED_OPTIN_BYTES,
                       100: SM90_SHARED_OPTIN_BYTES, 103: SM90_SHARED_OPTIN_BYTES, 120: 99 * 1024, 121: 99 * 1024}


def shared_optin_bytes(sm: int) -> int:
    """Opt-in dynamic shared memory per block on compute capability ``sm`` (e.g. 90), for the CuTe GEMMs'
    validity checks: 227 KB on sm_90/100, 163 KB on sm_80/87, 99 KB on sm_86/89/120 and unknown chips."""
    return _SHARED_OPTIN_BY_SM.get(sm, 99 * 1024)

# Dynamic shared memory a CTA of the NVRTC kernels may use on the H200 (the opt-in less 1 KB kept for their
# static shared memory): the figure the standard problems assume. Other chips: sm_80 163 KB, sm_86/89/120
# 99 KB; ops read the real one with ``shared_memory_limit``.
SM90_SHARED_BYTES = SM90_SHARED_OPTIN_BYTES - 1024

_shared_limits: dict[int, int] = {}
_capabilities: dict[int, tuple[int, int]] = {}
_sm_counts: dict[int, int] = {}


def capability(device_index: "int | None" = None) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device (None: the current one). Read once per device:
    a known device's answer is one dict lookup (every GEMM launch asks)."""
    cap = _capabilities.get(device_index) if device_index is not None else None
    if cap is not None:
        return cap
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
    if device_index is None:
        device_index = torch.cuda.current_device()
    cap = _capabilities.get(device_index)
    if cap is None:
        cap = _capabilities[device_index] = tuple(torch.cuda.get_device_capability(device_index))
    return cap


def arch(device_index: "int | None" = None, *, arch_specific: bool = False) -> str:
    """``sm_XY`` of a CUDA device (None: the current one). ``arch_specific`` adds the ``a`` suffix from
    sm_90 on (``sm_90a``: wgmma, TMA and the other features of that one chip), the target the CuTe DSL
    compiles for; NVRTC builds and tuned tables use the plain name."""
    major, minor = capability(device_index)
    name = f"sm_{major}{minor}"
    return specific(name) if arch_specific else name


def specific(arch: str) -> str:
    """``arch`` (``sm_XY`` or ``sm_XYa``) as the target of kernels that use one chip's own instructions: the
    ``a`` suffix from sm_90 on, none below (where there is no such target)."""
    base = arch.removesuffix("a")
    return base + "a" if int(base.removeprefix("sm_")) >= 90 else base


def device_sm(t) -> int:
    """Compute capability (major * 10 + minor) of a CUDA tensor's device; 90 for a CPU tensor (tests)."""
    if not t.is_cuda:
        return 90
    major, minor = capability(t.device.index)
    return 10 * major + minor


def sm_count(device_index: int) -> int:
    """Streaming multiprocessors of ``device_index``, read once per device."""
    count = _sm_counts.get(device_index)
    if count is None:
        import torch

        count = _sm_counts[device_index] = torch.cuda.get_device_properties(device_index).multi_processor_count
    return count


def on_device(device_index: int | None, fn, *args):
    """``fn(*args)`` with ``device_index`` the current CUDA device: compiles, kernel loads and torch's
    current stream all follow the current device, so a launch for a tensor on another GPU switches to it
    (a guard costs a few microseconds, so it is skipped when the device is already current). CPU tensors
    (``device_index`` None: the fake and CPU-tier paths) have no device to switch to."""
    import torch

    if device_index is None or device_index == _get_device():
        return fn(*args)
    with torch.cuda.device(device_index):
        return fn(*args)


def shared_memory_limit(device_index: int) -> int:
    """Opt-in dynamic shared memory per CTA on ``device_index``, less 1 KB for static shared memory."""
    limit = _shared_limits.get(device_index)
    if limit is None:
        import torch

        props = torch.cuda.get_device_properties(device_index)
        optin = getattr(props, "shared_memory_per_block_optin", 0) or 48 * 1024
        limit = _shared_limits[device_index] = optin - 1024
    return limit


def current_stream_handle(device_index: int) -> int:
    """The raw ``cudaStream_t`` of torch's current stream on ``device_index``: what an NVRTC launch passes.
    torch's CUDA builds expose it directly (the binding Inductor's generated code calls per launch); where
    they do not, it is read from a ``torch.cuda.Stream``, which costs a Python object per call."""
    global _raw_stream
    if _raw_stream is None:
        import torch

        _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _raw_stream_via_stream_object
    return _raw_stream(device_index)


def _raw_stream_via_stream_object(device_index: int) -> int:
    import torch

    return torch.cuda.current_stream(device_index).cuda_stream


_raw_stream = None


def stream_capturing() -> bool:
    """Whether torch's current stream is capturing a CUDA graph (a per-stream buffer must then come from the
    graph's memory, not a kept one): asked on every launch that takes such a buffer, so through torch's
    binding itself where the build has it (``torch.cuda.is_current_stream_capturing`` wraps it in a frame)."""
    global _capture_query
    if _capture_query is None:
        import torch

        _capture_query = (getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
                          or torch.cuda.is_current_stream_capturing)
    return _capture_query()


_capture_query = None


def _get_device() -> int:
    """The current CUDA device's index without ``torch.cuda.current_device()``'s initialisation check (the
    callers hold CUDA tensors): on every launch path. Replaces itself on first use with torch's own getter
    (absent from CPU-only builds, where the public function stands in)."""
    global _get_device
    import torch

    _get_device = getattr(torch._C, "_cuda_getDevice", None) or (lambda: torch.cuda.current_device())
    return _get_device()
