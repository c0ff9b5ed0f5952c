"""Per-device facts the ops size their kernels by, each read once per device."""

from __future__ import annotations

# Dynamic shared memory a CTA may use on the H200 (sm_90 opt-in 227 KB, less 1 KB kept for the kernels'
# static shared memory): the figure the standard problems assume. Other chips: sm_80 163 KB, sm_86/89/120
# 99 KB; ops read the real one with ``shared_memory_limit``.
SM90_SHARED_BYTES = 227 * 1024 - 1024

_shared_limits: dict[int, int] = {}
_capabilities: dict[int, tuple[int, int]] = {}


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
