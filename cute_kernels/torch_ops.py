"""The public ops as ``torch.library`` custom ops (``torch.ops.cute_kernels.*``), so that ``torch.compile``
traces them as single opaque nodes instead of breaking the graph at their Python and ctypes code.

Each custom op is functional (it returns a new tensor; ``out=`` is applied after it, as a copy) and has a
fake implementation that gives the output's shape and dtype from the inputs' metadata alone. The public
functions (``ck.sgemm`` and the rest, wrapped by ``compile_aware``) call their eager code directly when not
compiling, which keeps eager dispatch as fast as it was, and the custom op when ``torch.compile`` traces
them. A ``config=`` cannot cross the custom op's schema, so inside ``torch.compile`` the op's default (tuned
or heuristic) config runs and an explicit one is refused with a clear error.
"""

from __future__ import annotations

import functools
import inspect

import torch

from .ops.attention import attention as attention_eager
from .ops.conv3d import conv3d as conv3d_eager
from .ops.gemm.hgemm import hgemm as hgemm_eager
from .ops.gemm.sgemm import sgemm as sgemm_eager
from .ops.scan import scan as scan_eager
from .ops.scan.problem import DTYPES as SCAN_DTYPES

NAMESPACE = "cute_kernels"


def _gemm_fake(a, b, c, alpha, beta):
    return a.new_empty((a.shape[0], b.shape[1]))


@torch.library.custom_op(f"{NAMESPACE}::sgemm", mutates_args=())
def sgemm_op(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, alpha: float, beta: float) -> torch.Tensor:
    return sgemm_eager(a, b, c, alpha=alpha, beta=beta)


@torch.library.custom_op(f"{NAMESPACE}::hgemm", mutates_args=())
def hgemm_op(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, alpha: float, beta: float) -> torch.Tensor:
    return hgemm_eager(a, b, c, alpha=alpha, beta=beta)


@torch.library.custom_op(f"{NAMESPACE}::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None,
                 causal: bool) -> torch.Tensor:
    return attention_eager(q, k, v, scale=scale, causal=causal)


@torch.library.custom_op(f"{NAMESPACE}::conv3d", mutates_args=())
def conv3d_op(volume: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    return conv3d_eager(volume, kernel)


@torch.library.custom_op(f"{NAMESPACE}::scan", mutates_args=())
def scan_op(x: torch.Tensor, exclusive: bool) -> torch.Tensor:
    return scan_eager(x, exclusive=exclusive)


sgemm_op.register_fake(_gemm_fake)
hgemm_op.register_fake(_gemm_fake)


@attention_op.register_fake
def _attention_fake(q, k, v, scale, causal):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@conv3d_op.register_fake
def _conv3d_fake(volume, kernel):
    sides = [volume.shape[i - 3] - kernel.shape[i] + 1 for i in range(3)]
    return volume.new_empty((*volume.shape[:-3], *sides))


@scan_op.register_fake
def _scan_fake(x, exclusive):
    return x.new_empty(x.shape, dtype=SCAN_DTYPES[x.dtype][0] if x.dtype in SCAN_DTYPES else x.dtype)


def _is_compiling() -> bool:
    """Whether torch.compile is tracing the caller (a seam the CPU tests patch: patching torch.compiler's own
    function would leak into Dynamo's tables for later tests in the same process)."""
    return torch.compiler.is_compiling()


def compile_aware(eager, custom_op, op_args: tuple[str, ...]):
    """``eager`` as the public function: itself when not compiling; under ``torch.compile`` the custom op
    on ``op_args`` (taken by name from the call), then ``out`` filled by a copy when one was given."""
    signature = inspect.signature(eager)

    @functools.wraps(eager)
    def public(*args, **kwargs):
        if not _is_compiling():
            return eager(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        if values.get("config") is not None:
            raise TypeError(f"{eager.__name__}: config= is not supported inside torch.compile (the custom op "
                            "runs the default config); call it outside the compiled region to pick one")
        if values.get("variant") is not None:
            raise TypeError(f"{eager.__name__}: variant= is not supported inside torch.compile")
        result = custom_op(*(values[name] for name in op_args))
        out = values.get("out")
        if out is None:
            return result
        out.copy_(result)
        return out

    public.custom_op = custom_op
    return public


sgemm = compile_aware(sgemm_eager, sgemm_op, ("a", "b", "c", "alpha", "beta"))
hgemm = compile_aware(hgemm_eager, hgemm_op, ("a", "b", "c", "alpha", "beta"))
attention = compile_aware(attention_eager, attention_op, ("q", "k", "v", "scale", "causal"))
conv3d = compile_aware(conv3d_eager, conv3d_op, ("volume", "kernel"))
scan = compile_aware(scan_eager, scan_op, ("x", "exclusive"))
