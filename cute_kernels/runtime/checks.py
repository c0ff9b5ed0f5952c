"""Argument validation shared by every op: each check raises a TypeError/ValueError that names the argument,
what was expected and what came (a RuntimeError where nothing about the arguments is wrong but the call
cannot run where it is made: under an active fake mode). Ops run all their checks before allocating or
writing anything."""

from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
import struct
import sys

import torch

from .bounded import remember

INT32_MAX = 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38
# The largest magnitude that rounds to zero in float32 (to nearest, ties to even: 2^-150 lies halfway to the
# smallest subnormal, 2^-149, whose significand is odd): a scalar is 0 to a kernel iff |x| <= this.
FLOAT32_ZERO_BOUND = 2.0 ** -150

# Tensor types that are never fake and carry no dispatch of their own: a type identity test, far cheaper
# than the fake test, clears them (the fake test, plans' keys, the public ops' eager test).
PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_FLOAT32 = struct.Struct("<f")
_HUGE_INT = 2**1023


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        kind = "FakeTensor" if is_fake(t) else "tensor"
        return f"a {t.dtype} {kind} of shape {tuple(t.shape)} on {t.device}"
    return f"{type(t).__name__}"


def tensor(name: str, t, *, written: bool = False) -> torch.Tensor:
    """A torch.Tensor whose memory holds its values as they read: no lazy negation or conjugation.

    A view with the negative or conjugate bit (``torch._neg_view(t)``, ``z.conj().imag``, ``z.conj()``) is
    memory whose values torch negates or conjugates on the fly; a kernel reads and writes raw memory, so it
    would see (or overwrite) the other values. Refusing it is simpler than resolving it (a hidden copy of
    every such input) and the only right answer for an output (``written``): the copy a resolve makes is
    not the caller's tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {_describe(t)}")
    strided(name, t)
    for bit, done, is_set, resolve in (("negative", "negated", t.is_neg, "resolve_neg"),
                                       ("conjugate", "conjugated", t.is_conj, "resolve_conj")):
        if is_set():
            fix = (f"a kernel would write through it; pass a plain tensor ({name}.{resolve}() is a copy)" if written
                   else f"a kernel would read those; pass {name}.{resolve}()")
            raise ValueError(f"{name}: expected a tensor without the {bit} bit, got a lazily {done} view: its "
                             f"memory holds the values un{done} (torch applies the {bit} on read); {fix}")
    return t


def strided(name: str, t: torch.Tensor) -> None:
    """``t`` is a dense tensor of torch's strided layout: what every kernel indexes (shape, strides, one data
    pointer). A sparse (COO, CSR, ...), mkldnn or nested tensor has no such memory; reading its strides or
    pointer raises without naming the argument, so this comes before anything reads them."""
    if t.layout is not torch.strided:
        raise ValueError(f"{name}: expected a strided (dense) tensor, got {t.layout}; pass {name}.to_dense()")
    if t.is_nested:
        raise ValueError(f"{name}: expected a strided (dense) tensor, got a nested tensor; pass one padded tensor "
                         f"({name}.to_padded_tensor(0.0)) or call the op on each of its tensors")


# Inside ``meta_passes_device_checks()`` a meta tensor passes ``cuda_tensor``: a context, not an argument,
# because the device checks sit at the end of each op's chain of checks, which the fake implementations call
# whole.
_META_PASSES = contextvars.ContextVar("meta_passes_device_checks", default=False)


@contextlib.contextmanager
def meta_passes_device_checks():
    """Meta tensors pass the CUDA-device checks (and only those): the fake implementations' shape
    propagation, where a meta tensor stands for a CUDA one and every structural, dtype and option check
    still holds."""
    token = _META_PASSES.set(True)
    try:
        yield
    finally:
        _META_PASSES.reset(token)


def cuda_tensor(name: str, t) -> torch.Tensor:
    tensor(name, t)
    if t.device.type != "cuda":
        if t.is_meta and _META_PASSES.get():
            return t
        if t.is_meta:
            raise ValueError(f"{name}: expected a CUDA tensor, got {_describe(t)} (a meta tensor has a shape "
                             "and no memory: nothing can run on it)")
        raise ValueError(f"{name}: expected a CUDA tensor, got {_describe(t)}")
    return t


def is_fake(t) -> bool:
    """A FakeTensor, or a wrapper of one: shape, dtype and device, and no memory (its data pointer is 0)."""
    if type(t) in PLAIN_TENSOR_TYPES or not isinstance(t, torch.Tensor):
        return False
    from torch._subclasses.fake_tensor import is_fake as torch_is_fake

    return torch_is_fake(t)


def no_fake(**tensors) -> None:
    """Nothing of this call is fake: no argument is a FakeTensor and no fake mode is active (under one,
    what the op allocates is fake too). The NVRTC and CuTe launches take data pointers, and a fake's is 0:
    a launch on it kills the CUDA context. Every eager entry point calls this first, on every call, before
    the checks that read pointers (the overlap checks, the repeat-call key); the public ops send traced and
    fake calls to their custom op before they get here (torch_ops.py). Meta tensors are not fake: the
    device checks refuse them, after the structural checks (which hold for them as for any tensor)."""
    hint = ("call the public op (cute_kernels.<op>) or torch.ops.cute_kernels.<op>, whose fake "
            "implementation gives the result's shape and dtype")
    for name, t in tensors.items():
        if t is not None and is_fake(t):  # is_fake clears plain tensors by their type first
            raise TypeError(f"{name}: expected a tensor with real storage, got {_describe(t)} (a FakeTensor "
                            f"has no memory, so no kernel can run on it); {hint}")
    if torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None:
        raise RuntimeError("cute_kernels ops cannot run under an active FakeTensorMode (what they allocate there "
                           f"is fake, with no memory for a kernel to write); {hint}")


def has_canonical_strides(t: torch.Tensor) -> bool:
    """``t``'s strides are exactly those of a fresh contiguous tensor of its shape (also on size-1 dims,
    where ``is_contiguous()`` ignores them): then ``torch.empty_like(t)`` is that fresh tensor."""
    expected, stride = [], 1
    for size in reversed(t.shape):
        expected.append(stride)
        stride *= max(size, 1)
    return tuple(reversed(expected)) == tuple(t.stride())


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


def byte_span(t: torch.Tensor) -> int:
    """How many bytes ``t`` reaches from its data pointer: 0 for an empty tensor (torch strides are never
    negative)."""
    if t.numel() == 0:
        return 0
    return (sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1) * t.element_size()


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """The [first, last+1) byte span that ``t`` touches."""
    return (t.data_ptr(), t.data_ptr() + byte_span(t))


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` may share memory (conservative: their byte spans on one device intersect).

    Addresses decide, not storage objects: a DLPack view (``torch.from_dlpack``, CuPy, JAX) of a tensor's
    memory is another storage object over the same bytes. Tensors without memory (meta, fake) share none;
    the device checks and :func:`no_fake` refuse them before any launch."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    if a.is_meta or b.is_meta or is_fake(a) or is_fake(b):
        return False
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    return a0 < b1 and b0 < a1


def output(name: str, out, *, shape, dtype, device, inputs: dict, allow_exact_alias: tuple = ()) -> torch.Tensor:
    """Check a caller-provided output: type, shape, dtype, device, contiguity, and no overlap with inputs.

    ``allow_exact_alias`` names inputs that ``out`` may be (the same tensor: same pointer, shape and strides),
    for kernels where in-place is safe.
    """
    tensor(name, out, written=True)
    output_layout(name, out, shape=shape, dtype=dtype, device=device)
    no_overlap(name, out, inputs, allow_exact_alias)
    return out


def output_layout(name: str, out, *, shape, dtype, device, contiguous: bool = True) -> torch.Tensor:
    """The structural half of :func:`output` (type, shape, dtype, device, contiguity) without the memory
    checks, for a traced out= whose values come from a fresh tensor: every test here is one Dynamo traces.
    ``contiguous=False``: the op checks out's layout by a rule of its own (the GEMMs take row slices)."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {_describe(out)}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(out.shape)}")
    if out.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {out.dtype}")
    if out.device != device:
        raise ValueError(f"{name}: expected a tensor on {device}, got one on {out.device}")
    if contiguous and not out.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {tuple(out.stride())}")
    return out


