"""The public ops as ``torch.library`` custom ops (``torch.ops.cute_kernels.*``), so that ``torch.compile``
traces them as single opaque nodes instead of breaking the graph at their Python and ctypes code.

Each custom op is functional (it returns a new tensor; ``out=`` is applied after it, as a copy) and has a
fake implementation that gives the output's shape and dtype from the inputs' metadata alone. The public
functions (``ck.sgemm`` and the rest, wrapped by ``compile_aware``) call their eager code directly when not
compiling, which keeps eager dispatch as fast as it was, and the custom op when ``torch.compile`` traces
them. A ``config=`` cannot cross the custom op's schema, so inside ``torch.compile`` the op's default (tuned
or heuristic) config runs and an explicit one is refused with a clear error.

Every custom op has a backward (its autograd registration below), and an eager call that needs a gradient
runs the custom op, so autograd records it; such a call may not write ``out`` (as torch's ops with out=).
The eager ops themselves (and the plans their repeated calls run, ``runtime.plans``) refuse an ``out``
torch would not let an in-place op write and bump a written ``out``'s version counter
(``runtime.autograd``).
"""

from __future__ import annotations

import functools
import inspect
import operator

import torch

from .ops.attention import attention as attention_eager
from .ops.conv3d import conv1d as conv1d_eager
from .ops.conv3d import conv2d as conv2d_eager
from .ops.conv3d import conv3d as conv3d_eager
from .ops.gemm.hgemm import hgemm as hgemm_eager
from .ops.gemm.sgemm import sgemm as sgemm_eager
from .ops.scan import linear_scan as linear_scan_eager
from .ops.scan import scan as scan_eager
from .ops.attention.problem import check_attention_args, check_num_sinks
from .ops.conv3d import Conv3dConfig
from .ops.conv3d.planar import check_planar_args
from .ops.conv3d.problem import MAX_KERNEL_SIDE, check_conv3d_args, conv_pads
from .ops.gemm import GemmConfig, HgemmConfig, HgemmSm90Config
from .ops.gemm.problem import MAX_EXTENT, check_output_matrices, operand_major, result_shape, validate_gemm_args
from .ops.gemm.sgemm import DTYPES as SGEMM_DTYPES
from .ops.gemm.spec import HGEMM_DTYPES, op_call
from .ops.scan.linear_op import check_linear_scan_args, cpu_scalar_beside, is_cpu_scalar, other_dims, split_decay
from .ops.scan.op import check_dim, check_segment_starts
from .ops.scan.problem import check_scan_args, dtype_from_out
from .runtime import checks
from .runtime.autograd import check_writable, no_forward_ad

NAMESPACE = "cute_kernels"

# torch.library.custom_op puts two Python layers between ``torch.ops.cute_kernels.<op>`` and the op: its
# Autograd kernel, which re-enters the dispatcher below autograd, and its backend wrapper, which checks that
# the result aliases no input. Together they cost about as much as the eager op's whole host path
# (docs/notes/host-path.md, "The torch.ops path"). So each op also gets kernels of its own for CUDA
# tensors, more specific than custom_op's and so chosen first: a CUDA kernel that is the op's body, and an
# AutogradCUDA kernel that calls the body at once when the call is plain eager (``_plain_eager_call``: a
# model's eager call, a compiled graph's call at run time) and otherwise does what custom_op's does: the
# call below autograd, recorded with the op's backward where an input needs a gradient. CPU and meta
# tensors keep custom_op's kernels; its fake implementations and schemas serve tracing as before.
_CUDA_KERNELS = torch.library.Library(NAMESPACE, "IMPL")
_BODIES: dict = {}  # custom op -> (name, the function it wraps)


def _define_op(name: str):
    """``torch.library.custom_op`` of a functional op, with the body as its CUDA kernel as well."""

    def define(body):
        op = torch.library.custom_op(f"{NAMESPACE}::{name}", body, mutates_args=())
        _CUDA_KERNELS.impl(name, body, "CUDA")
        _BODIES[op] = (name, body)
        return op

    return define


def _register_autograd(op, backward, setup_context) -> None:
    """``op.register_autograd(backward, setup_context=...)``, plus the AutogradCUDA kernel that skips it
    on plain eager calls (see ``_CUDA_KERNELS``)."""
    op.register_autograd(backward, setup_context=setup_context)
    name, body = _BODIES[op]
    overload = getattr(getattr(torch.ops, NAMESPACE), name).default
    defaults = tuple(p.default for p in inspect.signature(body).parameters.values())

    def below_autograd(*args):
        with torch._C._AutoDispatchBelowAutograd():
            return overload(*args)

    def setup(ctx, inputs, output):
        # The dispatcher drops trailing arguments equal to their defaults; setup_context sees them all.
        setup_context(ctx, (*inputs, *defaults[len(inputs):]), output)

    recorded = type(f"Recorded_{name}", (torch.autograd.Function,), {
        "forward": staticmethod(below_autograd),
        "setup_context": staticmethod(setup),
        "backward": staticmethod(backward),
    })

    def autograd_cuda(*args):
        if _plain_eager_call(args, {}):
            return body(*args)
        no_forward_ad(f"torch.ops.{NAMESPACE}.{name}", args)
        if torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad for v in args):
            return recorded.apply(*args)
        return below_autograd(*args)

    _CUDA_KERNELS.impl(name, autograd_cuda, "AutogradCUDA")


@_define_op("sgemm")
def sgemm_op(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, alpha: float = 1.0,
             beta: float = 0.0) -> torch.Tensor:
    return sgemm_eager(a, b, c, alpha=alpha, beta=beta)


@_define_op("hgemm")
def hgemm_op(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, alpha: float = 1.0,
             beta: float = 0.0) -> torch.Tensor:
    return hgemm_eager(a, b, c, alpha=alpha, beta=beta)


# A window crosses the schema as a list of two ints, -1 for an unbounded side (its sides are otherwise >= 0).
def _window_arg(window):
    from .ops.attention.problem import check_window

    window = check_window(window)
    return None if window is None else [-1 if side is None else side for side in window]


