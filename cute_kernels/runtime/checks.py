"""Argument validation shared by every op: each check raises a TypeError/ValueError that names the argument,
what was expected and what came. Ops run all their checks before allocating or writing anything."""

from __future__ import annotations

import torch

INT32_MAX = 2**31 - 1


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"a {t.dtype} tensor of shape {tuple(t.shape)} on {t.device}"
    return f"{type(t).__name__}"


def tensor(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {_describe(t)}")
    return t


def cuda_tensor(name: str, t) -> torch.Tensor:
    tensor(name, t)
    if t.device.type != "cuda":
        raise ValueError(f"{name}: expected a CUDA tensor, got {_describe(t)}")
    return t


def dtype_in(name: str, t: torch.Tensor, allowed) -> None:
    if t.dtype not in allowed:
        names = ", ".join(str(d) for d in allowed)
        raise TypeError(f"{name}: expected dtype in ({names}), got {t.dtype}")


def same_device(**tensors) -> torch.device:
    items = [(n, t) for n, t in tensors.items() if t is not None]
    device = items[0][1].device
    for name, t in items[1:]:
        if t.device != device:
            raise ValueError(f"{name}: expected a tensor on {device} (like {items[0][0]}), got one on {t.device}")
    return device


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """The [first, last+1) byte span that ``t`` touches (torch strides are never negative)."""
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return (t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size())


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` may share memory (conservative: byte spans in the same storage intersect)."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False  # different allocations never overlap
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    return a0 < b1 and b0 < a1


def output(name: str, out, *, shape, dtype, device, inputs: dict, allow_exact_alias: tuple = ()) -> torch.Tensor:
    """Check a caller-provided output: type, shape, dtype, device, contiguity, and no overlap with inputs.

    ``allow_exact_alias`` names inputs that ``out`` may be (the same tensor: same pointer, shape and strides),
    for kernels where in-place is safe.
    """
    tensor(name, out)
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(out.shape)}")
    if out.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {out.dtype}")
    if out.device != device:
        raise ValueError(f"{name}: expected a tensor on {device}, got one on {out.device}")
    if not out.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {tuple(out.stride())}")
    no_overlap(name, out, inputs, allow_exact_alias)
    return out


def alignment_bytes(t: torch.Tensor, widest: int = 16) -> int:
    """The largest power of two <= ``widest`` that divides ``t``'s address (what vector accesses may assume)."""
    ptr = t.data_ptr()
    a = widest
    while a > 1 and ptr % a:
        a //= 2
    return a


def real_scalar(name: str, value) -> float:
    """A real Python/NumPy number (bool and complex refused), returned as a float."""
    if type(value) is float or type(value) is int:  # the common case, without the ABC check below
        return float(value)
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__}")
    return float(value)


def config_type(config, classes) -> None:
    """``config`` is None or an instance of ``classes`` (a class or a tuple of them: the variants an op may
    run); anything else is a TypeError naming ``config``."""
    if config is not None and not isinstance(config, classes):
        classes = classes if isinstance(classes, tuple) else (classes,)
        names = " or ".join(cls.__name__ for cls in classes)
        raise TypeError(f"config: expected a {names} or None, got {type(config).__name__}")


def row_major_matrix(name: str, t: torch.Tensor, *, shape=None) -> torch.Tensor:
    """A 2-D tensor stored row by row: stride 1 along the columns and a leading dimension (row stride) of at
    least the column count, so it may be a slice of a wider matrix. ``shape``: the (rows, cols) expected.
    Each extent must fit the kernels' 32-bit extents; offsets (leading dimension times row) are 64-bit, so
    the matrix itself may hold more than 2^31 elements. Empty matrices pass whatever their strides."""
    if t.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D matrix, got {t.dim()}-D with shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")
    rows, cols = t.shape
    if max(rows, cols) > INT32_MAX:
        raise ValueError(f"{name}: shape {tuple(t.shape)} has an extent past {INT32_MAX}, the kernels' 32-bit extents")
    if rows == 0 or cols == 0:
        return t
    if cols > 1 and t.stride(1) != 1:
        raise ValueError(f"{name}: expected row-major storage (stride 1 in the last dim), got strides {tuple(t.stride())}")
    if rows > 1 and t.stride(0) < cols:
        raise ValueError(
            f"{name}: expected a leading dimension (row stride) >= {cols} columns, got strides {tuple(t.stride())}"
        )
    return t


class ValidatedCalls:
    """Calls that passed an op's structural checks before, by their structure: each tensor's dtype, device,
    shape, strides and pointer alignment (mod 16), plus whatever else the op names (flags, a config). A
    call with the same structure passes the same checks and builds the same problem, so a repeat skips
    both; what depends on the values (scalars, which memory ``out`` overlaps) each op still checks every
    call. On every op's hot path: one tuple build and one dict lookup."""

    def __init__(self, max_entries: int = 4096):
        self._known: dict = {}
        self._max_entries = max_entries

    @staticmethod
    def key(tensors, *extra):
        """The structure of a call, or None when it has none that hashes (an argument that is not a tensor,
        a tensor scalar, ...): such calls take the full checks, which name what is wrong."""
        try:
            key = (tuple(None if t is None else (t.dtype, t.device, t.shape, t.stride(), t.data_ptr() % 16)
                         for t in tensors), extra)
            hash(key)
            return key
        except Exception:  # noqa: BLE001 -- anything odd goes to the full checks
            return None

    def get(self, key):
        return None if key is None else self._known.get(key)

    def remember(self, key, value) -> None:
        if key is None:
            return
        if len(self._known) >= self._max_entries:
            self._known.clear()
        self._known[key] = value


def no_overlap(name: str, out: torch.Tensor, inputs: dict, allow_exact_alias: tuple = ()) -> None:
    """``out`` shares no memory with any of ``inputs`` (except being exactly one of ``allow_exact_alias``)."""
    for in_name, t in inputs.items():
        if t is None or not overlaps(out, t):
            continue
        same = out.data_ptr() == t.data_ptr() and out.shape == t.shape and out.stride() == t.stride()
        if not (same and in_name in allow_exact_alias):
            raise ValueError(f"{name}: overlaps the memory of {in_name}; pass a separate output tensor")