def alignment_bytes(t: torch.Tensor, widest: int = 16) -> int:
    """The largest power of two <= ``widest`` that divides ``t``'s address (what vector accesses may assume)."""
    ptr = t.data_ptr()
    a = widest
    while a > 1 and ptr % a:
        a //= 2
    return a


def real_scalar(name: str, value) -> float:
    """A real Python/NumPy number (bool, complex, tensors and strings refused), returned as a float."""
    if type(value) is float:  # the common cases, without the ABC check below
        return value
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__}")
    # An int near or past float64's range, compared rather than caught from float(): torch.compile traces
    # this, and cannot trace an OverflowError caught there. Every such value is far past float32's range.
    if type(value) is int and not -_HUGE_INT < value < _HUGE_INT:
        raise ValueError(f"{name}: expected a number within float32's range, got {type(value).__name__} past even "
                         "float64's")
    return float(value)


def round_float32(value: float) -> float:
    """``value`` rounded to float32 (to nearest, as a kernel's float32 argument receives it), as a Python
    float; inf where the rounding overflows."""
    try:
        return _FLOAT32.unpack(_FLOAT32.pack(value))[0]
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")


# Python float -> its float32 value, for the nonzero finite floats seen before: every GEMM call converts two
# scalars, which are the same few values call after call. Zeros stay out (0.0 == -0.0 would share an entry),
# and so do NaN and inf (``finite`` decides about them). Caller-controlled values: bounded.
_float32_values: dict[float, float] = {}