def _window_of(window):
    return None if window is None else tuple(None if side == -1 else side for side in window)


@_define_op("attention")
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                 causal: bool = False, window: list[int] | None = None, num_sinks: int = 0) -> torch.Tensor:
    return attention_eager(q, k, v, scale=scale, causal=causal, window=_window_of(window), num_sinks=num_sinks)


@_define_op("attention_lse")
def attention_lse_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                     causal: bool = False, window: list[int] | None = None,
                     num_sinks: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``attention`` with ``return_lse=True``: the output and each row's log-sum-exp."""
    return attention_eager(q, k, v, scale=scale, causal=causal, window=_window_of(window), num_sinks=num_sinks,
                           return_lse=True)


def _attention_ops(q, k, v, scale, causal, window, num_sinks, return_lse):
    """The custom op an attention call crosses: one schema per result (a tensor, or the output and lse);
    compile_aware has checked return_lse is a bool."""
    if return_lse:
        return attention_lse_op(q, k, v, scale, causal, window, num_sinks)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        # The backward needs each row's lse: the forward that writes it, so the backward need not rerun it.
        return attention_lse_op(q, k, v, scale, causal, window, num_sinks)[0]
    return attention_op(q, k, v, scale, causal, window, num_sinks)


# A convolution's padding is a name or sizes, which the schema cannot say in one argument: ``padding`` holds
# the name ("valid", "same"), or "sizes" (one per dim, or one for all) or "pairs" (before and after each
# dim), and then ``padding_sizes`` the sizes, flat.
def _padding_args(padding, rank: int) -> tuple:
    pads = conv_pads(padding, (1,) * rank, rank)  # the eager op's error for anything else (an unknown name too)
    if isinstance(padding, str):
        return padding, None
    if isinstance(padding, (tuple, list)) and len(padding) and isinstance(padding[0], (tuple, list)):
        return "pairs", list(pads[6 - 2 * rank:])
    # One size per dim (a NumPy integer or a 0-dim tensor read as the int it is), or one for all.
    return "sizes", list(pads[6 - 2 * rank::2]) if isinstance(padding, (tuple, list)) and len(padding) == rank else [pads[-1]]


def _padding(padding: str, padding_sizes):
    """The eager op's ``padding`` from the schema's (kind, sizes) pair (``_padding_args``' encoding), which
    a direct ``torch.ops`` call may give malformed: refused by name rather than read in part."""
    if padding in ("sizes", "pairs"):
        if padding_sizes is None or len(padding_sizes) == 0 or (padding == "pairs" and len(padding_sizes) % 2):
            raise ValueError(f"padding_sizes: padding {padding!r} needs {'pairs of ' if padding == 'pairs' else ''}"
                             f"sizes, got {padding_sizes!r}")
        if padding == "sizes":
            return padding_sizes[0] if len(padding_sizes) == 1 else tuple(padding_sizes)
        return tuple(zip(padding_sizes[0::2], padding_sizes[1::2]))
    if padding_sizes is not None:
        raise ValueError(f"padding_sizes: padding {padding!r} takes no sizes, got {padding_sizes!r}")
    return padding


@_define_op("conv3d")
def conv3d_op(volume: torch.Tensor, kernel: torch.Tensor, padding: str = "valid",
              padding_sizes: list[int] | None = None) -> torch.Tensor:
    return conv3d_eager(volume, kernel, padding=_padding(padding, padding_sizes))


@_define_op("conv2d")
def conv2d_op(image: torch.Tensor, kernel: torch.Tensor, padding: str = "valid",
              padding_sizes: list[int] | None = None) -> torch.Tensor:
    return conv2d_eager(image, kernel, padding=_padding(padding, padding_sizes))


@_define_op("conv1d")
def conv1d_op(signal: torch.Tensor, kernel: torch.Tensor, padding: str = "valid",
              padding_sizes: list[int] | None = None) -> torch.Tensor:
    return conv1d_eager(signal, kernel, padding=_padding(padding, padding_sizes))


@_define_op("scan")
def scan_op(x: torch.Tensor, exclusive: bool = False, dim: int = -1, reverse: bool = False, op: str = "sum",
            dtype: torch.dtype | None = None, segment_starts: torch.Tensor | None = None) -> torch.Tensor:
    # exclusive second: the op's schema before dim and the rest came (torch.ops.cute_kernels.scan(x, True)).
    return scan_eager(x, dim=dim, exclusive=exclusive, reverse=reverse, op=op, dtype=dtype,
                      segment_starts=segment_starts)


@_define_op("linear_scan")
def linear_scan_op(a: torch.Tensor | None, x: torch.Tensor, dim: int = -1, reverse: bool = False,
                   h0: torch.Tensor | None = None, a_number: float = 0.0) -> torch.Tensor:
    # A decay is a tensor or a number, which the schema cannot say in one argument: ``a`` None means the number
    # (last, with a default, so that torch.ops.cute_kernels.linear_scan(a, x) reads as ck.linear_scan(a, x)).
    return linear_scan_eager(a_number if a is None else a, x, dim=dim, reverse=reverse, h0=h0)


# The fake implementations run the eager ops' own checks (a fake tensor has the shape, dtype, strides and
# device they look at), so a call that eager refuses is refused while tracing too. Meta tensors are for
# shape propagation, where one stands for a CUDA tensor: they pass the device checks, and only those.
def _fake(op):
    """``op.register_fake``, around what every fake implementation does first: refuse forward-mode AD (a
    meta or fake dual tensor reaches it with its tangent, which the result would drop) and let meta tensors
    through the device checks."""
    name = _BODIES[op][0]

    def register(fn):
        @functools.wraps(fn)
        def fake(*args, **kwargs):
            no_forward_ad(f"torch.ops.{NAMESPACE}.{name}", (*args, *kwargs.values()))
            with checks.meta_passes_device_checks():
                return fn(*args, **kwargs)

        op.register_fake(fake)
        return fn

    return register


