"""The public ``linear_scan`` op: its checks (shared with the custom op's fake implementation) and the eager
call, which scans a strided dim in place (the ``columns`` entry) or moves it last, broadcasts ``a`` and
``h0`` and runs the ``linear_scan`` entry. Its backward lives with the custom op (``torch_ops``)."""

from __future__ import annotations

import math

import torch

from ... import registry
from ...runtime import checks
from ...runtime.autograd import check_writable, mark_written
from ...runtime.device import on_device, shared_memory_limit
from .config import ColumnScanConfig, ScanConfig
from ...runtime.plans import CallPlans
from ...runtime.dry_run import take_result
from .linear import DTYPES, LinearScanProblem, prepare
from .linear_columns import prepare as prepare_columns
from .op import check_dim
from .problem import _vector_width

_PLANS = CallPlans("linear_scan")


def split_decay(a) -> tuple[torch.Tensor | None, float]:
    """``a`` as (a tensor, 0.0) or (None, a number): the two ways a decay crosses the custom op's schema
    (the number is checked with the rest of the call)."""
    if isinstance(a, torch.Tensor):
        return a, 0.0
    if type(a) is int or isinstance(a, float):  # float's subclasses too (a NumPy float64); not bool
        return None, checks.real_scalar("a", a)  # an int past float64's range: a ValueError naming a
    raise TypeError(f"a: expected a tensor or a Python number, got {type(a).__name__}")


def is_cpu_scalar(a) -> bool:
    """A 0-d CPU tensor: a decay torch's elementwise ops would take beside CUDA tensors, as its number."""
    return isinstance(a, torch.Tensor) and a.dim() == 0 and a.device.type == "cpu"


def _check_real_cpu_scalar(a: torch.Tensor) -> None:
    if a.is_complex() or a.dtype == torch.bool:
        raise TypeError(f"a: expected a real number, got a CPU scalar tensor of {a.dtype}")


def cpu_scalar_number(a: torch.Tensor) -> float:
    """The number a 0-d CPU tensor decay holds (``.item()`` on the host: no device sync), as the eager op
    reads it. Where a gradient is being recorded, one that requires grad is refused: its number would be
    detached (``ck.linear_scan`` takes it on x's device instead, ``cpu_scalar_beside``)."""
    if a.requires_grad and torch.is_grad_enabled():
        raise ValueError("a: a CPU scalar tensor that requires grad cannot be differentiated here (it is read as a "
                         "number); call ck.linear_scan, which takes it on x's device, or detach it")
    _check_real_cpu_scalar(a)
    return checks.real_scalar("a", a.item())


