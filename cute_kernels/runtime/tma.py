"""TMA tensor maps for the raw-CUDA Hopper kernels: a map's fixed part (shape, strides, box, swizzle) is
built once per plan, and each call encodes it for that call's pointer straight into the packed launch
parameters (``cuTensorMapEncodeTiled`` through ctypes: the cuda-python binding converts its list arguments
on every call, which costs several microseconds of host time per map; ctypes with prebuilt arrays does not).

The driver's rules for a tiled map (CUDA driver API, ``cuTensorMapEncodeTiled``): a 16-byte aligned base, at
most 5 dims, every stride above the first a multiple of 16 bytes below 2^40, box sizes 1..256 with the
innermost box span a multiple of 16 bytes (at most 128 bytes under the 128-byte swizzle). ``why_not``
checks them on the host so that a call the map cannot describe goes to another variant instead of failing
in the driver."""

from __future__ import annotations

import ctypes

import torch

# CUtensorMapDataType / Swizzle / L2promotion / FloatOOBfill / Interleave values (cuda.h; the same numbers as
# cuda.bindings.driver's enums, checked by tests/test_tma_cpu.py).
DATA_TYPES = {torch.float16: 6, torch.bfloat16: 9, torch.float32: 7}
SWIZZLE_NONE = 0
SWIZZLE_128B = 3
L2_PROMOTION_128B = 2
OOB_FILL_ZEROS = 0
INTERLEAVE_NONE = 0
MAP_BYTES = 128
MAX_STRIDE = 1 << 40


class TmaMapBytes(ctypes.Structure):
    """cuda.h's CUtensorMap: 128 opaque bytes, 64-byte aligned where the kernel reads it."""

    _fields_ = [("opaque", ctypes.c_uint64 * 16)]


_encode = None


def _encoder():
    """cuTensorMapEncodeTiled from the driver library torch has already loaded."""
    global _encode
    if _encode is None:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuTensorMapEncodeTiled
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int]
        _encode = fn
    return _encode


def why_not(t: torch.Tensor, dims, strides, box) -> str | None:
    """Why a tiled map with these ``dims`` (innermost first, elements), byte ``strides`` (of dims 1..) and
    ``box`` cannot describe ``t`` (None: it can)."""
    if t.dtype not in DATA_TYPES:
        return f"TMA takes no {t.dtype}"
    if t.data_ptr() % 16:
        return "the base address is not 16-byte aligned"
    if len(dims) > 5:
        return "more than 5 dims"
    for s in strides:
        if s % 16 or not 0 < s < MAX_STRIDE:
            return f"stride {s} bytes is not a positive multiple of 16 below 2^40"
    if any(not 1 <= b <= 256 for b in box) or (box[0] * t.element_size()) % 16:
        return f"box {tuple(box)} is outside the TMA's limits"
    return None


class TiledMap:
    """One map's fixed part, for repeated encodes at changing base addresses: ``dims`` (innermost first, in
    elements), byte ``strides`` of dims 1.. (a dim of size 1 may give any valid stride), ``box`` (elements per
    dim), the 128-byte swizzle (or ``swizzle``), zeros outside the tensor."""

    def __init__(self, dtype: torch.dtype, dims, strides, box, swizzle: int = SWIZZLE_128B):
        rank = len(dims)
        self.rank, self.dtype, self.swizzle = rank, DATA_TYPES[dtype], swizzle
        self._dims = (ctypes.c_uint64 * rank)(*dims)
        self._strides = (ctypes.c_uint64 * max(1, rank - 1))(*strides)
        self._box = (ctypes.c_uint32 * rank)(*box)
        self._element_strides = (ctypes.c_uint32 * rank)(*([1] * rank))
        self._fn = _encoder()

    def encode(self, address: int, destination: int) -> None:
        """Write the map of the tensor at device ``address`` into the 64-byte aligned host memory at
        ``destination`` (a TmaMapBytes inside a launch's packed parameters)."""
        err = self._fn(destination, self.dtype, self.rank, address, self._dims, self._strides, self._box,
                       self._element_strides, INTERLEAVE_NONE, self.swizzle, L2_PROMOTION_128B, OOB_FILL_ZEROS)
        if err:
            raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {err} (dims {tuple(self._dims)}, "
                               f"strides {tuple(self._strides)}, box {tuple(self._box)})")


class ParamMaps:
    """A launch's tensor maps where they live, inside its packed parameters: ``maps`` gives each map's name,
    its ``TmaMapBytes`` field of ``params`` and its ``TiledMap``. :meth:`point` encodes a map for a call's
    tensor address, skipping the encode (several microseconds) where the address is the last call's."""

    __slots__ = ("names", "_slots", "_encoded")

    def __init__(self, params, maps: dict):
        base = ctypes.addressof(params)
        self.names = tuple(maps)
        self._slots = {name: (tiled, base + getattr(type(params), field).offset)
                       for name, (field, tiled) in maps.items()}
        self._encoded = dict.fromkeys(maps)

    def point(self, name: str, address: int) -> None:
        if self._encoded[name] != address:
            tiled, destination = self._slots[name]
            tiled.encode(address, destination)
            self._encoded[name] = address


def aligned_instance(struct_type, alignment: int = 64):
    """A ctypes ``struct_type`` instance whose address is ``alignment``-byte aligned (the driver writes tensor
    maps only to 64-byte aligned memory), kept alive by the buffer it lives in."""
    buffer = ctypes.create_string_buffer(ctypes.sizeof(struct_type) + alignment)
    offset = (-ctypes.addressof(buffer)) % alignment
    return struct_type.from_buffer(buffer, offset)  # which keeps ``buffer`` alive