@_fake(sgemm_op)
def _sgemm_fake(a, b, c=None, alpha=1.0, beta=0.0):
    validate_gemm_args(a, b, c, alpha=alpha, beta=beta, out=None, config=None, config_cls=GemmConfig,
                       dtypes=SGEMM_DTYPES)
    return a.new_empty(result_shape(a, b))


@_fake(hgemm_op)
def _hgemm_fake(a, b, c=None, alpha=1.0, beta=0.0):
    validate_gemm_args(a, b, c, alpha=alpha, beta=beta, out=None, config=None,
                       config_cls=(HgemmConfig, HgemmSm90Config), dtypes=HGEMM_DTYPES)
    return a.new_empty(result_shape(a, b))


@_fake(attention_op)
def _attention_fake(q, k, v, scale=None, causal=False, window=None, num_sinks=0):
    check_attention_args(q, k, v, scale, causal, window=_window_of(window), num_sinks=num_sinks)
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@_fake(attention_lse_op)
def _attention_lse_fake(q, k, v, scale=None, causal=False, window=None, num_sinks=0):
    out = _attention_fake(q, k, v, scale, causal, window, num_sinks)
    return out, q.new_empty(q.shape[:-1], dtype=torch.float32)


@_fake(conv3d_op)
def _conv3d_fake(volume, kernel, padding="valid", padding_sizes=None):
    padding = _padding(padding, padding_sizes)
    return volume.new_empty(check_conv3d_args(volume, kernel, None, None, Conv3dConfig, padding)[3])


@_fake(conv2d_op)
def _conv2d_fake(image, kernel, padding="valid", padding_sizes=None):
    return image.new_empty(check_planar_args(image, kernel, None, 2, _padding(padding, padding_sizes)))


@_fake(conv1d_op)
def _conv1d_fake(signal, kernel, padding="valid", padding_sizes=None):
    return signal.new_empty(check_planar_args(signal, kernel, None, 1, _padding(padding, padding_sizes)))


@_fake(scan_op)
def _scan_fake(x, exclusive=False, dim=-1, reverse=False, op="sum", dtype=None, segment_starts=None):
    checks.flag("exclusive", exclusive)
    checks.flag("reverse", reverse)
    _, result_dtype = check_scan_args(x, None, op, dtype)
    check_dim(dim, x.dim())
    check_segment_starts(segment_starts, x)
    return x.new_empty(x.shape, dtype=result_dtype)


def _scan_setup_context(ctx, inputs, output):
    x, exclusive, dim, reverse, op, dtype, segment_starts = inputs
    ctx.scan = dict(dim=dim, exclusive=exclusive, reverse=reverse, op=op)
    ctx.x_dtype = x.dtype
    # segment_starts (no gradient: a bool tensor) saved as a tensor, so that writing it in place before the
    # backward is refused, as for x.
    if op == "logsumexp":
        ctx.save_for_backward(x, output, segment_starts)
        ctx.cast = dtype
    elif op != "sum":
        ctx.save_for_backward(x, segment_starts)
        ctx.cast = dtype
    else:
        ctx.save_for_backward(segment_starts)


def _scan_backward(ctx, grad):
    """The gradient of ``x``. A sum's is the scan of the gradient the other way (exclusive stays exclusive);
    a log-sum-exp's, sum over the later i of grad_i * exp(x_j - y_i), is two reversed log-sum-exp scans of
    log|grad| - y (positive and negative parts), both ours, unless the backward is differentiated again. Products, maxima and minima take torch's own
    rules (zeros in a product, ties in a maximum), by differentiating torch's function on the saved input."""
    s = ctx.scan
    *saved, starts = ctx.saved_tensors
    # The same segments the other way: a segment is the same memory range whichever way it is scanned.
    backward = dict(dim=s["dim"], exclusive=s["exclusive"], reverse=not s["reverse"], segment_starts=starts)
    if grad.numel() == 0:
        dx = torch.zeros_like(grad)
    elif s["op"] == "sum":
        dx = scan(grad, **backward)
    elif s["op"] == "logsumexp" and not torch.is_grad_enabled():
        x, y = saved
        wide = torch.float64 if y.dtype == torch.float64 else torch.float32
        g, y = grad.to(wide), y.to(wide)
        parts = []
        for sign in (1, -1):
            log_g = torch.where(sign * g > 0, torch.log(sign * g), torch.full_like(g, float("-inf"))) - y
            parts.append(torch.exp(x.to(wide) + scan(log_g, op="logsumexp", **backward)))
        dx = parts[0] - parts[1]
    else:
        # Also a log-sum-exp's backward that is itself differentiated (create_graph): its two scans' own
        # backwards meet -inf - -inf where a sign part is empty, a NaN the outer where() turns into a zero,
        # which would drop the path through y; torch's function on x has no such step.
        from .ops.scan.reference import segmented_scan, torch_scan

        x = saved[0]
        # Differentiated on the saved x itself when it carries its graph, so that a double backward
        # (create_graph) reaches x through torch's own rules; on a detached copy otherwise.
        create_graph = torch.is_grad_enabled()
        with torch.enable_grad():
            leaf = x if x.requires_grad else x.detach().requires_grad_()
            run, dim = leaf if ctx.cast is None else leaf.to(ctx.cast), s["dim"] % max(x.dim(), 1)
            if run.dim() == 0:  # one element, scanned as a row of one (torch's scans take no 0-dim narrow)
                run = run.reshape(1)
            if starts is None:
                y = torch_scan(run, dim, s["op"], exclusive=s["exclusive"], reverse=s["reverse"]).reshape(grad.shape)
            else:
                y = segmented_scan(run, starts.reshape(run.shape), dim, s["op"], exclusive=s["exclusive"],
                                   reverse=s["reverse"]).reshape(grad.shape)
            (dx,) = torch.autograd.grad(y, leaf, grad, create_graph=create_graph)
    return dx.to(ctx.x_dtype), None, None, None, None, None, None


_register_autograd(scan_op, _scan_backward, _scan_setup_context)


