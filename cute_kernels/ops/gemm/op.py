"""The body every public GEMM op shares: validate (or recognise a call validated before), allocate, handle
the calls that need no kernel, measure the problem, choose the variant and config, launch on the result's
device."""

from __future__ import annotations

import torch

from ...runtime import checks as _checks
from ...runtime.device import on_device
from .problem import (
    GemmProblem,
    check_out_overlaps,
    make_problem,
    trivial_result,
    unit_strides,
    validate_gemm_args,
)

__all__ = ["choose_variant", "run_gemm"]

# Calls already validated, by their structure (see runtime.checks.ValidatedCalls): the tensors, whether beta is 0
# in float32 (the kernel's value: it decides whether C is read), the config's type and the op's dtypes. A
# repeat skips the structural checks and the problem measurement (about half of the host time of a small
# GEMM call); the scalars and the overlap checks still run every call.
_VALIDATED = _checks.ValidatedCalls()


def _call_key(a, b, c, out, beta, config, dtypes):
    """(the call's key, beta in float32), or (None, None) for a bad beta: the full checks name it, in their
    order."""
    try:
        beta = _checks.float32_scalar("beta", beta)
    except (TypeError, ValueError):
        return None, None
    return _VALIDATED.key((a, b, c, out), beta == 0.0, type(config), dtypes), beta


def choose_variant(specs, problem: GemmProblem, config, device_index: int):
    """(spec, config) that runs ``problem``: with ``config`` given, the entry of ``specs`` whose config class
    it is (ValueError, naming the reason, if that entry does not support the problem); with None, the first
    entry whose chosen config (tuned or heuristic) it supports -- the last entry is the catch-all."""
    if config is None:
        from ... import tuned

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
    _checks.no_fake(a=a, b=b, c=c, out=out)  # before anything reads a pointer
    key, beta32 = _call_key(a, b, c, out, beta, config, dtypes)
    known = _VALIDATED.get(key)
    if known is None:
        config_classes = tuple(spec.config_cls for spec in specs)
        m, n, k, alpha, beta = validate_gemm_args(
            a, b, c, alpha=alpha, beta=beta, out=out, config=config, config_cls=config_classes, dtypes=dtypes
        )
        beta_zero = beta == 0.0
    else:  # a call of this structure passed every structural check before; see _VALIDATED
        m, n, k, beta_zero, problem = known
        alpha, beta = _checks.float32_scalar("alpha", alpha), beta32  # as the kernel takes them
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
    on_device(result.device.index, spec.launch, config, problem, inputs, out_run)
    return result
