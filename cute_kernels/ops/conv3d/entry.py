"""The fields of conv3d's registry entries that are the op's, not a variant's: inputs, the float64
reference and its error scale, cuDNN's answer (the baseline), and the work and traffic."""

from __future__ import annotations

import torch

from .problem import Conv3dProblem
from .reference import conv3d_reference, conv3d_scale, eager_torch_conv3d, torch_conv3d

SOURCE = "conv3d.cu"


def make_inputs(problem: Conv3dProblem, device, generator=None) -> dict:
    shape = (problem.depth, problem.height, problem.width)
    volume = torch.randn((problem.batch, *shape) if problem.batched else shape, dtype=torch.float32, device=device,
                         generator=generator)
    kernel = torch.randn((problem.kd, problem.kh, problem.kw), dtype=torch.float32, device=device, generator=generator)
    return {"volume": volume, "kernel": kernel}


def reference(problem: Conv3dProblem, inputs: dict) -> torch.Tensor:
    return conv3d_reference(inputs["volume"], inputs["kernel"], problem.pads)


def baseline(problem: Conv3dProblem, inputs: dict) -> torch.Tensor:
    return torch_conv3d(inputs["volume"], inputs["kernel"], problem.pads, tuned=True)


def eager_baseline(problem: Conv3dProblem, inputs: dict):
    return eager_torch_conv3d(inputs["volume"], inputs["kernel"], problem.pads)


def flops(problem: Conv3dProblem) -> float:
    return 2.0 * problem.batch * problem.out_depth * problem.out_height * problem.out_width * problem.taps


def traffic(problem: Conv3dProblem) -> float:
    outs = problem.batch * problem.out_depth * problem.out_height * problem.out_width
    return 4.0 * (problem.batch * problem.depth * problem.height * problem.width + outs + problem.taps)  # (padding: no bytes)


def shared_spec_fields() -> dict:
    """What direct.py's and tiled.py's entries share."""
    return dict(op="conv3d", backend="nvrtc", dtypes=(torch.float32,), make_inputs=make_inputs, reference=reference,
                baseline=baseline, eager_baseline=eager_baseline, flops=flops, bytes=traffic, sources=(SOURCE,),
                baseline_name="torch conv3d, conv2d or conv1d by rank (cuDNN autotuned, TF32 off)", bound="fp32",
                error_scale=lambda p, inputs: conv3d_scale(inputs["volume"], inputs["kernel"], p.pads))