@_fake(linear_scan_op)
def _linear_scan_fake(a, x, dim=-1, reverse=False, h0=None, a_number=0.0):
    checks.flag("reverse", reverse)
    check_linear_scan_args(a_number if a is None else a, x, dim, reverse, h0)
    return x.new_empty(x.shape)


def _linear_scan_setup_context(ctx, inputs, output):
    a, x, dim, reverse, h0, a_number = inputs
    ctx.dim, ctx.reverse, ctx.a_number = dim % max(x.dim(), 1), reverse, a_number
    ctx.save_for_backward(a, h0, output)


def _step_toward(t: torch.Tensor, dim: int, toward_start: bool, fill: torch.Tensor) -> torch.Tensor:
    """``t`` moved one step along ``dim`` (toward index 0, or away from it), ``fill`` (size 1 along
    ``dim``) entering at the freed end."""
    kept = t.narrow(dim, 1, t.shape[dim] - 1) if toward_start else t.narrow(dim, 0, t.shape[dim] - 1)
    return torch.cat([kept, fill] if toward_start else [fill, kept], dim)


def _linear_scan_backward(ctx, grad):
    """The adjoint of h_t = a_t h_{t-1} + x_t is the same recurrence the other way,
    lambda_t = grad_t + a_{t+1} lambda_{t+1}: one of our scans, with a moved a step toward the start (a
    reversed forward mirrors both). Then dx = lambda, da = lambda * h_{t-1} (h0 before the first step) summed
    over a's broadcast dims, and dh0 = a_0 lambda_0 summed over h0's."""
    a, h0, h = ctx.saved_tensors
    dim, reverse, x_shape = ctx.dim, ctx.reverse, h.shape
    if h.numel() == 0:  # an empty recurrence: nothing depends on anything
        return (None if a is None else torch.zeros_like(a), torch.zeros_like(grad), None, None,
                None if h0 is None else torch.zeros_like(h0), None)
    if h.dim() == 0:  # a 0-d x is a recurrence of one step
        h, grad = h.reshape(1), grad.reshape(1)
    a_full = None if a is None else a.reshape((1,) * (h.dim() - a.dim()) + tuple(a.shape))
    if a_full is None:
        decay = ctx.a_number
    elif a_full.shape[dim] == 1:  # one decay along dim: the step moves nothing
        decay = a_full
    else:
        decay = _step_toward(a_full, dim, not reverse, torch.zeros_like(a_full.narrow(dim, 0, 1)))
    lam = linear_scan(decay, grad, dim=dim, reverse=not reverse)
    da = dh0 = None
    if a is not None and ctx.needs_input_grad[0]:
        start = (torch.zeros_like(h.narrow(dim, 0, 1)) if h0 is None
                 else h0.float().expand(other_dims(h.shape, dim)).unsqueeze(dim))
        h_before = _step_toward(h, dim, reverse, start)
        da = (lam.float() * h_before.float()).sum_to_size(a_full.shape).reshape(a.shape).to(a.dtype)
    if h0 is not None and ctx.needs_input_grad[4]:
        first = h.shape[dim] - 1 if reverse else 0  # the step that reads h0
        a_first = (ctx.a_number if a_full is None
                   else a_full.narrow(dim, first if a_full.shape[dim] > 1 else 0, 1).float())
        dh0 = (a_first * lam.narrow(dim, first, 1).float()).squeeze(dim)
        dh0 = dh0.sum_to_size(h0.shape).to(h0.dtype)
    dx = lam.reshape(x_shape) if ctx.needs_input_grad[1] else None
    return da, dx, None, None, dh0, None


_register_autograd(linear_scan_op, _linear_scan_backward, _linear_scan_setup_context)


def _as_operand(t: torch.Tensor) -> torch.Tensor:
    """``t`` where its matrices are row- or column-major (what the GEMM ops take), else a row-major copy: a
    gradient may be any view (``out.sum()``'s is an expanded scalar), and so may a reshape of one or of a
    saved operand (a batch folded into rows)."""
    try:
        operand_major("grad", t)
        return t
    except ValueError:
        return t.contiguous()


# The gradient of an operand that broadcast over the batch runs as one GEMM whose K is the batch folded with
# the other operand's rows or columns; past the kernels' extent it runs in chunks of whole batches, whose
# products are added (in the operand's dtype: one more rounding a chunk, only past 2^31 folded rows).
FOLD_MAX_K = MAX_EXTENT