def cpu_scalar_beside(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A 0-d CPU tensor decay on x's device (float32 unless it is a dtype the scan takes), as the custom op
    takes it: while tracing its value is not known (torch.compile), and a gradient recorded for it flows
    back through the copy."""
    _check_real_cpu_scalar(a)
    return a.to(device=x.device, dtype=a.dtype if a.dtype in DTYPES else torch.float32)


def other_dims(shape, dim: int) -> tuple[int, ...]:
    """``shape`` without ``dim``: the shape of one start value per recurrence."""
    return tuple(s for i, s in enumerate(shape) if i != dim)


def _float_tensor_beside(name: str, t, x) -> None:
    """``t`` (a or h0) is a CUDA tensor of a dtype the scan computes in, on x's device: float64 would be
    rounded to float32 (the widest the kernels run), which a decay close to 1 does not survive, so it is
    the caller's choice to make."""
    checks.cuda_tensor(name, t)
    checks.same_device(x=x, **{name: t})
    if not t.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")
    if t.dtype not in DTYPES:
        raise TypeError(f"{name}: expected float32, float16 or bfloat16 (the scan computes in float32 at most), got "
                        f"{t.dtype}; pass {name}.float() to round it")


def _broadcast_mismatch(shape, target) -> str | None:
    """None where ``shape`` broadcasts to ``target`` exactly; else how it fails ("does not broadcast to", or
    "broadcasts past" where the two broadcast to something larger)."""
    # torch.broadcast_shapes's rule in plain Python: its first call imports sympy, seconds of a first call.
    shape, target = tuple(shape), tuple(target)
    rank = max(len(shape), len(target))
    full = []
    for s, t in zip((1,) * (rank - len(shape)) + shape, (1,) * (rank - len(target)) + target):
        if s != t and s != 1 and t != 1:
            return "does not broadcast to"
        full.append(t if s == 1 else s)
    return None if tuple(full) == target else "broadcasts past"


def check_linear_scan_args(a, x, dim, reverse, h0) -> tuple[int, bool, torch.Tensor | float]:
    """The checks of a call that need no memory (so the fake implementation makes them too), in order;
    returns (dim as a non-negative index, reverse, a as a tensor broadcasting to x or a float32 number)."""
    checks.cuda_tensor("x", x)
    checks.dtype_in("x", x, DTYPES)
    dim = check_dim(dim, x.dim())
    reverse = checks.flag("reverse", reverse)
    a_tensor, a_number = split_decay(a)
    if a_tensor is None:
        a_number = checks.float32_scalar("a", a_number, finite=True)
    else:
        _float_tensor_beside("a", a, x)
        mismatch = _broadcast_mismatch(a.shape, x.shape)
        if mismatch:
            raise ValueError(f"a: shape {tuple(a.shape)} {mismatch} x's {tuple(x.shape)}")
    if h0 is not None:
        if not isinstance(h0, torch.Tensor):
            raise TypeError(f"h0: expected a tensor or None, got {type(h0).__name__}")
        _float_tensor_beside("h0", h0, x)
        rest = other_dims(x.shape, dim)
        if _broadcast_mismatch(h0.shape, rest):
            raise ValueError(f"h0: expected a shape that broadcasts to {rest} (x's shape without dim {dim}), "
                             f"got {tuple(h0.shape)}")
    return dim, reverse, a if a_tensor is not None else a_number


class LinearScanPlan:
    """Every call of one structure: the result's shape, dtype and device, how x, a and h0 become the
    contiguous (rows, length) tensors the kernel reads (as they are where they already are, else moved and
    copied), and the packed launch (None: empty). Per call it checks the decay's value, which memory ``out``
    overlaps and whether it may be written, allocates and launches."""

    __slots__ = ("shape", "dtype", "device", "index", "dim", "moved", "widened", "compute_dtype", "copy_x", "copy_a",
                 "copy_h0", "rest", "rows", "launch", "out_guard")

    def __init__(self, a, x, dim: int, h0, launch, columns: bool = False):
        """``columns``: a strided dim scanned in place (the columns entry), the tensors kept in x's layout."""
        self.shape, self.dtype, self.device, self.index, self.dim = tuple(x.shape), x.dtype, x.device, x.device.index, dim
        self.moved = x.dim() > 1 and dim != x.dim() - 1 and not columns
        # A decay tensor of another dtype than a 16-bit x keeps its precision: the scan runs on float32
        # copies (0.999 is 1.0 in bfloat16, which would turn a moving average into a running sum; float16
        # and bfloat16 round each other's values too).
        self.widened = isinstance(a, torch.Tensor) and x.dtype.itemsize == 2 and a.dtype != x.dtype
        self.compute_dtype = torch.float32 if self.widened else x.dtype
        self.copy_x = self.moved or self.widened or not x.is_contiguous()
        self.copy_a = isinstance(a, torch.Tensor) and (self.moved or a.shape != x.shape
                                                       or a.dtype != self.compute_dtype or not a.is_contiguous())
        self.rest = other_dims(x.shape, dim) if x.dim() else ()
        self.copy_h0 = h0 is not None and (h0.shape != self.rest or h0.dtype != torch.float32 or not h0.is_contiguous())
        self.rows = x.numel() // max(x.shape[dim], 1) if x.dim() else 1
        self.launch = launch
        # out may be x itself: the kernel loads each tile before it stores it, and a copied x is read whole
        # before anything is written.
        self.out_guard = checks.PlanOverlaps(("x", "h0", "a"), ("x",))

    def _last(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (of x's shape) contiguous, with the scanned dim moved last where the plan moves it."""
        if not t.dim():
            return t.reshape(1)
        return (t.movedim(self.dim, -1) if self.moved else t).contiguous()

    def __call__(self, a, x, h0, out):
        number = not isinstance(a, torch.Tensor)
        # The structure holds a number's type; its value is checked on every call, an empty one's too (as
        # a first call checks it).
        a_number = checks.float32_scalar("a", a, finite=True) if number else 0.0
        if out is None:
            result = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        else:
            self.out_guard.check(out, x, h0, a if isinstance(a, torch.Tensor) else None)
            check_writable("out", out)
            result = out
        if self.launch is None:
            return result
        if number:
            a_run = None
        else:
            a_run = self._last(a.expand(self.shape).to(self.compute_dtype)) if self.copy_a else a
        x_run = self._last(x.to(self.compute_dtype)) if self.copy_x else x
        h0_run = h0.expand(self.rest).to(torch.float32).contiguous() if self.copy_h0 else h0
        into_copy = self.moved or self.widened  # the kernel writes a copy, then the result takes it
        y = torch.empty(x_run.shape, dtype=self.compute_dtype, device=self.device) if into_copy else result
        on_device(self.index, self.launch, a_run, a_number, x_run, h0_run, y)
        if into_copy:
            take_result(result, y.movedim(-1, self.dim) if self.moved else y.view(self.shape))
        if out is not None:
            mark_written(out)
        return result


def prepare_linear_scan(a, x, dim, reverse, h0, out, config) -> LinearScanPlan:
    """The plan of a call, after every check of it (nothing allocated or written before they pass): the
    problem measured, the config chosen (or the given one checked), the kernel loaded and its launch packed."""
    checks.no_fake(x=x, out=out, a=a if isinstance(a, torch.Tensor) else None, h0=h0)
    check_writable("out", out)
    dim, reverse, a = check_linear_scan_args(a, x, dim, reverse, h0)
    if out is not None:
        inputs = {name: t for name, t in (("x", x), ("a", a), ("h0", h0)) if isinstance(t, torch.Tensor)}
        checks.output("out", out, shape=x.shape, dtype=x.dtype, device=x.device, inputs=inputs, allow_exact_alias=("x",))
    checks.config_type(config, (ScanConfig, ColumnScanConfig))
    shape = tuple(x.shape) or (1,)
    outer, length, inner = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])
    columns = inner > 1 and not isinstance(config, ScanConfig)
    if isinstance(config, ColumnScanConfig) and inner == 1:
        raise ValueError(f"config: a ColumnScanConfig scans a strided dim; dim {dim} of x's shape {shape} is the last "
                         "(a ScanConfig runs it)")
    plan = LinearScanPlan(a, x, dim, h0, None, columns=columns)
    if x.numel() == 0:
        return plan
    index = x.device.index
    # The access width from the tensors the kernel reads and writes as they are (a copy is a fresh,
    # aligned allocation).
    dtype = plan.compute_dtype
    vector = 16 // dtype.itemsize
    for t in (x if not plan.copy_x else None, a if isinstance(a, torch.Tensor) and not plan.copy_a else None,
              out if not (plan.moved or plan.widened) else None):
        if t is not None:
            vector = min(vector, _vector_width(t, None, dtype))
    if columns:
        while vector > 1 and inner % vector:  # a lane's vector of columns lies within one (outer, row)
            vector //= 2
        rows, spec, prepare_launch = outer, registry.get("linear_scan", "columns"), prepare_columns
    else:  # the lookback entry's rows: every recurrence, the scanned dim moved last where it is not
        rows, inner, spec, prepare_launch = plan.rows, 1, registry.get("linear_scan", "lookback"), prepare
    problem = LinearScanProblem(rows, length, dtype, reverse, not isinstance(a, torch.Tensor), h0 is not None,
                                vector, shared_memory_limit(index), inner)
    if config is None:
        config = spec.choose_config(problem, index)
    else:
        reason = spec.why_unsupported(config, problem)
        if reason is not None:
            raise ValueError(f"config: {config} cannot run {problem}: {reason}")
    plan.launch = on_device(index, prepare_launch, config, problem, {"x": x}, None)
    return plan


def linear_scan(a, x: torch.Tensor, *, dim: int = -1, reverse: bool = False, h0: torch.Tensor | None = None,
                out: torch.Tensor | None = None, config: ScanConfig | ColumnScanConfig | None = None) -> torch.Tensor:
    """h_t = a_t * h_{t-1} + x_t along ``dim`` with h_{-1} = ``h0`` (default 0); ``reverse=True``:
    h_t = a_t * h_{t+1} + x_t from the end (generalised advantage estimation is
    ``linear_scan(gamma * lam, delta, reverse=True)``). ``a``: a tensor broadcasting to x (float32, float16 or
    bfloat16: one other than a 16-bit x's keeps its precision, the scan then running on float32 copies;
    float64 is refused, not rounded), or a Python number (one decay; a 0-d CPU tensor is read as its
    number, refused if it requires grad while a gradient is recorded); ``h0``: a float32, float16 or bfloat16
    tensor broadcasting to x's shape without ``dim``. float32, float16
    and bfloat16 ``x`` with float32 state; the result has x's dtype. ``out`` may be ``x`` itself.
    Differentiable in ``a``, ``x`` and ``h0``
    (through ``cute_kernels.linear_scan``). A strided ``dim`` is scanned in place, its columns read as they
    lie (the ``columns`` variant; ``config`` a ``ColumnScanConfig`` there).
    """
    if is_cpu_scalar(a):
        a = cpu_scalar_number(a)
    plan = _PLANS.plan((a, x, h0, out, (dim,) if type(dim) is int else dim, reverse, config),
                       prepare_linear_scan, a, x, dim, reverse, h0, out, config)
    return plan(a, x, h0, out)