def float32_scalar(name: str, value, *, finite: bool = False) -> float:
    """A real number as the kernel that takes it in float32 will use it: rounded to float32, returned as a
    Python float. Decisions go on this value, never on the float64 one: ``beta=1e-50`` is 0.0 in float32,
    so C is not read. A finite value whose rounding overflows (``1e39``) is refused, as torch refuses it
    ("value cannot be converted to type float without overflow"); inf and NaN pass, unless ``finite``."""
    if type(value) is float:
        known = _float32_values.get(value)
        if known is not None:
            return known
        if value == 0.0:  # +0 and -0 (one key of the memo, so kept out of it): exact in float32, sign and all
            return value
    value = real_scalar(name, value)
    rounded = round_float32(value)
    if finite and not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value}")
    if math.isinf(rounded) and math.isfinite(value):
        raise ValueError(f"{name}: {value!r} cannot be converted to float32 without overflow (the kernel takes it "
                         f"in float32: |{name}| <= {FLOAT32_MAX!r})")
    if type(value) is float and value and math.isfinite(rounded):
        remember(_float32_values, value, rounded)
    return rounded


def integer(value):
    """``value`` as an int where torch's ops take it as one: an int (not a bool), a NumPy integer (by
    ``.tolist()``, the conversion torch.compile traces), or the SymInt torch.compile makes of an int, as it
    is; None for anything else. (No try/except around a conversion: under torch.compile the TypeError of
    ``operator.index`` on a tuple is an internal Dynamo error no except clause sees, torch 2.11.)"""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, torch.SymInt)):  # first: an int torch.compile traces symbolically has no tolist
        return value
    if not isinstance(value, (torch.Tensor, list, tuple, str)) and hasattr(value, "tolist"):
        value = value.tolist()  # a NumPy scalar as the Python number it is
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None


def flag(name: str, value) -> bool:
    """A boolean argument: ``True``/``False`` or a ``numpy.bool_``, as a Python bool; anything else (a
    string, whose truth is its length; 0/1; a tensor) is a TypeError naming the argument."""
    if type(value) is bool:
        return value
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.bool_):
        return bool(value)
    shown = f" {value!r}" if isinstance(value, (str, int, float)) else ""
    raise TypeError(f"{name}: expected a bool (True or False), got {type(value).__name__}{shown}")


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