def _batch_chunks(batch: int, per_batch: int) -> list:
    """[start, end) ranges of whole batches whose ``per_batch`` rows each stay within ``FOLD_MAX_K``."""
    step = max(1, FOLD_MAX_K // max(per_batch, 1))
    return [(i, min(batch, i + step)) for i in range(0, batch, step)]


def _gemm_backward_for(gemm):
    """The autograd registration of a GEMM custom op (``out = alpha * a @ b + beta * c``): dA = alpha *
    dOut @ B^T and dB = alpha * A^T @ dOut by the same op on transposed views (column-major operands, no
    copies), each summed over the batch where its operand broadcast over it -- as one GEMM whose K runs
    over the batch, so the sum accumulates in FP32 like every other -- and dc = beta * dOut summed to c's
    shape. ``gemm`` is the public function (compile-aware), so a double backward differentiates these GEMMs
    again."""

    def setup_context(ctx, inputs, output):
        a, b, c, alpha, beta = inputs
        ctx.alpha, ctx.beta = alpha, beta
        ctx.c_shape = None if c is None else c.shape
        ctx.save_for_backward(a, b)

    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad = _as_operand(grad)
        batch = grad.shape[0] if grad.dim() == 3 else 0
        m, n, k = grad.shape[-2], grad.shape[-1], a.shape[-1]
        # Traced calls may list fewer inputs than the schema (defaults left out): a missing one needs none.
        needs = tuple(ctx.needs_input_grad) + (False,) * 3
        da = db = dc = None
        if needs[0]:
            if batch and (a.dim() == 2 or a.shape[0] == 1) and b.dim() == 3 and b.shape[0] == batch:
                # sum_l dOut_l @ B_l^T = [dOut_1 .. dOut_B] (M, B*N) @ [B_1^T; ..; B_B^T] (B*N, K)
                parts = (gemm(_as_operand(grad[i:j].transpose(0, 1).reshape(m, (j - i) * n)),
                              _as_operand(b[i:j].transpose(1, 2).reshape((j - i) * n, k)), alpha=ctx.alpha)
                         for i, j in _batch_chunks(batch, n))
                da = functools.reduce(operator.add, parts).reshape(a.shape)
            else:
                da = gemm(grad, _as_operand(b.transpose(-1, -2)), alpha=ctx.alpha)
                if a.dim() == 3 and a.shape[0] == 1 and batch > 1:
                    da = da.sum(0, keepdim=True)  # both operands single: every batch's product is the same
        if needs[1]:
            if batch and (b.dim() == 2 or b.shape[0] == 1) and a.dim() == 3 and a.shape[0] == batch:
                # sum_l A_l^T @ dOut_l = (A as (B*M, K))^T @ dOut as (B*M, N)
                parts = (gemm(_as_operand(a[i:j].reshape((j - i) * m, k)).t(),
                              _as_operand(grad[i:j].reshape((j - i) * m, n)), alpha=ctx.alpha)
                         for i, j in _batch_chunks(batch, m))
                db = functools.reduce(operator.add, parts).reshape(b.shape)
            else:
                db = gemm(_as_operand(a.transpose(-1, -2)), grad, alpha=ctx.alpha)
                if b.dim() == 3 and b.shape[0] == 1 and batch > 1:
                    db = db.sum(0, keepdim=True)
        if needs[2] and ctx.c_shape is not None:
            dc = (grad * ctx.beta).sum_to_size(ctx.c_shape)
        return da, db, dc, None, None

    return backward, setup_context



@_define_op("attention_backward")
def attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                          grad_out: torch.Tensor, grad_lse: torch.Tensor | None, scale: float | None, causal: bool,
                          window: list[int] | None, num_sinks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of an attention (``ops.attention.backward``), an op torch.compile traces in a backward
    graph."""
    from .ops.attention.backward import attention_backward, check_backward_args

    check_backward_args(q, k, v, out, lse, grad_out, grad_lse, scale, causal, _window_of(window), num_sinks)
    return attention_backward(q, k, v, out, lse, grad_out, scale=scale, causal=causal, window=_window_of(window),
                              num_sinks=num_sinks, grad_lse=grad_lse)


@_fake(attention_backward_op)
def _attention_backward_fake(q, k, v, out, lse, grad_out, grad_lse, scale, causal, window, num_sinks):
    from .ops.attention.backward import check_backward_args

    check_backward_args(q, k, v, out, lse, grad_out, grad_lse, scale, causal, _window_of(window), num_sinks)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _attention_backward_for(returns_lse: bool):
    """The autograd registration of an attention custom op (attention.cu's backward kernels,
    ``ops.attention.backward``, every dtype). ``ck.attention`` runs a call that needs a gradient through the op with lse
    (``_attention_ops``), which saves it; the op without lse, called directly, recomputes the forward with
    it in the backward (one more forward pass); and a gradient reaching the lse output enters through D
    (d lse_i / d S_ij = P_ij, so dS_ij = P_ij (dP_ij - D_i + dlse_i)). No double backward: refused."""

    def setup_context(ctx, inputs, output):
        q, k, v, scale, causal, window, num_sinks = inputs
        ctx.scale, ctx.causal, ctx.window, ctx.num_sinks = scale, causal, window, num_sinks
        if returns_lse:
            ctx.save_for_backward(q, k, v, *output)
        else:
            ctx.save_for_backward(q, k, v, output)

    def backward(ctx, grad_out, grad_lse=None):
        if torch.is_grad_enabled():
            raise RuntimeError("ck.attention has no double backward: its backward runs kernels autograd cannot "
                               "differentiate; take the first derivative only (create_graph=False)")
        saved = ctx.saved_tensors
        q, k, v, out = saved[:4]
        lse = saved[4] if returns_lse else attention_lse_op(q, k, v, ctx.scale, ctx.causal, ctx.window,
                                                            ctx.num_sinks)[1]
        dq, dk, dv = attention_backward_op(q, k, v, out, lse, grad_out, grad_lse, ctx.scale, ctx.causal, ctx.window,
                                           ctx.num_sinks)
        return dq, dk, dv, None, None, None, None

    return backward, setup_context


for _custom_op, _returns_lse in ((attention_op, False), (attention_lse_op, True)):
    _backward, _setup = _attention_backward_for(_returns_lse)
    _register_autograd(_custom_op, _backward, _setup)


@_define_op("conv3d_kernel_grad")
def conv3d_kernel_grad_op(volume: torch.Tensor, grad: torch.Tensor, kernel_sides: list[int], pads: list[int]) -> torch.Tensor:
    """The kernel's gradient of a conv3d of ``volume`` (N, D, H, W) zero-padded by ``pads`` with a kernel of
    ``kernel_sides``, from the output's gradient ``grad`` (N, OD, OH, OW): conv3d.cu's kernel-gradient kernel
    for sides up to ``MAX_KERNEL_SIDE``, past them torch's convolution of the padded volume with the gradient
    as its weights (cuDNN, TF32 off). An op torch.compile traces in a backward graph, with a backward of
    its own (our convolutions), so a gradient penalty differentiates it."""
    from .ops.conv3d.grad import check_kernel_grad_args, kernel_grad
    from .ops.conv3d.reference import cudnn_fp32, padded

    check_kernel_grad_args(volume, grad, kernel_sides, pads)
    if max(kernel_sides) <= MAX_KERNEL_SIDE:
        return kernel_grad(volume, grad, tuple(kernel_sides), tuple(pads))
    if volume.shape[0] == 0:  # no volume: a zero gradient (torch's convolution has no channel to return)
        return volume.new_zeros(tuple(kernel_sides))
    with torch.no_grad(), cudnn_fp32():
        weights = grad[:, None].transpose(0, 1)  # (1, N, OD, OH, OW): the batch is the channels summed over
        return torch.nn.functional.conv3d(padded(volume, tuple(pads))[None], weights)[0, 0]


@_fake(conv3d_kernel_grad_op)
def _conv3d_kernel_grad_fake(volume, grad, kernel_sides, pads):
    from .ops.conv3d.grad import check_kernel_grad_args

    return volume.new_empty(check_kernel_grad_args(volume, grad, kernel_sides, pads))


def _input_gradient(grad: torch.Tensor, kernel: torch.Tensor, pads: tuple, rank: int) -> torch.Tensor:
    """The input's gradient of a rank-``rank`` convolution padded by ``pads`` (conv3d's six sizes) with
    ``kernel``, from the output's gradient ``grad``: our own convolution of the cropped and padded gradient
    with the flipped kernel, which has the input's shape and is differentiable again."""
    from .ops.conv3d.grad import input_grad_padding

    ksides = (1,) * (3 - rank) + tuple(kernel.shape)
    crops, padding = input_grad_padding(ksides, pads)
    for i, (before, after) in enumerate(crops[3 - rank:]):
        dim = grad.dim() - rank + i
        grad = grad.narrow(dim, before, grad.shape[dim] - before - after)
    flipped = kernel.flip(tuple(range(kernel.dim())))
    return {3: conv3d, 2: conv2d, 1: conv1d}[rank](grad, flipped, padding=padding[3 - rank:])


