"""The public ``conv3d`` op: checks its arguments, builds the problem, picks a variant and a config, and
launches on the volume's device."""

from __future__ import annotations

import torch

from ... import registry
from ...runtime import checks, device
from .config import Conv3dConfig
from .problem import check_conv3d_args, as_4d, make_problem

# Calls already validated, by structure (see checks.ValidatedCalls); out's overlaps are checked every call.
_VALIDATED = checks.ValidatedCalls()


def conv3d(volume: torch.Tensor, kernel: torch.Tensor, *, out: torch.Tensor | None = None,
           config: Conv3dConfig | None = None, variant: str | None = None) -> torch.Tensor:
    """Valid 3-D cross-correlation of ``volume`` (D, H, W) or (N, D, H, W) with ``kernel`` (KD, KH, KW).

    float32 in and out, FP32 arithmetic. Kernel sides 1..7, none longer than the volume's. The volume may
    be any strided view; one whose last dim is not unit-stride is copied to a contiguous tensor first.
    ``out``: a contiguous float32 tensor of the result's shape, not overlapping the inputs. Errors name the
    argument; nothing is written on an error.
    """
    checks.no_fake(volume=volume, kernel=kernel, out=out)  # before anything reads a pointer
    key = _VALIDATED.key((volume, kernel, out), config, variant)
    known = _VALIDATED.get(key)
    if known is None:
        batched, batch, ksides, out_shape = check_conv3d_args(volume, kernel, out, config, Conv3dConfig)
        spec = registry.for_call("conv3d", variant)
    else:  # this structure passed every check here before; out's overlaps depend on the values
        spec, out_shape, batch, batched, ksides, problem = known
        if out is not None:
            checks.no_overlap("out", out, {"volume": volume, "kernel": kernel})

    result = out if out is not None else torch.empty(out_shape, dtype=torch.float32, device=volume.device)
    if batch == 0:
        return result
    volume4 = as_4d(volume)
    if volume4.stride(-1) != 1 and volume4.shape[-1] > 1:
        volume4 = volume4.contiguous()
    kernel_c = kernel.contiguous()
    out4 = as_4d(result)
    if known is None:
        problem = make_problem(volume4, ksides, out4, batched)
        if config is not None:
            reason = spec.why_unsupported(config, problem)
            if reason is not None:
                raise ValueError(f"config: {config} cannot run {problem}: {reason}")
        _VALIDATED.remember(key, (spec, out_shape, batch, batched, ksides, problem))
    if config is None:
        try:
            config = spec.choose_config(problem, volume.device.index)
        except ValueError as e:  # no tile runs it (the default heuristic says why)
            raise ValueError(f"volume: shape {tuple(volume.shape)} with a {ksides} kernel: {e}") from None
    inputs = {"volume": volume4, "kernel": kernel_c}
    device.on_device(volume.device.index, spec.launch, config, problem, inputs, out4)
    return result