def same_layout(out: torch.Tensor, t: torch.Tensor) -> bool:
    """Whether ``t`` has ``out``'s shape, strides and element size: started at one address, element i of one
    is element i of the other. A view of another element size (an int32 view of an int64 ``out``) is not:
    writing element i overwrites elements of ``t`` past i."""
    return out.shape == t.shape and out.stride() == t.stride() and out.element_size() == t.element_size()


def exactly_alike(out: torch.Tensor, t: torch.Tensor) -> bool:
    """Whether ``t`` is ``out`` element for element (:func:`same_layout`, one start), so a kernel that reads
    an element before it writes it may take ``out = t``."""
    return out.data_ptr() == t.data_ptr() and same_layout(out, t)


def no_overlap(name: str, out: torch.Tensor, inputs: dict, allow_exact_alias: tuple = ()) -> None:
    """``out`` shares no memory with any of ``inputs`` (except being exactly one of ``allow_exact_alias``:
    :func:`exactly_alike`)."""
    for in_name, t in inputs.items():
        if t is None or not overlaps(out, t):
            continue
        same = exactly_alike(out, t)
        if not (same and in_name in allow_exact_alias):
            raise ValueError(f"{name}: overlaps the memory of {in_name}; pass a separate output tensor")


class OutGuard:
    """The overlap checks of ``out`` for the repeated calls of one plan (``runtime.plans``), from data
    pointers alone.

    A plan's key fixes every tensor's shape, strides, dtype and device, and the plan's first call passed the
    full checks (one device, real memory), so how many bytes each tensor reaches is fixed and only where it
    starts is new. The guard takes the spans from the first call's ``out`` and ``inputs`` (None where the
    call has none; the key fixes which) and ``clear(out, *inputs)`` compares this call's start pointers
    against them: about a tenth of what :func:`overlaps` costs a pair, which measures both tensors afresh.
    Clear: ``out`` meets none of the inputs, or is exactly one it may be (``may_be``, aligned with
    ``inputs``: the same start, shape, strides and element size). Not clear, the caller runs its full check, which raises
    with its reason, or passes a case the guard judged more strictly than the op does.
    """

    __slots__ = ("out_span", "spans", "may_be")

    def __init__(self, out: torch.Tensor, inputs: tuple, may_be: tuple = ()):
        self.out_span = byte_span(out)
        self.spans = tuple(0 if t is None else byte_span(t) for t in inputs)
        self.may_be = tuple(i < len(may_be) and bool(may_be[i]) and t is not None and same_layout(out, t)
                            for i, t in enumerate(inputs))

    def clear(self, out: torch.Tensor, *inputs) -> bool:
        if not self.out_span:
            return True
        start = out.data_ptr()
        end = start + self.out_span
        for t, span, may_be in zip(inputs, self.spans, self.may_be):
            if span:  # an empty input (or None) meets nothing
                p = t.data_ptr()
                if p < end and start < p + span and not (may_be and p == start):
                    return False
        return True


class PlanOverlaps:
    """:func:`no_overlap` for ``out`` on the repeated calls of one plan: ``check(out, *inputs)``, the inputs
    in the order of ``names`` (None where the call has none), takes an :class:`OutGuard` from the plan's
    first call with ``out`` and runs the full check only where the guard is not clear."""

    __slots__ = ("names", "allow_exact_alias", "guard")

    def __init__(self, names: tuple, allow_exact_alias: tuple = ()):
        self.names, self.allow_exact_alias, self.guard = names, allow_exact_alias, None

    def check(self, out: torch.Tensor, *inputs) -> None:
        guard = self.guard
        if guard is None:
            guard = self.guard = OutGuard(out, inputs, tuple(n in self.allow_exact_alias for n in self.names))
        if not guard.clear(out, *inputs):
            no_overlap("out", out, dict(zip(self.names, inputs)), self.allow_exact_alias)