def _kernel_grad_setup(ctx, inputs, output):
    volume, grad, _, pads = inputs
    ctx.pads = tuple(pads)
    ctx.save_for_backward(volume, grad)


def _kernel_grad_backward(ctx, grad_of_kernel):
    """With ``dK[a] = sum_o padded(volume)[o + a] * grad[o]``, the gradient ``G`` of ``dK`` reaches the volume
    as the input's gradient of a convolution with kernel ``G`` and output gradient ``grad``, and reaches
    ``grad`` as the convolution of the volume with ``G``: two of our convolutions, differentiable again."""
    volume, grad = ctx.saved_tensors
    d_volume = d_grad = None
    if ctx.needs_input_grad[0]:
        d_volume = _input_gradient(grad, grad_of_kernel, ctx.pads, 3)
    if ctx.needs_input_grad[1]:
        pairs = tuple(zip(ctx.pads[0::2], ctx.pads[1::2]))
        d_grad = conv3d(volume, grad_of_kernel, padding=pairs)
    return d_volume, d_grad, None, None


_register_autograd(conv3d_kernel_grad_op, _kernel_grad_backward, _kernel_grad_setup)


def _conv_backward_for(rank: int):
    """The autograd registration of the rank-``rank`` convolution's custom op (3: conv3d, 2: conv2d, 1:
    conv1d): the input's gradient is ``_input_gradient`` (our convolution), the kernel's is the
    ``conv3d_kernel_grad`` op on conv3d's (N, D, H, W) views of the tensors; both differentiable again."""

    def setup_context(ctx, inputs, output):
        x, kernel, padding, padding_sizes = inputs
        ctx.pads = conv_pads(_padding(padding, padding_sizes), tuple(kernel.shape), rank)
        ctx.save_for_backward(x, kernel)

    def as_volume(t):  # (N, D, H, W) view of an input or output of this rank, batched or not
        for _ in range(3 - rank):
            t = t.unsqueeze(-rank - 1)
        return t if t.dim() == 4 else t.unsqueeze(0)

    def backward(ctx, grad):
        x, kernel = ctx.saved_tensors
        dx = dk = None
        if ctx.needs_input_grad[0]:
            dx = _input_gradient(grad, kernel, ctx.pads, rank)
        if ctx.needs_input_grad[1]:
            ksides = (1,) * (3 - rank) + tuple(kernel.shape)
            dk = conv3d_kernel_grad_op(as_volume(x), as_volume(grad), list(ksides), list(ctx.pads)).reshape(kernel.shape)
        return dx, dk, None, None

    return backward, setup_context


for _custom_op, _rank in ((conv3d_op, 3), (conv2d_op, 2), (conv1d_op, 1)):
    _backward, _setup = _conv_backward_for(_rank)
    _register_autograd(_custom_op, _backward, _setup)


# Whether torch.compile is tracing the caller: torch's function itself (no frame of ours on every eager call),
# under a name of this module that the CPU tests patch (patching torch.compiler's own function would leak into
# Dynamo's tables for later tests in the same process).
_is_compiling = torch.compiler.is_compiling


def _is_traced(args, kwargs) -> bool:
    """Whether a tracer other than torch.compile sees this call: an active dispatch mode (a fake mode, the
    proxy mode of make_fx and torch.export's tracers, or any mode a user pushed) or a FakeTensor argument. Such a call goes to the custom op, whose fake
    implementation gives a fake result and which the proxy records; the eager path would launch on fake
    memory, or run a kernel the trace never sees."""
    if torch._C._len_torch_dispatch_stack():  # any dispatch mode (fake, proxy, or a user's) sees the op
        return True
    if _jit_tracing_state() is not None:  # torch.jit.trace (and the TorchScript ONNX export) records it
        return True
    return any(checks.is_fake(v) for v in (*args, *kwargs.values()))


def _custom_op_route(args, kwargs) -> tuple[str, str]:
    """Why a call that is not ``_plain_eager_call`` goes through the custom op, and how to call the eager op
    instead (for the errors of what the schema cannot carry)."""
    if _is_compiling():
        return "inside torch.compile", "call it outside the compiled region"
    if _is_traced(args, kwargs):
        return ("under a tracer or dispatch mode (torch.export, make_fx, FakeTensorMode, torch.jit.trace, or a "
                "mode of your own)", "call it outside the trace")
    if _peek_interpreter_stack() is not None:
        return "under a torch.func transform (vmap, grad, jacrev, functionalize)", "call it outside the transform"
    if _forward_ad._current_level >= 0:
        return "under forward-mode AD (a dual level is open)", "call it outside the dual level"
    if any(isinstance(v, torch.Tensor) and type(v) not in (_TENSOR, _PARAMETER) for v in (*args, *kwargs.values())):
        return "on a tensor subclass", "pass plain tensors"
    return "with autograd (an input requires grad)", "call it under torch.no_grad() or on detached inputs"


def _plain_eager_call(args, kwargs) -> bool:
    """No dispatch mode, torch.func transform, forward-mode AD level or torch.jit trace is active, every
    tensor argument is a plain tensor (not fake, not a subclass), and none needs a gradient: the call is the
    op's own business
    (its checks, its plans, ``out``'s rules). One pass over the arguments, on every eager call. Under a
    torch.func transform (grad, vmap, functionalize) a tensor of type torch.Tensor may be the transform's
    wrapper, without storage of its own, and under forward-mode AD a dual tensor needs no gradient yet
    carries a tangent: such calls go through the custom op, whose dispatch unwraps them, after
    ``no_forward_ad`` has refused those that need a derivative the ops do not have. (Runs on every eager
    call: torch's functions are bound once, and keyword values are gathered only when there are any.)"""
    if (_dispatch_stack_len() or _peek_interpreter_stack() is not None or _forward_ad._current_level >= 0
            or _jit_tracing_state() is not None):
        return False
    grad = _is_grad_enabled()
    for v in (*args, *kwargs.values()) if kwargs else args:
        t = type(v)
        if t is _TENSOR or t is _PARAMETER:
            if grad and v.requires_grad:
                return False
        elif isinstance(v, torch.Tensor):
            return False
    return True


_dispatch_stack_len = torch._C._len_torch_dispatch_stack
# torch.jit.trace records torch ops it sees: the eager path's allocation, not its launch (a ctypes or TVM-FFI
# call), so a traced call goes through the custom op, which the trace records whole.
_jit_tracing_state = torch._C._get_tracing_state
_peek_interpreter_stack = torch._C._functorch.peek_interpreter_stack
_forward_ad = torch.autograd.forward_ad  # its _current_level is rebound as levels enter and exit: read per call
_is_grad_enabled = torch.is_grad_enabled
_TENSOR, _PARAMETER = checks.PLAIN_TENSOR_TYPES


# The eager ops' rules for the types of the scalars a schema converts: it takes True for a float or an int
# and a NumPy integer for an int, and refuses a string, a tensor or an int past float64 with an error of its
# own, so these run on the raw values before the call crosses the schema. Their values (float32 overflow,
# a finite scale) the fake implementation checks as eager does; those checks round through struct, which
# torch.compile cannot trace here. Symbolic values (SymInt, SymFloat) are the schema's own types.
_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _real_scalars(values, *names) -> None:
    for name in names:
        if values[name] is not None and not isinstance(values[name], _SYMBOLIC):
            checks.real_scalar(name, values[name])


def _gemm_scalars(values) -> None:
    _real_scalars(values, "alpha", "beta")


def _attention_scalars(values) -> None:
    _real_scalars(values, "scale")
    check_num_sinks(values["num_sinks"])


def _scan_scalars(values) -> None:
    x = values["x"]
    if isinstance(x, torch.Tensor):  # else the op's own error names x
        check_dim(values["dim"], x.dim())
        dtype = values.get("dtype")
        # An integer result carries no gradient: refused, as torch.cumsum refuses it, rather than detached.
        if (isinstance(dtype, torch.dtype) and not dtype.is_floating_point and x.requires_grad
                and torch.is_grad_enabled()):
            raise TypeError(f"dtype: {dtype} carries no gradient, and x requires grad; scan in a floating-point "
                            "dtype, or under torch.no_grad() / on x.detach()")


def _out_may_be_written(op_name: str, values) -> None:
    """The eager rules for writing ``out`` off the plain eager path (with autograd, traced, compiled): an
    inference tensor only inside inference mode (``check_writable``; not while torch.compile traces, which
    cannot trace the test: there torch's own copy_ refuses such an out), and no out= at all while grad mode
    is on and an argument (out too) requires grad, as torch's ops with out= refuse differentiable calls."""
    if not _is_compiling():
        check_writable("out", values["out"])
    # Inference mode records no graph even with grad mode on, and torch's ops take out= there (asked only
    # in eager code: Dynamo cannot trace the question).
    if (torch.is_grad_enabled() and (_is_compiling() or not torch.is_inference_mode_enabled())
            and any(isinstance(v, torch.Tensor) and v.requires_grad for v in values.values())):
        raise ValueError(f"out: {op_name} with out= does not support automatic differentiation (an input or out "
                         "requires grad), as torch's ops with out= do not; drop out=")


def _gemm_out_layout(name: str, out, *, shape, dtype, device) -> None:
    """The GEMMs' out= rule as eager has it (``gemm.problem``): row-major matrices, each of which may be a
    slice of wider rows, rather than a contiguous tensor."""
    checks.output_layout(name, out, shape=shape, dtype=dtype, device=device, contiguous=False)
    check_output_matrices(name, out, tuple(shape))


def compile_aware(eager, custom_op, op_args, scalars=None, out_layout=checks.output_layout):
    """``eager`` as the public function: itself when not compiling; under ``torch.compile`` the custom op
    on ``op_args`` (names taken from the call, or a function from the call's arguments by name to the
    custom op's), then ``out`` filled by a copy when one was given. Every custom op has a backward, so an
    eager call that needs a gradient runs the custom op (which autograd records); as torch does, such a
    call may not write ``out``, and a ``config=`` or ``variant=`` cannot cross the op's schema. ``scalars``:
    the eager op's checks of the scalars the schema would convert (bools and NumPy integers pass it),
    given the call's arguments by name. ``out_layout``: the eager op's rule for out's layout (contiguous,
    unless the op says otherwise)."""
    signature = inspect.signature(eager)
    op_name = f"ck.{eager.__name__}"
    # Flags cross the schema as bools, which refuses anything else with a RuntimeError of its own; checked
    # first, they get eager's TypeError naming the argument.
    flags = tuple(name for name, parameter in signature.parameters.items() if parameter.annotation in (bool, "bool"))

    @functools.wraps(eager)
    def public(*args, **kwargs):
        if not _is_compiling():
            if _plain_eager_call(args, kwargs):  # the common case: straight to the op (and its plans)
                return eager(*args, **kwargs)
            no_forward_ad(op_name, (*args, *kwargs.values()))
        bound = signature.bind(*args, **kwargs)  # only now: binding costs microseconds
        bound.apply_defaults()
        values = bound.arguments
        if values.get("out") is not None:
            _out_may_be_written(op_name, values)
        if values.get("config") is not None or values.get("variant") is not None:
            where, remedy = _custom_op_route(args, kwargs)
            named = "config" if values.get("config") is not None else "variant"
            raise TypeError(f"{eager.__name__}: {named}= is not supported {where} (the custom op runs the "
                            f"default {named}); {remedy} to pick one")
        for name in flags:
            checks.flag(name, values[name])
        if scalars is not None:
            scalars(values)
        result = custom_op(*(op_args(values) if callable(op_args) else (values[name] for name in op_args)))
        out = values.get("out")
        if out is None:
            return result
        if isinstance(result, tuple):  # an op with more results (attention with return_lse): out takes the first
            out_layout("out", out, shape=result[0].shape, dtype=result[0].dtype, device=result[0].device)
            out.copy_(result[0])
            return (out, *result[1:])
        # The eager op's rule for out's shape, dtype, device and layout, where a bare copy_ would broadcast a
        # wrong shape and cast a wrong dtype. No overlap check: the custom op's result is a fresh tensor, so
        # the copy is safe whatever out aliases (out=c in place included), and these comparisons are all
        # Dynamo can trace without breaking the graph.
        out_layout("out", out, shape=result.shape, dtype=result.dtype, device=result.device)
        out.copy_(result)
        return out

    public.custom_op = custom_op
    return public


sgemm = compile_aware(sgemm_eager, sgemm_op, ("a", "b", "c", "alpha", "beta"), _gemm_scalars, _gemm_out_layout)
hgemm = compile_aware(hgemm_eager, hgemm_op, ("a", "b", "c", "alpha", "beta"), _gemm_scalars, _gemm_out_layout)
for _custom_op, _public in ((sgemm_op, sgemm), (hgemm_op, hgemm)):
    _backward, _setup = _gemm_backward_for(_public)
    _register_autograd(_custom_op, _backward, _setup)
attention = compile_aware(attention_eager, _attention_ops,
                          lambda v: (v["q"], v["k"], v["v"], v["scale"], v["causal"], _window_arg(v["window"]),
                                     check_num_sinks(v["num_sinks"]), v["return_lse"]), _attention_scalars)
conv3d = compile_aware(conv3d_eager, conv3d_op, lambda v: (v["volume"], v["kernel"], *_padding_args(v["padding"], 3)))
conv2d = compile_aware(conv2d_eager, conv2d_op, lambda v: (v["image"], v["kernel"], *_padding_args(v["padding"], 2)))
conv1d = compile_aware(conv1d_eager, conv1d_op, lambda v: (v["signal"], v["kernel"], *_padding_args(v["padding"], 1)))
scan = compile_aware(scan_eager, scan_op,
                     lambda v: (v["x"], v["exclusive"], v["dim"], v["reverse"], v["op"],
                                dtype_from_out(v["x"], v["op"], v["dtype"], v.get("out")) or v["dtype"],
                                v["segment_starts"]),
                     _scan_scalars)


def _decay_args(a, x, dim, reverse, h0) -> tuple:
    """linear_scan_op's arguments: the decay as (tensor or None, number) with the number last; a 0-d CPU
    tensor on x's device (``cpu_scalar_beside``)."""
    if is_cpu_scalar(a) and isinstance(x, torch.Tensor):
        a = cpu_scalar_beside(a, x)
    a_tensor, a_number = split_decay(a)
    return a_tensor, x, dim, reverse, h0, a_number


linear_scan = compile_aware(linear_scan_eager, linear_scan_op,
                            lambda v: _decay_args(v["a"], v["x"], v["dim"], v["reverse"], v["h0"]), _scan_scalars)


def public_call(op: str, problem, inputs: dict):
    """A call with no arguments of the public op ``ck.<op>`` on a registry entry's inputs (``make_inputs``)
    with the problem's flags, allocating its result as model code calls it: what the report's wall per call
    times for us against the baseline's own call (the registry launch skips the op's checks and plan
    lookup)."""
    if op in ("sgemm", "hgemm"):
        call = op_call(sgemm if op == "sgemm" else hgemm)  # the zoo's call of the op, allocating its result
        return lambda: call(inputs, None)
    if op == "attention":
        q, k, v, scale = inputs["q"], inputs["k"], inputs["v"], inputs.get("scale")
        causal, window, sinks, lse = problem.causal, problem.window, problem.num_sinks, problem.lse
        return lambda: attention(q, k, v, scale=scale, causal=causal, window=window, num_sinks=sinks, return_lse=lse)
    if op == "conv3d":
        volume, kernel, p = inputs["volume"], inputs["kernel"], problem.pads
        padding = "valid" if not any(p) else ((p[0], p[1]), (p[2], p[3]), (p[4], p[5]))
        return lambda: conv3d(volume, kernel, padding=padding)
    if op == "scan":
        x, starts = inputs["x"], inputs.get("segment_starts")
        dim, exclusive, reverse, kind = (1 if problem.inner > 1 else -1), problem.exclusive, problem.reverse, problem.op
        return lambda: scan(x, dim=dim, exclusive=exclusive, reverse=reverse, op=kind, segment_starts=starts)
    if op == "linear_scan":
        a, x, h0, reverse = inputs["a"], inputs["x"], inputs.get("h0"), problem.reverse
        dim = 1 if problem.inner > 1 else -1  # the columns entry's (rows, length, inner) inputs scan dim 1
        return lambda: linear_scan(a, x, dim=dim, reverse=reverse, h0=h0)
    raise KeyError(f"public_call: no public call for op {op!r}")
